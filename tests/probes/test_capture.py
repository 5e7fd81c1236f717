"""Capture: exact decomposition for every scheme, streaming = in-memory, round trip, identities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from depthscope.errors import CorpusError, TraceError
from depthscope.probes import capture
from depthscope.probes.adapters import resolve
from depthscope.schemes.base import variants
from depthscope.trace import load_trace, save_trace
from tests.helpers import build, perturb, random_tokens, tiny

VARIANTS = variants()


def perturbed(cfg, seed=0):
    """A model whose mixers are moved away from initialisation (weights not trivially uniform)."""
    return perturb(build(cfg, seed=seed), 0.3, seed + 1, others=0.02)


@pytest.fixture(scope="module")
def tokens():
    return random_tokens(tiny(), batch=6, seed=5)


@pytest.mark.parametrize("label, scheme, options", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_shares_sum_to_one_and_inputs_rebuild(tokens, label, scheme, options):
    cfg = tiny(scheme, options)
    trace = capture(perturbed(cfg), tokens, batch_size=4)
    sums = trace["contribution_share"].sum("source")
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)
    np.testing.assert_allclose(trace["norm_share"].sum("source"), 1.0, atol=1e-6)
    assert float(trace["residual_error"].max()) < 1e-4
    # NaN exactly on unavailable cells
    assert np.array_equal(trace["mixing"].notnull().values, resolve(build(cfg)).layout().available)
    assert trace.attrs["tokens"] == tokens.numel() and trace.attrs["trace_format"] == 2


def test_standard_mixing_is_exactly_one(tokens):
    trace = capture(perturbed(tiny()), tokens)
    avail = resolve(build(tiny())).layout().available
    assert np.all(trace["mixing"].values[avail] == 1.0)
    assert np.all(np.isnan(trace["mixing"].values[~avail]))
    assert np.all(trace["mixing_std"].values[avail] == 0.0)


def test_attnres_full_rows_sum_to_one(tokens):
    trace = capture(perturbed(tiny("attnres")), tokens)
    np.testing.assert_allclose(trace["mixing"].sum("source"), 1.0, atol=1e-6)
    assert float(trace["mixing_std"].max()) > 1e-3  # input-dependent: varies over tokens


def test_attnres_block_rows_are_constant_within_a_block(tokens):
    cfg = tiny("attnres", {"blocks": 2})  # 6 sublayers in blocks {0,1,2}, {3,4,5}
    trace = capture(perturbed(cfg), tokens)
    m = trace["mixing"]
    first, second = ["0.attn", "0.mlp", "1.attn"], ["1.mlp", "2.attn", "2.mlp"]
    for row in ["1.mlp", "2.attn", "2.mlp", "readout"]:  # consumers that see block 0 completed
        vals = m.sel(layer=row, source=first).values
        np.testing.assert_allclose(vals, vals[0], rtol=1e-6)
    # the read-out sees embedding + 2 block sums: one weight per entry, and those sum to 1
    r = m.sel(layer="readout")
    np.testing.assert_allclose(
        r.sel(source="embed") + r.sel(source="0.attn") + r.sel(source="1.mlp"), 1.0, atol=1e-6
    )
    np.testing.assert_allclose(r.sel(source=second).values, r.sel(source="1.mlp").item(), rtol=1e-6)


@pytest.mark.parametrize(
    "label, scheme, options",
    [v for v in VARIANTS if v[0] in ("standard", "attnres", "dca", "hc", "mhc")] or VARIANTS[:1],
    ids=lambda v: str(v),
)
def test_streaming_equals_in_memory(tokens, label, scheme, options):
    model = perturbed(tiny(scheme, options))
    one = capture(model, tokens, batch_size=len(tokens))
    for bs in (1, 4):
        many = capture(model, tokens, batch_size=bs)
        xr.testing.assert_allclose(one, many, rtol=1e-5, atol=1e-6)
        assert one.attrs == many.attrs


def test_saved_trace_reopens_identical(tmp_path, tokens):
    trace = capture(perturbed(tiny("attnres")), tokens)
    path = save_trace(trace, tmp_path / "t.nc")
    xr.testing.assert_identical(load_trace(path), trace)
    assert not list(tmp_path.glob(".t.nc*"))


def test_corpus_windows_are_seeded(tmp_path):
    model = build(tiny())
    a = capture(model, None, n_tokens=256, seed=1)
    b = capture(model, None, n_tokens=256, seed=1)
    c = capture(model, None, n_tokens=256, seed=2)
    xr.testing.assert_identical(a, b)
    assert not np.allclose(a["contribution_share"], c["contribution_share"], equal_nan=True)
    assert a.attrs["tokens"] == 256 and "python-stdlib" in a.attrs["corpus"]


def test_too_few_tokens_is_refused():
    with pytest.raises(CorpusError, match="fewer than one context window"):
        capture(build(tiny()), None, n_tokens=10)
    with pytest.raises(CorpusError, match="fewer than one context window"):
        capture(build(tiny()), torch.arange(10))


def test_bad_trace_files(tmp_path, tokens):
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "missing.nc")
    (tmp_path / "junk.nc").write_bytes(b"not a netcdf file at all")
    with pytest.raises(TraceError, match="not a readable netCDF trace"):
        load_trace(tmp_path / "junk.nc")
    trace = capture(build(tiny()), tokens)
    trace.attrs["trace_format"] = 3
    save_trace(trace, tmp_path / "v3.nc")
    with pytest.raises(TraceError, match="trace format 3"):
        load_trace(tmp_path / "v3.nc")
    xr.Dataset({"a": ("x", [1.0])}).to_netcdf(tmp_path / "other.nc")
    with pytest.raises(TraceError, match="not a depthscope trace"):
        load_trace(tmp_path / "other.nc")


def test_hooks_never_leak(tokens):
    model = build(tiny("attnres"))
    capture(model, tokens)
    assert all(not h._forward_hooks for h in model.hook_dict.values())
    with pytest.raises(CorpusError):
        capture(model, torch.arange(3))
    assert all(not h._forward_hooks for h in model.hook_dict.values())
