"""The engine equals a dense float64 oracle (tests/oracle.py) to 1e-10 on a random float64 model of
every scheme and family: every weight kind (unit, static, per token, per feature, post-LN carried
terms, unrolled streams), shares, norms, weights and their spreads over several batches, spectra,
native quantities, merged shards and resumed partial states."""

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

pytestmark = pytest.mark.golden  # run again under ATEN_CPU_CAPABILITY=default by make test

FOREIGN = [f for f in FAMILIES if not f[0].startswith("depthscope") and f[1]()]


@pytest.mark.parametrize("label, scheme, options", variants(), ids=[v[0] for v in variants()])
def test_every_scheme_equals_the_oracle(label, scheme, options):
    cfg = tiny(scheme, options)
    model = perturb(build(cfg, dtype=torch.float64), others=0.05)
    tokens = random_tokens(cfg, batch=4, pos=16)
    trace = capture(model, tokens, batch_size=2, rank=True, progress=False)
    assert_agrees(trace, oracle(model, resolve(model), tokens), what=label)


@pytest.mark.parametrize("family", FOREIGN, ids=[f[0] for f in FOREIGN])
def test_every_family_equals_the_oracle(family):
    name, _, _, make = family
    model, _ = make(sizes())
    if hasattr(getattr(model, "config", None), "_experts_implementation"):
        model.config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
    model = model.double().eval()
    ad = resolve(model)
    tokens = torch.randint(2, ad.vocab, (4, min(16, ad.ctx)), generator=torch.Generator().manual_seed(1))
    trace = capture(model, tokens, batch_size=2, rank=True, progress=False)
    assert_agrees(trace, oracle(model, ad, tokens), what=name)


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


@pytest.mark.parametrize("variant", ["grn-v3", "dca"])
def test_whole_per_feature_weights_equal_the_oracle(variant):
    """The per-feature fold's other path, weights handed whole [T, n, d] (as a foreign family's
    per-feature weights arrive), equals the oracle too."""
    from depthscope.probes.adapters import schemes as own

    _, scheme, options = next(v for v in variants() if v[0] == variant)
    cfg = tiny(scheme, options)
    model = perturb(build(cfg, dtype=torch.float64), others=0.05)
    ad = own.build(model, split_grn=False)
    assert any(c.weights for c in ad.consumers)
    assert all(c.weights is None or not c.weights.endswith(SUFFIX) for c in ad.consumers)
    tokens = random_tokens(cfg, batch=4, pos=16)
    trace = capture(model, tokens, batch_size=2, rank=True, progress=False, adapter=ad)
    assert_agrees(trace, oracle(model, ad, tokens), what=variant)


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
