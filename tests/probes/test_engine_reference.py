"""The batched engine equals the engine it replaced (tests/reference_engine) to 1e-10 in float64, on
a random model of every family and scheme: shares, norms, weights, spreads, spectra, logit
attribution and lens, ablations, merged shards and resumed partial states."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthscope.probes import capture
from depthscope.probes.adapters import resolve
from depthscope.probes.capture import Run
from depthscope.probes.settings import CaptureSettings
from depthscope.schemes.base import variants
from tests.families import FAMILIES, sizes
from tests.helpers import build, perturb, random_tokens, tiny
from tests.reference_engine import reference_capture

pytestmark = pytest.mark.golden  # run again under ATEN_CPU_CAPABILITY=default by make test

RTOL = 1e-10
FOREIGN = [f for f in FAMILIES if not f[0].startswith("depthscope") and f[1]()]


def assert_equal_traces(new, ref, what: str) -> None:
    assert set(new.data_vars) == set(ref.data_vars), what
    for name in ref.data_vars:
        a, b = new[name].values, ref[name].values
        assert np.array_equal(np.isnan(a), np.isnan(b)), f"{what}: {name} NaN cells differ"
        scale = np.nanmax(np.abs(b)) if np.isfinite(b).any() else 0.0
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * scale + 1e-14, err_msg=f"{what}: {name}")
    skip = {"depthscope_version"}
    assert set(new.attrs) - skip == set(ref.attrs) - skip, what
    for key in set(ref.attrs) - skip:
        a, b = new.attrs[key], ref.attrs[key]
        if isinstance(b, float):  # a loss: float64 sums in another order
            assert a == pytest.approx(b, rel=RTOL), f"{what}: {key}"
        else:
            assert a == b, f"{what}: {key}"


def both(model, tokens, **options):
    lens = bool(options.get("logits") or options.get("ablate"))
    new = capture(model, tokens, **options, lens=lens)
    ref = reference_capture(model, tokens, **options)
    return new, ref


@pytest.mark.parametrize("label, scheme, options", variants(), ids=[v[0] for v in variants()])
def test_every_scheme_equals_the_reference(label, scheme, options):
    cfg = tiny(scheme, options)
    model = perturb(build(cfg, dtype=torch.float64), others=0.05)
    tokens = random_tokens(cfg, batch=4, pos=16)
    new, ref = both(model, tokens, batch_size=2, rank=True, logits=True)
    assert_equal_traces(new, ref, label)


@pytest.mark.parametrize("family", FOREIGN, ids=[f[0] for f in FOREIGN])
def test_every_family_equals_the_reference(family):
    name, _, _, make = family
    model, _ = make(sizes())
    if hasattr(getattr(model, "config", None), "_experts_implementation"):
        model.config._experts_implementation = "eager"  # grouped_mm has no float64 kernel
    model = model.double().eval()
    ad = resolve(model)
    tokens = torch.randint(2, ad.vocab, (4, min(16, ad.ctx)), generator=torch.Generator().manual_seed(1))
    new, ref = both(model, tokens, batch_size=2, rank=True, logits=ad.head is not None)
    assert_equal_traces(new, ref, name)


@pytest.mark.parametrize("mode", ["sources", "cells"])
def test_ablations_equal_the_reference(mode):
    cfg = tiny("attnres", n_layers=2)
    model = perturb(build(cfg, dtype=torch.float64), others=0.05)
    tokens = random_tokens(cfg, batch=2, pos=12)
    new, ref = both(model, tokens, batch_size=2, ablate=mode, ablate_mean=mode == "cells")
    assert_equal_traces(new, ref, mode)


def test_merged_shards_and_resumed_partials_equal_the_reference(tmp_path):
    cfg = tiny("hc")
    model = perturb(build(cfg, dtype=torch.float64), others=0.05)
    tokens = random_tokens(cfg, batch=6, pos=16)
    ref = reference_capture(model, tokens, batch_size=2, rank=True, logits=True)
    ad = resolve(model)
    settings = CaptureSettings(rank=True, logits=True, lens=True)
    shards = [Run(ad, settings, 0, 16) for _ in range(2)]
    with torch.no_grad():
        for b, chunk in enumerate(tokens.split(2)):
            shards[b % 2].batch(model, chunk, b)
    merged = Run(ad, settings, 0, 16)
    for shard in shards:
        merged.merge(shard.state())
    attrs = {
        k: v for k, v in ref.attrs.items() if k not in ("trace_format", "tokens", "loss", "logit_tokens")
    }
    assert_equal_traces(merged.dataset(attrs), ref, "two shards merged")
    partial = tmp_path / "p.partial"
    capture(model, tokens, batch_size=2, rank=True, logits=True, lens=True, partial=partial, save_every=1)
    with pytest.raises(RuntimeError):  # stopped after the second batch: the partial has two of three
        stop_after(
            model,
            2,
            lambda: capture(
                model, tokens, batch_size=2, rank=True, logits=True, lens=True, partial=partial, save_every=1
            ),
        )
    resumed = capture(
        model, tokens, batch_size=2, rank=True, logits=True, lens=True, partial=partial, resume=True
    )
    assert_equal_traces(resumed, ref, "resumed")


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
