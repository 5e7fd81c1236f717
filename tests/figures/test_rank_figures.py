"""Rank figures: plotted values equal the estimators."""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthscope.analysis.rank import effective_ranks
from depthscope.figures.rank import plot_rank_profile, plot_rank_vs_width
from depthscope.probes import capture
from depthscope.trace import stack_traces
from tests.helpers import build, random_tokens, tiny


def test_rank_profile_lines_equal_effective_ranks():
    tokens = random_tokens(tiny(), batch=3)
    traces = [capture(build(tiny(s)), tokens, rank=True) for s in ("standard", "attnres")]
    ax = plot_rank_profile(stack_traces(traces), kind="entropy")
    lines = [ln for ln in ax.lines if not ln.get_label().startswith("width")]
    assert [ln.get_label() for ln in lines] == ["standard", "attnres"]
    for line, t in zip(lines, traces):
        expected = effective_ranks(t["source_spectrum"]).sel(rank_kind="entropy").values[1:]  # no embedding
        np.testing.assert_allclose(line.get_ydata(), expected)
        np.testing.assert_array_equal(line.get_xdata(), t["source_depth"].values[1:])
    width = [ln for ln in ax.lines if ln.get_label().startswith("width")][0]
    assert np.all(np.asarray(width.get_ydata()) == 16)


def test_rank_vs_width_lines():
    ratio = np.array([[[0.5, 0.4, 0.3], [0.25, 0.2, 0.1]], [[0.6, 0.5, 0.4], [0.3, 0.3, 0.2]]])
    table = xr.Dataset(
        {"collective_rank_ratio": (("scheme", "width", "rank_kind"), ratio)},
        coords={
            "scheme": ["standard", "dca"],
            "width": [32, 64],
            "rank_kind": ["numerical", "entropy", "participation"],
        },
    )
    ax = plot_rank_vs_width(table)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.5, 0.25])
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [0.6, 0.3])
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [32, 64])
