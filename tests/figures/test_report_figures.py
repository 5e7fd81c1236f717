"""The report's figures: the same names and captions as ever, and each one exactly what its
primitive draws from the estimator's output (the report is where traces meet estimators)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from depthscope import zoo
from depthscope.analysis.dilution import (
    dilution_curves,
    mean_retention,
    pattern_curves,
    relative_retention,
    row_normalized,
    summary,
)
from depthscope.analysis.rank import rank_profile
from depthscope.figures.curves import (
    plot_dilution_panels,
    plot_pattern_scores,
    plot_retention,
    plot_trajectories,
    plot_trajectory,
)
from depthscope.figures.heatmaps import plot_heatmap_grid
from depthscope.figures.rank import plot_rank_profile
from depthscope.figures.report import norm_growth_figure
from depthscope.trace import load_trace, split_models, stack_traces
from tests.figures import planned_figures

REFERENCE = Path(__file__).parent.parent / "fixtures" / "reference"


@pytest.fixture(scope="module")
def stacked():
    return stack_traces([load_trace(REFERENCE / "attnres.nc"), load_trace(REFERENCE / "dca.nc")])


@pytest.fixture(scope="module")
def trajectories():
    return [load_trace(zoo.ZOO_DIR / "trajectories" / f"{n}.nc") for n in ("hc", "mhc")]


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def drawn(fig) -> list:
    """Every line's points and every image's cells, panel by panel."""
    out = []
    for ax in fig.axes:
        out.append([np.asarray(ln.get_xydata(), dtype=float) for ln in ax.lines])
        out.append([np.ma.filled(np.ma.asarray(im.get_array(), dtype=float), np.nan) for im in ax.images])
    return out


def assert_same_drawing(a, b) -> None:
    da, db = drawn(a), drawn(b)
    assert len(da) == len(db)
    for xs, ys in zip(da, db):
        assert len(xs) == len(ys)
        for x, y in zip(xs, ys):
            np.testing.assert_array_equal(x, y)


def test_the_report_plans_the_same_figures(stacked, trajectories):
    names = [s.name for s, _ in planned_figures(split_models(stacked), 2, trajectories)]
    assert names == [
        "grid-weights",
        "grid-share",
        "dilution",
        "norm-growth",
        "grid-mixing",
        "pattern",
        "retention",
        "weight-effect",
        "read-depth-dca",
        "trajectories",
        "trajectory-hc-8blocks-steps250-4000",
        "trajectory-weights-hc-8blocks-steps250-4000",
        "trajectory-mhc-8blocks-steps250-4000",
        "trajectory-weights-mhc-8blocks-steps250-4000",
        "rank",
        "model-attnres",
        "model-dca",
    ]


def test_every_figure_of_the_page_is_a_row_of_one_table(stacked, trajectories):
    """One table of figure kinds: each figure a report makes names its kind once (``figure``), its
    name starts with that kind, and its title, caption and drawing are that row's."""
    from depthscope.figures.report import FIGURES
    from depthscope.pipelines.report_data import report_data
    from depthscope.pipelines.report_settings import ReportSettings

    data, _ = report_data(split_models(stacked), list(trajectories), ReportSettings(k=2))
    kinds = set()
    for f in data.figures():
        row = FIGURES[f.kind]
        assert f.spec.name == f.kind or f.spec.name.startswith(f.kind + "-"), (f.kind, f.spec.name)
        fixed = row.caption.split("{")[0]  # the caption up to its first filled-in field
        assert f.spec.caption.startswith(fixed) and f.spec.title.startswith(row.title.split("{")[0])
        kinds.add(f.kind)
    assert {"grid-weights", "grid-share", "grid-mixing", "trajectory-weights", "model", "rank"} <= kinds
    for name, row in FIGURES.items():
        assert row.title and row.caption and callable(row.draw), name


def test_each_report_figure_is_its_primitive_of_the_estimator(stacked, trajectories):
    k = 2
    planned = {s.name: draw for s, draw in planned_figures(split_models(stacked), k, trajectories)}
    expected = {
        "grid-weights": lambda: plot_heatmap_grid(row_normalized(stacked)),
        "grid-share": lambda: plot_heatmap_grid(stacked["contribution_share"]),
        "dilution": lambda: plot_dilution_panels(dilution_curves(stacked)),
        "norm-growth": lambda: norm_growth_figure(dilution_curves(stacked)),
        "pattern": lambda: plot_pattern_scores(pattern_curves(stacked, k)).figure,
        "retention": lambda: plot_retention(mean_retention(stacked)).figure,
        "rank": lambda: plot_rank_profile(rank_profile(stacked)).figure,
        "trajectories": lambda: plot_trajectories([summary(tr, k) for tr in trajectories]),
        "trajectory-hc-8blocks-steps250-4000": lambda: plot_trajectory(summary(trajectories[0], k)),
    }
    for name, primitive in expected.items():
        assert_same_drawing(planned[name](), primitive())
    # and the grid's panels are each model's own row-normalised weights
    grid = planned["grid-weights"]()
    for ax, t in zip(grid.axes, split_models(stacked)):
        np.testing.assert_allclose(
            ax.images[0].get_array().filled(np.nan), row_normalized(t).values, rtol=1e-12
        )


def test_a_report_of_one_model_draws_the_retention_of_each_source(stacked):
    one = stack_traces([split_models(stacked)[0]])
    planned = {s.name: draw for s, draw in planned_figures(split_models(one), 2)}
    fig = planned["retention"]()
    assert_same_drawing(fig, plot_retention(relative_retention(one)).figure)
    assert len(fig.axes[0].lines) == one.sizes["source"] + 1  # a line per source and the 1/T line


def _texts(fig) -> list[str]:
    """Every text a rendered figure shows: titles, labels, legends and tick labels (after a draw)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


def test_no_report_figure_shows_math_source(stacked, trajectories):
    """The house style never parses math, so a mathtext or TeX source would show raw: none may be
    drawn (log and symlog ticks were "$\\mathdefault{10^{0}}$"; the DWA colour bar "alpha_{i,j}")."""
    import re

    from depthscope.figures.causal import native_figure

    figs = [draw() for _, draw in planned_figures(split_models(stacked), 2, trajectories)]
    dense = split_models(load_trace(zoo.ZOO_DIR / "trajectories" / "denseformer.nc"))[-1]
    figs.append(native_figure(dense))  # the DWA weights, DenseFormer's Fig. 5
    figs.append(plot_retention(relative_retention(dense)).figure)  # log ticks
    assert len(figs) > 10
    for fig in figs:
        for text in _texts(fig):
            assert not re.search(r"\$|\\mathdefault|_\{|\^\{", text), text


def test_the_retention_legend_does_not_cover_the_title(stacked):
    fig = plot_retention(relative_retention(split_models(stacked)[0])).figure
    fig.canvas.draw()
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    legend, title = ax.get_legend().get_window_extent(renderer), ax.title.get_window_extent(renderer)
    assert not legend.overlaps(title) or not ax.title.get_text()
