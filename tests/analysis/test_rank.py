"""Effective ranks: planted ranks recovered, streaming = in-memory, agreement with a second path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from depthscope.analysis.rank import (
    add_ranks,
    collective_rank,
    effective_ranks,
    entropy_rank,
    numerical_rank,
    participation_ratio,
)
from depthscope.probes import capture
from depthscope.probes.accumulate import Accumulator
from depthscope.schemes import sources
from depthscope.trace import Layout, load_trace, save_trace
from tests.helpers import build, random_tokens, tiny

D = 24


def planted(ranks: list[int], tokens: int = 4096, seed: int = 0) -> torch.Tensor:
    """[tokens, source, d]: source j spans a random ranks[j]-dim subspace with equal variances."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in ranks:
        basis, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
        coeff = torch.randn(tokens, r, generator=g, dtype=torch.float64)
        out.append(coeff @ basis[:, :r].T + 3.0)  # an offset: the covariance must be centred
    return torch.stack(out, dim=1)


def layout(n: int) -> Layout:
    labels = ["embed"] + [f"{i}.mlp" for i in range(n - 1)]
    return Layout(["readout"], [n], ["readout"], [n], labels, list(range(n)), ["embed"] + ["mlp"] * (n - 1))


def spectrum_of(values: torch.Tensor, batch: int) -> xr.DataArray:
    acc = Accumulator(layout(values.shape[1]), covariance=True)
    for chunk in values.split(batch):
        acc.start_batch()
        for j in range(values.shape[1]):
            acc.source(j, chunk[:, j])
        acc.add_tokens(len(chunk))
    ds = acc.dataset({})
    return ds["source_spectrum"]


RANKS = [1, 3, 7, 24]


def test_numerical_rank_recovers_planted_rank():
    spec = spectrum_of(planted(RANKS), batch=512)
    np.testing.assert_array_equal(numerical_rank(spec).values, RANKS)
    # equal variances: entropy rank and participation ratio close to r (sampling noise only), never above
    for est in (entropy_rank(spec), participation_ratio(spec)):
        assert np.all(est.values <= np.array(RANKS) + 1e-9)
        np.testing.assert_allclose(est.values, RANKS, rtol=0.06)


def test_streaming_equals_in_memory_and_numpy():
    values = planted(RANKS, tokens=1000)
    one = spectrum_of(values, batch=1000)
    many = spectrum_of(values, batch=37)
    np.testing.assert_allclose(many.values, one.values, rtol=1e-9, atol=1e-9)
    ref = np.linalg.eigvalsh(np.cov(values[:, 2].numpy(), rowvar=False))[::-1]
    np.testing.assert_allclose(one.values[2], ref, rtol=1e-9, atol=1e-9)


def test_energy_threshold_counts_leading_eigenvalues():
    spec = xr.DataArray([[4.0, 3.0, 2.0, 1.0, 0.0]], dims=("source", "component"))
    assert numerical_rank(spec, energy=0.7).item() == 2  # 7/10
    assert numerical_rank(spec, energy=0.71).item() == 3
    assert numerical_rank(spec, energy=1.0).item() == 4
    zero = xr.DataArray([[0.0, 0.0]], dims=("source", "component"))
    assert (
        numerical_rank(zero).item() == 0
        and entropy_rank(zero).item() == 0
        and participation_ratio(zero).item() == 0
    )
    with pytest.raises(ValueError):
        numerical_rank(spec, energy=0.0)


def test_capture_spectrum_matches_cached_outputs():
    """Second path: covariance eigenvalues of hooked outputs from run_with_cache."""
    cfg = tiny()
    model = build(cfg)
    tokens = random_tokens(cfg, batch=4)
    trace = capture(model, tokens, batch_size=3, rank=True)
    _, cache = model.run_with_cache(tokens)
    for j, s in enumerate(sources(cfg)):
        x = cache[s.hook].flatten(0, 1).double().numpy()
        ref = np.linalg.eigvalsh(np.cov(x, rowvar=False))[::-1].clip(min=0)
        np.testing.assert_allclose(
            trace["source_spectrum"].values[j], ref, rtol=1e-4, atol=1e-5 * ref[0]
        )  # float32 capture


def test_the_half_spectrum_is_the_even_batches_own():
    """Convergence: ``source_spectrum_half`` is the covariance spectrum of the even batches alone
    (batch 0 and 2 of windows [0, 1], [2, 3], [4, 5]: windows 0, 1, 4, 5), from run_with_cache; a
    capture of one batch keeps none (no half to compare)."""
    from depthscope.analysis.rank import rank_summary

    cfg = tiny()
    model = build(cfg)
    tokens = random_tokens(cfg, batch=6)
    trace = capture(model, tokens, batch_size=2, rank=True, skip_positions=0, progress=False)
    half = trace["source_spectrum_half"]
    assert half.attrs["tokens"] == 4 * cfg.ctx
    _, cache = model.run_with_cache(tokens[[0, 1, 4, 5]])
    for j, s in enumerate(sources(cfg)):
        x = cache[s.hook].flatten(0, 1).double().numpy()
        ref = np.linalg.eigvalsh(np.cov(x, rowvar=False))[::-1].clip(min=0)
        np.testing.assert_allclose(half.values[j], ref, rtol=1e-4, atol=1e-5 * ref[0])
    res = rank_summary(trace)
    assert res["tokens_half"] == 4 * cfg.ctx and 0 < res["ratio_half"]
    one = capture(model, tokens[:2], batch_size=2, rank=True, progress=False)
    assert "source_spectrum_half" not in one and "ratio_half" not in rank_summary(one)


def test_collective_rank_sums_sublayers_and_round_trips(tmp_path):
    cfg = tiny()
    trace = add_ranks(capture(build(cfg), random_tokens(cfg, batch=4), rank=True))
    r = trace["effective_rank"]
    expected = r.where(trace["source_kind"] != "embed").sum("source")
    xr.testing.assert_allclose(trace["collective_rank"], expected)
    np.testing.assert_allclose(trace["collective_rank_ratio"], expected / cfg.d_model)
    assert set(r["rank_kind"].values) == {"numerical", "entropy", "participation"}
    save_trace(trace, tmp_path / "t.nc")
    xr.testing.assert_identical(load_trace(tmp_path / "t.nc"), trace)
    with pytest.raises(ValueError, match="rank=True"):
        collective_rank(capture(build(cfg), random_tokens(cfg, batch=1)))
    assert effective_ranks(trace["source_spectrum"]).sizes["rank_kind"] == 3


def test_rank_profile_gives_each_model_of_a_stack_its_own_width():
    from depthscope.analysis.rank import rank_profile
    from depthscope.trace import stack_traces

    narrow, wide = tiny(d_model=16), tiny(d_model=32)
    traces = [capture(build(c), random_tokens(c, batch=2), rank=True) for c in (narrow, wide)]
    traces[1].attrs["label"] = "wide"
    profile = rank_profile(stack_traces(traces))
    np.testing.assert_array_equal(profile["d_model"].values, [16, 32])
    for label, t in zip(profile["model"].values, traces):
        expected = effective_ranks(t["source_spectrum"])  # each at its own width, without padding
        np.testing.assert_allclose(
            profile["effective_rank"].sel(model=label).transpose(*expected.dims).values, expected.values
        )
    one = rank_profile(traces[0])
    assert int(one["d_model"]) == 16 and one.attrs["label"] == traces[0].attrs["label"]
    with pytest.raises(ValueError, match="rank=True"):
        rank_profile(capture(build(narrow), random_tokens(narrow, batch=1)))
