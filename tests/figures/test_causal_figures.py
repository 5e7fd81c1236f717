"""Weight against effect and read depth: the points are the estimators' cells, the wrappers draw
exactly what their primitives draw from the estimators' output."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from depthscope.analysis.causal import views, weight_effect, weight_effect_correlation
from depthscope.figures.causal import (
    plot_read_depth,
    plot_weight_effect,
    read_depth_figure,
    weight_effect_figure,
)
from depthscope.figures.style import SCHEME_COLORS
from depthscope.trace import load_trace

REFERENCE = Path(__file__).parent.parent / "fixtures" / "reference"


@pytest.fixture(scope="module")
def attnres():
    return load_trace(REFERENCE / "attnres.nc")  # the zoo AttnRes with cell ablations


@pytest.fixture(scope="module")
def dca():
    return load_trace(REFERENCE / "dca.nc")  # the zoo DCA: q, k and v views of every attention


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_weight_effect_points_are_the_cells(attnres):
    cells = weight_effect(attnres)
    ax = Figure().subplots()
    assert plot_weight_effect(cells, ax, x="weight") is ax
    np.testing.assert_array_equal(
        ax.collections[0].get_offsets(), np.column_stack([cells["weight"].values, cells["effect"].values])
    )
    assert ax.get_xlabel() == "row-normalised weight" and ax.lines[0].get_ydata()[0] == 0.0


def test_weight_effect_figure_is_the_primitive_of_each_model(attnres, dca):
    fig = weight_effect_figure([attnres, dca])  # DCA has no cell ablations: no row
    assert len(fig.axes) == 2
    cells, rho = weight_effect(attnres), weight_effect_correlation(attnres)
    for ax, x in zip(fig.axes, ("share", "weight")):
        expected = plot_weight_effect(cells, Figure().subplots(), x=x)
        np.testing.assert_array_equal(ax.collections[0].get_offsets(), expected.collections[0].get_offsets())
        assert ax.get_title(loc="left") == f"attnres: rho = {float(rho[f'rho_{x}']):.2f}"
        assert tuple(ax.collections[0].get_facecolor()[0][:3]) == pytest.approx(
            to_rgb(SCHEME_COLORS["attnres"])
        )
    with pytest.raises(ValueError, match="ablate='cells'"):
        weight_effect_figure(dca)


def test_read_depth_lines_are_the_views(dca):
    v = views(dca)
    ax = Figure().subplots()
    assert plot_read_depth(v, ax, var="embed_mass") is ax
    assert [ln.get_label() for ln in ax.lines] == [str(x) for x in v["view"].values] == ["q", "k", "v"]
    for ln, name in zip(ax.lines, v["view"].values):
        np.testing.assert_array_equal(ln.get_xdata(), v["block"].values)
        np.testing.assert_array_equal(ln.get_ydata(), v["embed_mass"].sel(view=name).values)
    fig = read_depth_figure(dca)
    for panel, var in zip(fig.axes, ("mean_lag", "embed_mass")):
        own = plot_read_depth(v, Figure().subplots(), var=var)
        for a, b in zip(panel.lines, own.lines):
            np.testing.assert_array_equal(a.get_xydata(), b.get_xydata())
    with pytest.raises(ValueError, match="multi-input"):
        plot_read_depth(views(load_trace(REFERENCE / "llama.nc")))
