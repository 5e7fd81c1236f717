"""Rank figures: plotted values equal the estimators."""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from depthscope.analysis.rank import effective_ranks, rank_profile
from depthscope.figures.rank import plot_rank_profile, plot_rank_vs_width
from depthscope.figures.style import SCHEME_COLORS
from depthscope.probes import capture
from depthscope.trace import stack_traces
from tests.helpers import build, random_tokens, tiny


def test_rank_profile_lines_equal_effective_ranks():
    tokens = random_tokens(tiny(), batch=3)
    traces = [capture(build(tiny(s)), tokens, rank=True) for s in ("standard", "attnres")]
    ax = Figure().subplots()
    assert plot_rank_profile(rank_profile(stack_traces(traces)), ax, kind="entropy") is ax
    lines = [ln for ln in ax.lines if not ln.get_label().startswith("width")]
    assert [ln.get_label() for ln in lines] == ["standard", "attnres"]
    for line, t in zip(lines, traces):
        expected = effective_ranks(t["source_spectrum"]).sel(rank_kind="entropy").values[1:]  # no embedding
        np.testing.assert_allclose(line.get_ydata(), expected)
        np.testing.assert_array_equal(line.get_xdata(), t["source_depth"].values[1:])
        assert line.get_color() == SCHEME_COLORS[t.attrs["scheme"]]
    width = [ln for ln in ax.lines if ln.get_label().startswith("width")]
    assert len(width) == 1 and np.all(np.asarray(width[0].get_ydata()) == 16)
    one = plot_rank_profile(rank_profile(traces[1]), Figure().subplots(), kind="entropy")
    np.testing.assert_array_equal(one.lines[0].get_xydata(), lines[1].get_xydata())


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
    ax = Figure().subplots()
    assert plot_rank_vs_width(table, ax) is ax
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.5, 0.25])
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [0.6, 0.3])
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [32, 64])
    assert [ln.get_color() for ln in ax.lines] == [SCHEME_COLORS["standard"], SCHEME_COLORS["dca"]]
