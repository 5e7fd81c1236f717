"""Figures over training: every point is the trajectory's ``summary`` at a checkpoint, against the
training tokens seen (the bundled zoo trajectories, nothing to capture)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

from depthscope import zoo
from depthscope.analysis.dilution import summary
from depthscope.figures.curves import (
    TRAJECTORY_GROUPS,
    plot_group_over_training,
    plot_loss_over_training,
    plot_pattern_over_training,
    plot_shares_over_training,
    plot_trajectory,
)
from depthscope.figures.style import SCHEME_COLORS
from depthscope.trace import load_trace


@pytest.fixture(scope="module")
def tables():
    return {
        n: summary(load_trace(zoo.ZOO_DIR / "trajectories" / f"{n}.nc")) for n in ("dca", "attnres-block4")
    }


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_pattern_over_training_is_the_summary_per_group(tables):
    table = tables["dca"]
    ax = Figure().subplots()
    assert plot_pattern_over_training(table, ax) is ax
    drawn = [g for g in TRAJECTORY_GROUPS if np.isfinite(table["pattern_score"].sel(group=g)).any()]
    assert [ln.get_label() for ln in ax.lines[:-1]] == [TRAJECTORY_GROUPS[g][1] for g in drawn]
    for ln, group in zip(ax.lines, drawn):
        np.testing.assert_array_equal(ln.get_xdata(), table["train_tokens"].values)
        np.testing.assert_array_equal(ln.get_ydata(), table["pattern_score"].sel(group=group).values)
        assert ln.get_color() == SCHEME_COLORS["dca"]
    assert ax.lines[-1].get_label() == "uniform row" and ax.get_xscale() == "log"


def test_shares_and_loss_over_training(tables):
    table = tables["attnres-block4"]
    ax = plot_shares_over_training(table, Figure().subplots())
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), table["embed_share"].sel(group="readout").values)
    np.testing.assert_array_equal(
        ax.lines[2].get_ydata(), table["latest_index"].sel(group="sublayers").values
    )
    assert ax.get_yscale() == "log" and ax.lines[0].get_color() == SCHEME_COLORS["attnres"]  # its scheme
    loss = plot_loss_over_training(table, Figure().subplots())
    np.testing.assert_array_equal(loss.lines[0].get_ydata(), table["val_loss"].values)
    np.testing.assert_array_equal(loss.lines[0].get_xdata(), table["train_tokens"].values)


def test_trajectory_figure_is_its_three_panels(tables):
    table = tables["dca"]
    fig = plot_trajectory(table)
    for ax, panel in zip(
        fig.axes, (plot_pattern_over_training, plot_shares_over_training, plot_loss_over_training)
    ):
        own = panel(table, Figure().subplots())
        assert [ln.get_label() for ln in ax.lines] == [ln.get_label() for ln in own.lines]
        for a, b in zip(ax.lines, own.lines):
            np.testing.assert_array_equal(a.get_xydata(), b.get_xydata())
    assert fig.get_suptitle() == "dca: steps 250, 500, 1000, 2000, 4000"  # the run is its variant


def test_group_over_training_has_a_line_per_run(tables):
    runs = list(tables.values())
    ax = Figure().subplots()
    assert plot_group_over_training(runs, ax, group="mlp") is ax
    assert [ln.get_label() for ln in ax.lines[:-1]] == ["dca", "attnres-block4"]
    for ln, table in zip(ax.lines, runs):
        np.testing.assert_array_equal(ln.get_ydata(), table["pattern_score"].sel(group="mlp").values)
