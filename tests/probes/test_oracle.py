"""The engine equals a dense float64 oracle (tests/oracle.py) to 1e-10 on a random float64 model of
every scheme and family: every weight kind (unit, static, per token, per feature, post-LN carried
terms, unrolled streams), shares, norms, weights and their spreads over several batches, spectra,
native quantities, merged shards and resumed partial states.

That oracle listens on the adapter's own taps and compares by position, so it proves the
arithmetic, not which module each label is. Every foreign family is also checked by label against
tests/probes/layouts.py: its sources and consumer inputs written out there as module paths, read
with plain torch hooks, each consumer's input checked to be its sources' combination, and every
cell compared through ``trace.sel(layer=..., source=...)``. A family whose package is missing
fails: ``make test`` installs every one of them."""

from __future__ import annotations

import pytest
import torch

from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.adapters import resolve
from depthscope.probes.adapters.grn import SUFFIX
from depthscope.probes.capture import Run
from depthscope.probes.settings import CaptureSettings
from depthscope.schemes.base import variants
from tests.families import FAMILIES, sizes
from tests.helpers import build, perturb, random_tokens, tiny
from tests.oracle import assert_agrees, oracle
from tests.probes.layouts import LAYOUTS, assert_by_label, expected, rows_of, tolerance, wake

pytestmark = pytest.mark.golden  # run again under ATEN_CPU_CAPABILITY=default by make test

# every foreign family, installed or not: a missing package fails its cases (family_model)
FOREIGN = [f for f in FAMILIES if not f[0].startswith("depthscope")]


@pytest.mark.parametrize("label, scheme, options", variants(), ids=[v[0] for v in variants()])
def test_every_scheme_equals_the_oracle(label, scheme, options):
    cfg = tiny(scheme, options)
    model = perturb(build(cfg, dtype=torch.float64), others=0.05)
    tokens = random_tokens(cfg, batch=4, pos=16)
    trace = capture(model, tokens, batch_size=2, rank=True, progress=False)
    assert_agrees(trace, oracle(model, resolve(model), tokens), what=label)


def family_model(family):
    """The family's small model in float64, eval mode; a failure if its package is not installed."""
    name, installed, package, make = family
    if not installed():
        pytest.fail(
            f"{name}: the package {package} is not installed (`make test` installs .[dev,thirdparty,bench])"
        )
    model, _ = make(sizes())
    if hasattr(getattr(model, "config", None), "_experts_implementation"):
        model.config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
    return model.double().eval()


