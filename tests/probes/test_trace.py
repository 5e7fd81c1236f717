"""Trace stacking and the accumulator on planted data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from depthscope.probes import capture
from depthscope.probes.accumulate import Accumulator
from depthscope.trace import Layout, select_model, stack_traces
from tests.helpers import build, random_tokens, tiny


def test_stack_and_select_round_trip():
    tokens = random_tokens(tiny(), batch=2)
    small = capture(build(tiny(n_layers=2)), tokens)
    big = capture(build(tiny("attnres")), tokens)
    stacked = stack_traces([small, big, small])
    assert list(stacked["model"].values) == ["standard", "attnres", "standard#2"]
    assert list(stacked["scheme"].values) == ["standard", "attnres", "standard"]  # attrs became coordinates
    assert stacked["tokens"].dtype == np.int64 and stacked.attrs == {
        "trace_format": 2,
        "depthscope_version": small.attrs["depthscope_version"],
    }
    assert stacked.sizes["layer"] == big.sizes["layer"] and stacked.sizes["source"] == big.sizes["source"]
    assert list(stacked["layer"].values) == list(big["layer"].values)  # depth order, not alphabetical
    back = select_model(stacked, "standard")
    xr.testing.assert_allclose(back.drop_attrs(), small.drop_attrs())
    assert back.attrs["scheme"] == "standard" and back.attrs["tokens"] == small.attrs["tokens"]
    assert np.isnan(stacked["mixing"].sel(model="standard", layer="2.attn")).all()
    assert back.attrs == small.attrs  # every attr comes back


def planted(acc: Accumulator, w=None, static: bool = False) -> xr.Dataset:
    """One batch of two tokens, two orthogonal sources: v0 along e0, v1 = 2 e1 (float64)."""
    v = torch.zeros(2, 2, 3, dtype=torch.float64)  # [source, token, d]
    v[0, :, 0] = 1.0
    v[1, :, 1] = 2.0
    acc.start_batch()
    acc.source(0, v[0])
    acc.source(1, v[1])
    if w is None:
        h = v.sum(0)
    elif static:
        h = (w[:, None, None] * v).sum(0)
    else:
        ww = w if w.ndim == 3 else w[..., None]
        h = (ww * v.transpose(0, 1)).sum(1)
    acc.consumer(0, h, w)
    err, finite, folded = acc.end_batch()
    assert finite and folded == {0} and err[0] == 0.0
    acc.add_tokens(2)
    return acc.dataset({})


LAYOUT = Layout(["a"], [2], ["attn"], [2], ["embed", "0.attn"], [0, 1], ["embed", "attn"])


def test_accumulator_on_planted_weights():
    """Two sources with planted per-token weights: mixing mean/std and shares by hand."""
    w = torch.tensor([[1.0, 3.0], [3.0, 1.0]], dtype=torch.float64)  # two tokens
    ds = planted(Accumulator(LAYOUT), w)
    np.testing.assert_allclose(ds["mixing"].values[0], [2.0, 2.0])
    np.testing.assert_allclose(ds["mixing_std"].values[0], [1.0, 1.0])
    np.testing.assert_allclose(ds["mixing_abs"].values[0], [2.0, 2.0])
    # |c|^2 per token: token 1: (1, 36); token 2: (9, 4); orthogonal sources
    np.testing.assert_allclose(ds["contribution_share"].values[0], [10 / 50, 40 / 50])
    np.testing.assert_allclose(ds["norm_share"].values[0], [4 / 12, 8 / 12])
    np.testing.assert_allclose(ds["source_rms"].values, [np.sqrt(2 / 6), np.sqrt(8 / 6)])
    assert ds["residual_error"].item() == 0.0
    # per-feature weights equal to the scalar ones give the same statistics
    ds2 = planted(Accumulator(LAYOUT), w[..., None].expand(-1, -1, 3))
    for name in ("mixing", "mixing_abs", "mixing_std", "contribution_share", "norm_share"):
        np.testing.assert_allclose(ds2[name].values, ds[name].values)
    # signed per-feature weights: the mean cancels, the magnitude does not
    signs = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    ds3 = planted(Accumulator(LAYOUT), w[..., None] * signs)
    np.testing.assert_allclose(ds3["mixing"].values[0], [2.0 / 3, 2.0 / 3])
    np.testing.assert_allclose(ds3["mixing_abs"].values[0], [2.0, 2.0])


def test_accumulator_on_unit_and_static_weights():
    """The Gram path: unit weights share |v_s|^2 / sum; static weights w_s^2 |v_s|^2 / sum."""
    ds = planted(Accumulator(LAYOUT))
    np.testing.assert_allclose(ds["contribution_share"].values[0], [1 / 5, 4 / 5])
    np.testing.assert_allclose(ds["norm_share"].values[0], [1 / 3, 2 / 3])
    np.testing.assert_allclose(ds["mixing"].values[0], [1.0, 1.0])
    np.testing.assert_allclose(ds["mixing_std"].values[0], [0.0, 0.0])
    w = torch.tensor([3.0, -0.5], dtype=torch.float64)
    ds = planted(Accumulator(LAYOUT), w, static=True)
    np.testing.assert_allclose(ds["contribution_share"].values[0], [9 / 10, 1 / 10])
    np.testing.assert_allclose(ds["norm_share"].values[0], [3 / 4, 1 / 4])
    np.testing.assert_allclose(ds["mixing"].values[0], [3.0, -0.5])
    np.testing.assert_allclose(ds["mixing_abs"].values[0], [3.0, 0.5])


def test_a_wrong_input_and_a_nan_fail_the_batch_check():
    acc = Accumulator(LAYOUT)
    v = torch.ones(2, 4, 3, dtype=torch.float64)
    acc.start_batch()
    acc.source(0, v[0])
    acc.source(1, v[1])
    acc.consumer(0, 1.01 * v.sum(0))  # 1% off the sum of its sources
    err, finite, _ = acc.end_batch()
    assert err[0] == np.float64(0.01 / 1.01) or abs(err[0] - 0.01 / 1.01) < 1e-12
    acc.start_batch()
    acc.source(0, v[0])
    acc.source(1, v[1] * float("nan"))
    acc.consumer(0, v.sum(0))
    err, finite, _ = acc.end_batch()
    assert not finite and not err[0] <= 1e-4  # NaN fails, never passes


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", ["sums", "moments"])
def test_a_non_finite_statistic_anywhere_fails_the_batch(bad, where):
    """The batch's finiteness check covers every sum, not only the rebuild error: one NaN or
    infinity planted in a statistic the rebuild never reads fails it; a clean batch passes."""
    for plant in (False, True):
        acc = Accumulator(LAYOUT)
        v = torch.ones(2, 4, 3, dtype=torch.float64)
        acc.start_batch()
        acc.source(0, v[0])
        acc.source(1, v[1])
        acc.consumer(0, v.sum(0))
        if plant:
            held = acc.sums["cnorm"] if where == "sums" else acc.moments.sums["mix_abs"]
            held[0, 1] = bad
        err, finite, _ = acc.end_batch()
        assert err[0] == 0.0 and finite is (not plant)


def test_stacking_schemes_with_different_sublayers_keeps_each_order():
    """shortswa-seq has a third sublayer kind per block: stacking must interleave, not scramble."""
    tokens = random_tokens(tiny(), batch=2)
    seq = capture(build(tiny("shortswa", {"axis": "sequence", "window": 4})), tokens)
    dca = capture(build(tiny("dca")), tokens)  # q/k/v views: extra consumer labels
    std = capture(build(tiny()), tokens)
    stacked = stack_traces([std, seq, dca])
    assert list(stacked["source"].values[:4]) == ["embed", "0.swa", "0.attn", "0.mlp"]
    for t in (std, seq, dca):
        back = select_model(stacked, t.attrs["label"])
        assert list(back["layer"].values) == list(t["layer"].values)
        assert list(back["source"].values) == list(t["source"].values)
        np.testing.assert_array_equal(back["layer_depth"].values, t["layer_depth"].values)
        np.testing.assert_array_equal(back["source_kind"].values, t["source_kind"].values)
        xr.testing.assert_allclose(back.drop_attrs(), t.drop_attrs())
        # available cells are exactly the sources written before the consumer
        avail = back["mixing"].notnull().values
        assert np.array_equal(
            avail, back["source_depth"].values[None, :] < back["layer_depth"].values[:, None]
        )


def test_format_1_files_are_read_and_converted():
    """Fixtures written by the format-1 code (one trace, and three stacked along ``scheme``)."""
    from pathlib import Path

    from depthscope.trace import load_trace, split_models

    here = Path(__file__).parent.parent / "fixtures"
    one = load_trace(here / "format1-single.nc")
    assert one.attrs["trace_format"] == 2 and one.attrs["converted_from_format"] == 1
    assert one.attrs["scheme"] == "attnres" and "model" not in one.dims
    np.testing.assert_allclose(one["mixing_abs"], abs(one["mixing"]))
    stacked = load_trace(here / "format1-stacked.nc")
    assert "scheme" not in stacked.dims and list(stacked["model"].values) == [
        "attnres",
        "dca",
        "shortswa(axis=sequence)",
    ]
    assert list(stacked["scheme"].values) == ["attnres", "dca", "shortswa"]  # was scheme_scheme
    models = split_models(stacked)
    assert [m.attrs["checkpoint"] for m in models[:2]] == ["attnres-tiny.safetensors", "dca-tiny.safetensors"]
    xr.testing.assert_allclose(models[0].drop_attrs(), one.drop_attrs())
    np.testing.assert_allclose(models[1]["contribution_share"].sum("source"), 1.0, atol=1e-5)


def test_stacking_models_of_different_widths_pads_and_restores_their_spectra():
    """A report mixes widths (a foreign model of d 32 beside the zoo's 64): spectra are padded with
    NaN along ``component`` in the stack, and each model gets its own back exactly."""
    narrow, wide = tiny("hc"), tiny("attnres", d_model=32)
    a = capture(build(narrow), random_tokens(narrow), batch_size=2, rank=True)
    b = capture(build(wide), random_tokens(wide), batch_size=2, rank=True)
    stacked = stack_traces([a, b])
    assert stacked.sizes["component"] == 32
    for t in (a, b):
        back = select_model(stacked, t.attrs["label"])
        assert back.sizes["component"] == t.sizes["component"]
        np.testing.assert_array_equal(back["source_spectrum"].values, t["source_spectrum"].values)
        if "hc_res" in t:
            np.testing.assert_array_equal(back["hc_res"].values, t["hc_res"].values)


def test_a_model_gets_back_only_its_own_variables_from_a_stack():
    """The stack holds the union of variables; a native variable of one model (hc_res) is not
    handed to another (whose figures would find an all-NaN hc_res)."""
    a, b = tiny("hc"), tiny("attnres")
    ta = capture(build(a), random_tokens(a), batch_size=2)
    tb = capture(build(b), random_tokens(b), batch_size=2)
    stacked = stack_traces([ta, tb])
    assert "hc_res" in stacked
    assert "hc_res" in select_model(stacked, ta.attrs["label"])
    back = select_model(stacked, tb.attrs["label"])
    assert "hc_res" not in back and sorted(back.data_vars) == sorted(tb.data_vars)
    assert back.attrs == tb.attrs
