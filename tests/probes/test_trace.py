"""Trace stacking and the accumulator on planted data."""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from depthscope.probes import capture
from depthscope.probes.trace import Accumulator, Layout, select_scheme, stack_traces
from tests.helpers import build, random_tokens, tiny


def test_stack_and_select_round_trip():
    tokens = random_tokens(tiny(), batch=2)
    small = capture(build(tiny(n_layers=2)), tokens)
    big = capture(build(tiny("attnres")), tokens)
    stacked = stack_traces([small, big, small])
    assert list(stacked["scheme"].values) == ["standard", "attnres", "standard#2"]
    assert stacked.sizes["layer"] == big.sizes["layer"] and stacked.sizes["source"] == big.sizes["source"]
    assert list(stacked["layer"].values) == list(big["layer"].values)  # depth order, not alphabetical
    back = select_scheme(stacked, "standard")
    xr.testing.assert_allclose(back.drop_attrs(), small.drop_attrs())
    assert back.attrs["scheme"] == "standard" and back.attrs["tokens"] == small.attrs["tokens"]
    assert np.isnan(stacked["mixing"].sel(scheme="standard", layer="2.attn")).all()


def test_accumulator_on_planted_weights():
    """Two sources with planted per-token weights: mixing mean/std and shares by hand."""
    lay = Layout(["a"], [2], ["attn"], [2], ["embed", "0.attn"], [0, 1], ["embed", "attn"])
    acc = Accumulator(lay)
    v = torch.zeros(1, 2, 2, 3, dtype=torch.float64)
    v[..., 0, 0] = 1.0  # source 0 along e0
    v[..., 1, 1] = 2.0  # source 1 along e1
    w = torch.tensor([[[1.0, 3.0], [3.0, 1.0]]], dtype=torch.float64)  # two tokens
    h = (w[..., None] * v).sum(2)
    norms = torch.stack([acc.source(0, v[:, :, 0]), acc.source(1, v[:, :, 1])], dim=-1)
    acc.consumer(0, h, w, v, norms)
    acc.add_tokens(2)
    ds = acc.dataset({})
    np.testing.assert_allclose(ds["mixing"].values[0], [2.0, 2.0])
    np.testing.assert_allclose(ds["mixing_std"].values[0], [1.0, 1.0])
    # |c|^2 per token: token 1: (1, 36); token 2: (9, 4); orthogonal sources
    np.testing.assert_allclose(ds["contribution_share"].values[0], [10 / 50, 40 / 50])
    np.testing.assert_allclose(ds["norm_share"].values[0], [4 / 12, 8 / 12])
    np.testing.assert_allclose(ds["source_rms"].values, [np.sqrt(2 / 6), np.sqrt(8 / 6)])
    assert ds["residual_error"].item() == 0.0
    # per-feature weights equal to the scalar ones give the same statistics
    acc2 = Accumulator(lay)
    acc2.consumer(0, h, w[..., None].expand(-1, -1, -1, 3), v, norms)
    acc2.add_tokens(2)
    ds2 = acc2.dataset({})
    for name in ("mixing", "mixing_std", "contribution_share", "norm_share"):
        np.testing.assert_allclose(ds2[name].values, ds[name].values)


def test_stacking_schemes_with_different_sublayers_keeps_each_order():
    """shortswa-seq has a third sublayer kind per block: stacking must interleave, not scramble."""
    tokens = random_tokens(tiny(), batch=2)
    seq = capture(build(tiny("shortswa", {"axis": "sequence", "window": 4})), tokens)
    dca = capture(build(tiny("dca")), tokens)  # q/k/v views: extra consumer labels
    std = capture(build(tiny()), tokens)
    stacked = stack_traces([std, seq, dca])
    assert list(stacked["source"].values[:4]) == ["embed", "0.swa", "0.attn", "0.mlp"]
    for t in (std, seq, dca):
        back = select_scheme(stacked, t.attrs["label"])
        assert list(back["layer"].values) == list(t["layer"].values)
        assert list(back["source"].values) == list(t["source"].values)
        np.testing.assert_array_equal(back["layer_depth"].values, t["layer_depth"].values)
        np.testing.assert_array_equal(back["source_kind"].values, t["source_kind"].values)
        xr.testing.assert_allclose(back.drop_attrs(), t.drop_attrs())
        # available cells are exactly the sources written before the consumer
        avail = back["mixing"].notnull().values
        assert np.array_equal(avail, back["source_depth"].values[None, :] < back["layer_depth"].values[:, None])
