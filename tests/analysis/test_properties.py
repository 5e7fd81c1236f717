"""Property tests (hypothesis): batch splits never change a trace; the effective ranks are ordered."""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from depthscope.analysis.rank import entropy_rank, numerical_rank, participation_ratio
from depthscope.probes.accumulate import Accumulator
from depthscope.trace import Layout

LAYOUT = Layout(["a", "b"], [1, 2], ["attn", "mlp"], [1, 2], ["embed", "0.attn"], [0, 1], ["embed", "attn"])


def fold(values, weights, splits, covariance=False):
    """Feed tokens [T, source, d] with per-token weights [T, 2 consumers, 2 sources] in batches."""
    acc = Accumulator(LAYOUT, covariance=covariance)
    bounds = [0, *sorted(splits), len(values)]
    for a, b in zip(bounds, bounds[1:]):
        if a == b:
            continue
        v = values[a:b]  # [tokens, source, d]
        acc.start_batch()
        for j in range(2):
            acc.source(j, v[:, j])
        for i in range(2):
            w = weights[a:b, i, : i + 1]
            acc.consumer(i, (w.unsqueeze(-1) * v[:, : i + 1]).sum(1), w)
        err, finite, _ = acc.end_batch()
        assert finite and np.all(err < 1e-12)
        acc.add_tokens(b - a)
    return acc.dataset({})


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 10_000),
    n_tokens=st.integers(2, 40),
    splits=st.lists(st.integers(0, 40), max_size=6),
)
def test_any_batch_split_gives_the_same_trace(seed, n_tokens, splits):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n_tokens, 2, 5, generator=g, dtype=torch.float64)
    weights = 1 + 0.5 * torch.randn(n_tokens, 2, 2, generator=g, dtype=torch.float64)
    one = fold(values, weights, [], covariance=True)
    many = fold(values, weights, [s % (n_tokens + 1) for s in splits], covariance=True)
    xr.testing.assert_allclose(one, many, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(one["contribution_share"].sum("source"), 1.0, atol=1e-12)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=30), st.floats(0.05, 1.0))
def test_effective_ranks_are_ordered(lams, energy):
    spec = xr.DataArray([sorted(lams, reverse=True)], dims=("source", "component"))
    positive = sum(x > 0 for x in lams)
    large = sum(x > 1e-9 * sum(lams) for x in lams)  # eigenvalues rounding cannot hide
    pr, er = participation_ratio(spec).item(), entropy_rank(spec).item()
    nr = numerical_rank(spec, energy).item()
    assert nr <= positive and large <= numerical_rank(spec, 1.0).item() <= positive
    if max(lams) > 0:
        # Renyi entropy of order 2 <= Shannon entropy <= log(rank): PR <= exp(H) <= rank
        assert 1 - 1e-9 <= pr <= er + 1e-9 and er <= positive + 1e-6
        assert nr >= 1 and numerical_rank(spec, min(1.0, energy + 0.1)).item() >= nr  # monotone in energy
