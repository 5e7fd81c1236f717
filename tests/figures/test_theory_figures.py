"""Theory and identity-experiment figures: plotted data equals the input, nothing shown or saved."""

from __future__ import annotations

import matplotlib.figure
import matplotlib.pyplot as plt
import numpy as np
import pytest

from depthscope.analysis import theory as th
from depthscope.figures import theory as figs


@pytest.fixture(autouse=True)
def _no_side_effects(monkeypatch, tmp_path):
    """Fail on show() or savefig(), and check that nothing lands in the working directory."""

    def forbidden(*args, **kwargs):
        raise AssertionError("figures must not show or save")

    monkeypatch.setattr(plt, "show", forbidden)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", forbidden)
    monkeypatch.chdir(tmp_path)
    yield
    plt.close("all")
    assert list(tmp_path.iterdir()) == []


def _ydata(ax):
    return [np.asarray(line.get_ydata(), dtype=float) for line in ax.lines]


def test_gain_vs_rank_plots_each_curve_in_order():
    curves = [
        th.gain_curve(30, [3, 10, 20], 5.0, 10.0, "v1", n_tasks=2),
        th.gain_curve(40, [3, 10, 20], 5.0, 10.0, "v2", n_tasks=1),
    ]
    ax = figs.plot_gain_vs_rank(curves)
    ys = _ydata(ax)
    for i, c in enumerate(curves):
        np.testing.assert_array_equal(ys[i], c.values)
        np.testing.assert_array_equal(ax.lines[i].get_xdata(), c["r_star"].values)
    np.testing.assert_array_equal(ys[2], [0.0, 0.0])  # the zero reference comes last
    assert ax.lines[1].get_linestyle() == "--"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["GRN-v1, d = 30", "GRN-v2, d = 40"]
    assert ax.get_xlabel() and ax.get_ylabel()


def test_gain_vs_lambda_min_uses_the_given_axes():
    curve = th.gain_lambda_curve(30, 10, [2.0, 6.0, 10.0], 10.0, "v1", n_tasks=2)
    fig, ax = plt.subplots()
    assert figs.plot_gain_vs_lambda_min(curve, ax=ax) is ax
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), curve.values)
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [2.0, 6.0, 10.0])


def test_threshold_vs_kappa_labels_the_derived_form():
    kappas = [0.1, 0.5, 1.0]
    numerical = th.threshold_curve(kappas, d=20, n_tasks=2)
    derived = th.derived_bound_curve(kappas)
    ax = figs.plot_threshold_vs_kappa(numerical, derived)
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), numerical.values)
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), derived.values)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "derived here" in labels[1] and "derived here" not in labels[0]


def _results():
    steps = np.arange(11)
    return {
        "identity": {"resnet": 2.0 * 0.7**steps, "grn_v1": 2.0 * 0.3**steps},
        "random": {"resnet": 100 - 4.0 * steps, "grn_v1": 100 - 6.0 * steps},
    }


def test_identity_curves_two_log_panels_with_the_input_curves():
    res = _results()
    fig = figs.plot_identity_curves(res)
    assert len(fig.axes) == 2
    for ax, task in zip(fig.axes, ("identity", "random")):
        assert ax.get_yscale() == "log"
        np.testing.assert_array_equal(ax.lines[0].get_ydata(), res[task]["resnet"])
        np.testing.assert_array_equal(ax.lines[1].get_ydata(), res[task]["grn_v1"])
        np.testing.assert_array_equal(ax.lines[0].get_xdata(), np.arange(11))
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ResNet", "GRN-v1"]
    fig.canvas.draw()  # renders in memory without error


def test_identity_sweep_plots_final_errors_against_d():
    sweep = {
        "d": np.array([40, 100, 400]),
        "r_star": 30,
        "identity": {"resnet": np.array([1e-3, 1e-5, 1e-6]), "grn_v1": np.array([1e-4, 1e-6, 1e-7])},
    }
    ax = figs.plot_identity_sweep(sweep)
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [40, 100, 400])
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), sweep["identity"]["resnet"])
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), sweep["identity"]["grn_v1"])
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    ax.figure.canvas.draw()


def test_identity_task_draws_into_the_given_axes_in_the_schemes_colours():
    from depthscope.figures.style import SCHEME_COLORS

    res = _results()
    fig, ax = plt.subplots()
    assert figs.plot_identity_task(res["random"], ax, task="random") is ax
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), res["random"]["grn_v1"])
    assert ax.get_title() == figs.TASK_TITLE["random"]
    assert [ln.get_color() for ln in ax.lines] == [
        SCHEME_COLORS["standard"],
        SCHEME_COLORS["dca"],
    ]  # GRN is DCA's