def family_tokens(ad):
    return torch.randint(2, ad.vocab, (4, min(16, ad.ctx)), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", FOREIGN, ids=[f[0] for f in FOREIGN])
def test_every_family_equals_the_oracle(family):
    model = family_model(family)
    ad = resolve(model)
    tokens = family_tokens(ad)
    trace = capture(model, tokens, batch_size=2, rank=True, progress=False)
    assert_agrees(trace, oracle(model, ad, tokens), what=family[0])


@pytest.mark.parametrize("family", FOREIGN, ids=[f[0] for f in FOREIGN])
def test_every_family_equals_the_oracle_by_label(family):
    """Per (consumer, source) label, from plain hooks on the modules the layout names, apart from the
    adapter: the contribution share sum_t <c[l, s], h_l> / sum_t |h_l|^2, the norm share and the
    token-mean weight of every cell, each consumer's input RMS and first-position share and each
    source's RMS, equal the captured trace's cell of that label (float64: 1e-9 of each statistic's
    largest magnitude; 1e-6 for the families that round their mixing in float32); every input is
    its sources' combination (unit weights: their plain sum); a source written after a consumer
    leaves its cell NaN; and the labels are the layout's, in its order. The zero-initialised
    parameters are woken first (``wake``) so that no label is a source that is zero everywhere."""
    name = family[0]
    assert name in LAYOUTS, f"{name}: no layout in tests/probes/layouts.py"
    model = wake(family_model(family))
    ad = resolve(model)
    tokens = family_tokens(ad)
    trace = capture(model, tokens, batch_size=2, rank=True, progress=False)
    rows, values, order = rows_of(model, tokens, name)
    for dim, labels in (("layer", list(rows)), ("source", order)):
        assert set(trace[dim].values) == set(labels), f"{name}: {dim} {list(trace[dim].values)}, not {labels}"
    skip = trace.attrs["skip_positions"]
    assert_by_label(trace, rows, expected(rows, values, skip), tolerance(name)[1], what=name)
    assert list(trace["layer"].values) == list(rows) and list(trace["source"].values) == order, name


@pytest.mark.parametrize("variant", ["grn-v2", "grn-v3", "dca", "dca-k2"])
def test_split_weights_are_the_mixers_weights(variant):
    """Every per-feature consumer's two-part weights (static b + per-token gate, the engine's fast
    path, on by default) are, formed whole, exactly the weights its mixer reports through
    ``hook_weights``."""
    _, scheme, options = next(v for v in variants() if v[0] == variant)
    cfg = tiny(scheme, options)
    model = perturb(build(cfg, dtype=torch.float64), others=0.05)
    ad = resolve(model)
    split, whole, taps = {}, {}, []
    for c in ad.consumers:
        assert c.weights is None or c.weights.endswith(SUFFIX), c.label
        if c.weights is not None:
            taps.append((c.weights, lambda t, k=c.label: split.__setitem__(k, t.full())))
            taps.append((c.weights.removesuffix(SUFFIX), lambda t, k=c.label: whole.__setitem__(k, t)))
    with torch.no_grad(), ad.attach(model, taps):
        model(random_tokens(cfg, batch=2, pos=8))
    assert len(whole) == len(ad.consumers) and split.keys() == whole.keys()
    for label, w in whole.items():
        assert torch.equal(split[label], w), label


@pytest.mark.parametrize("skip", [0, 3])
@pytest.mark.parametrize("variant", ["grn-v3", "dca"])
def test_whole_per_feature_weights_equal_the_oracle(variant, skip):
    """The per-feature fold's other path, weights handed whole [T, n, d] (as a foreign family's
    per-feature weights arrive), equals the oracle too; with positions skipped, chunk by chunk inside
    each window of the uncut weights (``probes.terms.Windows``)."""
    from depthscope.probes.adapters import schemes as own

    _, scheme, options = next(v for v in variants() if v[0] == variant)
    cfg = tiny(scheme, options)
    model = perturb(build(cfg, dtype=torch.float64), others=0.05)
    ad = own.build(model, split_grn=False)
    assert any(c.weights for c in ad.consumers)
    assert all(c.weights is None or not c.weights.endswith(SUFFIX) for c in ad.consumers)
    tokens = random_tokens(cfg, batch=4, pos=16)
    trace = capture(model, tokens, batch_size=2, rank=True, progress=False, adapter=ad, skip_positions=skip)
    assert_agrees(trace, oracle(model, ad, tokens, skip=skip), what=variant)


def test_merged_shards_and_resumed_partials_equal_the_oracle(tmp_path):
    cfg = tiny("hc")
    model = perturb(build(cfg, dtype=torch.float64), others=0.05)
    tokens = random_tokens(cfg, batch=6, pos=16)
    ad = resolve(model)
    expect = oracle(model, ad, tokens)
    settings = CaptureSettings(rank=True)
    shards = [Run(ad, settings, 0, 16) for _ in range(2)]
    with torch.no_grad():
        for b, chunk in enumerate(tokens.split(2)):
            shards[b % 2].batch(model, chunk, b)
    merged = Run(ad, settings, 0, 16)
    for shard in shards:
        merged.merge(shard.state())
    assert_agrees(merged.dataset({}), expect, what="two shards merged")
    partial = tmp_path / "p.partial"
    options = {"batch_size": 2, "rank": True, "partial": partial, "progress": False}
    capture(model, tokens, **options, save_every=1)
    # stopped after the second batch (the model's own failure, in one line): the partial has two of three
    with pytest.raises(DepthscopeError, match=r"forward failed on batch 2 .*RuntimeError: stopped"):
        stop_after(model, 2, lambda: capture(model, tokens, **options, save_every=1))
    assert_agrees(capture(model, tokens, **options, resume=True), expect, what="resumed")


def stop_after(model, n: int, run):
    """Run ``run`` with the model's forward failing from its (n + 1)-th call on."""
    calls = {"n": 0}

    def hook(module, args):
        calls["n"] += 1
        if calls["n"] > n:
            raise RuntimeError("stopped")

    handle = model.register_forward_pre_hook(hook)
    try:
        run()
    finally:
        handle.remove()
