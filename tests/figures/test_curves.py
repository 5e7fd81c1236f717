"""Curves: every plotted point is an estimator's value; nothing is shown or written."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import xarray as xr
from matplotlib.figure import Figure

from depthscope.analysis import dilution as est
from depthscope.figures import (
    model_colors,
    plot_dilution,
    plot_dilution_panels,
    plot_heatmap,
    plot_heatmap_grid,
    plot_pattern_scores,
    plot_retention,
)
from depthscope.figures.style import SCHEME_COLORS
from depthscope.trace import stack_traces
from tests.figures.test_heatmaps import perturbed_trace

SCHEMES = ("standard", "denseformer", "attnres", "dca")


@pytest.fixture(scope="module")
def traces() -> dict[str, xr.Dataset]:
    return {s: perturbed_trace(s, seed=1) for s in SCHEMES}


@pytest.fixture(scope="module")
def stacked(traces) -> xr.Dataset:
    return stack_traces([traces[s] for s in SCHEMES])


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def line(ax, label: str):
    found = [ln for ln in ax.lines if ln.get_label() == label]
    assert len(found) == 1, f"{label!r}: {[ln.get_label() for ln in ax.lines]}"
    return found[0]


def per_depth(da: xr.DataArray) -> dict[int, float]:
    """Mean of da over the consumers at each layer_depth (DCA's q/k/v rows share one depth)."""
    out: dict[int, list[float]] = {}
    for d, v in zip(da["layer_depth"].values, da.values):
        if np.isfinite(v):
            out.setdefault(int(d), []).append(float(v))
    return {d: float(np.mean(v)) for d, v in out.items()}


def assert_line_is(ln, expected: dict[int, float]) -> None:
    x, y = ln.get_data()
    assert list(x) == sorted(expected)
    np.testing.assert_allclose(y, [expected[int(d)] for d in x], rtol=1e-12)


def user_axes(n: int = 1):
    """Axes of a figure made by the caller, not by the plot function."""
    axes = Figure().subplots(1, n, squeeze=False)[0]
    return axes if n > 1 else axes[0]


def test_dilution_lines_are_share_of_at_layer_depth(traces, stacked):
    ax = plot_dilution(est.dilution_curves(stacked))
    colours = model_colors((s, s) for s in SCHEMES)
    for s in SCHEMES:
        for which in ("embed", "first", "latest"):
            share = est.share_of(traces[s], which)
            ln = line(ax, f"{s}: {which}")
            assert_line_is(ln, per_depth(share))
            assert ln.get_color() == colours[s] == SCHEME_COLORS[s]
        if s != "dca":  # one consumer per depth: the points are exactly the consumers' values
            x, y = line(ax, f"{s}: embed").get_data()
            np.testing.assert_array_equal(x, traces[s]["layer_depth"].values)
            np.testing.assert_array_equal(y, est.share_of(traces[s], "embed").values)
    base = line(ax, "1/T baseline")
    assert base.get_linestyle() == "--" and base.get_color() == "black"
    assert_line_is(base, per_depth(est.baseline(traces["standard"])))
    x, y = base.get_data()
    np.testing.assert_allclose(y, 1.0 / x)  # a standard layout: depth d reads d sources
    assert ax.lines[-1] is base  # data lines first, the reference after them
    assert ax.get_yscale() in ("log", "symlog")


def test_dilution_draws_the_curves_into_the_given_axes(traces):
    curves = est.dilution_curves(traces["dca"])
    ax = user_axes()
    assert plot_dilution(curves, ax, sources=("latest",)) is ax
    assert [ln.get_label() for ln in ax.lines] == ["dca: latest", "1/T baseline"]
    # the first consumer reads the embedding alone: it has no latest sublayer, and its point is left out
    latest = curves["latest_share"]
    assert np.isnan(latest.values[0]) and np.isfinite(latest.values[1:]).all()
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), curves["layer_depth"].values[1:])
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), latest.values[1:])
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), curves["baseline"].values)
    assert not ax.spines["top"].get_visible()


def test_dilution_panels_one_source_per_panel(traces, stacked):
    fig = plot_dilution_panels(est.dilution_curves(stacked))
    panels = fig.axes[:3]
    for ax, which in zip(panels, ("embed", "first", "latest")):
        for s in SCHEMES:
            assert_line_is(line(ax, f"{s}: {which}"), per_depth(est.share_of(traces[s], which)))
        assert not [
            ln
            for ln in ax.lines
            if ln.get_label().endswith(("embed", "first", "latest")) and which not in ln.get_label()
        ]
    assert panels[0].get_shared_y_axes().joined(panels[0], panels[2])


def test_a_saved_dilution_figure_holds_both_legends_whole(stacked):
    """The model legend sits outside the axes; a tight save must still include all of it."""
    from matplotlib.legend import Legend

    for fig in (
        plot_dilution_panels(est.dilution_curves(stacked)),
        plot_dilution(est.dilution_curves(stacked)).figure,
    ):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        saved = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)  # what savefig keeps, in pixels
        legends = [c for ax in fig.axes for c in ax.get_children() if isinstance(c, Legend)]
        assert len(legends) == 2
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert saved.x0 <= box.x0 and box.x1 <= saved.x1 + 1e-6, (box, saved)
            assert saved.y0 <= box.y0 and box.y1 <= saved.y1 + 1e-6, (box, saved)


def test_a_stack_and_its_traces_one_by_one_give_the_same_lines(traces, stacked):
    a = plot_dilution(est.dilution_curves(stacked), sources=("latest",))
    for s in SCHEMES:
        own = plot_dilution(est.dilution_curves(traces[s]), sources=("latest",))
        np.testing.assert_array_equal(own.lines[0].get_xydata(), line(a, f"{s}: latest").get_xydata())
        assert own.lines[0].get_color() == line(a, f"{s}: latest").get_color()
    assert len(a.lines) == len(SCHEMES) + 1


def test_models_are_coloured_by_their_scheme_not_their_label(traces):
    """A label says nothing here: the ``scheme`` coordinate picks the colour, and two models of
    one scheme get distinct colours (the first keeps its scheme's)."""
    runs = [traces["attnres"].assign_attrs(label=name) for name in ("dca-lookalike", "run-2")]
    ax = plot_dilution(est.dilution_curves(stack_traces(runs)), sources=("embed",))
    first, second = line(ax, "dca-lookalike: embed"), line(ax, "run-2: embed")
    assert first.get_color() == SCHEME_COLORS["attnres"]
    assert second.get_color() != first.get_color()


def test_dilution_axis_is_log_when_positive_and_symlog_otherwise(traces):
    t = traces["standard"]
    positive = t.assign(contribution_share=abs(t["contribution_share"]) + 1e-6)
    assert plot_dilution(est.dilution_curves(positive)).get_yscale() == "log"
    negative = positive.copy()
    negative["contribution_share"] = negative["contribution_share"].where(
        negative["source"] != "0.attn", -negative["contribution_share"]
    )
    ax = plot_dilution(est.dilution_curves(negative))
    assert ax.get_yscale() == "symlog"
    assert line(ax, "standard: first").get_ydata().min() < 0
    assert plot_dilution(est.dilution_curves(positive), yscale="linear").get_yscale() == "linear"


def test_uniform_retention_is_one_over_the_readers_sources(traces):
    t = traces["denseformer"]  # standard layout: the consumer at depth d reads d sources
    u = est.uniform_retention(t)
    for s, d in zip(t["source"].values, t["source_depth"].values):
        row = u.sel(source=s)
        lags = row["lag"].values[np.isfinite(row.values)]
        np.testing.assert_allclose(row.sel(lag=lags).values, 1.0 / (d + lags))
    np.testing.assert_allclose(est.relative_retention(t), est.retention(t) / u)


def test_retention_of_one_trace_has_a_line_per_source(traces):
    t = traces["attnres"]
    ax = user_axes()
    assert plot_retention(est.relative_retention(t), ax) is ax
    r = est.retention(t) / est.uniform_retention(t)
    for s in t["source"].values:
        ln = line(ax, f"attnres: {s}")
        expected = r.sel(source=s)
        keep = np.isfinite(expected.values)
        np.testing.assert_array_equal(ln.get_xdata(), expected["lag"].values[keep])
        np.testing.assert_allclose(ln.get_ydata(), expected.values[keep], rtol=1e-12)
    ref = ax.lines[-1]
    assert ref.get_label() == "1/T (uniform share)"
    np.testing.assert_array_equal(ref.get_ydata(), [1.0, 1.0])
    assert len(ax.lines) == t.sizes["source"] + 1
    assert len(ax.figure.axes) == 2  # the source-depth colour bar


def test_retention_of_several_schemes_is_the_mean_over_sublayer_sources(traces, stacked):
    ax = plot_retention(est.mean_retention(stacked))
    for s in SCHEMES:
        t = traces[s]
        mean = est.relative_retention(t).where(t["source_kind"] != "embed").mean("source")
        keep = np.isfinite(mean.values)
        ln = line(ax, f"{s}: mean over sublayer sources")
        np.testing.assert_array_equal(ln.get_xdata(), mean["lag"].values[keep])
        np.testing.assert_allclose(ln.get_ydata(), mean.values[keep], rtol=1e-12)
    assert ax.lines[-1].get_label() == "1/T (uniform share)"


def test_one_panel_of_several_models_sources_is_refused(stacked):
    from depthscope.errors import DepthscopeError

    with pytest.raises(DepthscopeError, match="mean_retention"):
        plot_retention(est.relative_retention(stacked))


def test_pattern_scores_are_the_estimator_per_depth(traces, stacked):
    ax = user_axes()
    assert plot_pattern_scores(est.pattern_curves(stacked, k=1), ax) is ax
    for s in SCHEMES:
        assert_line_is(line(ax, f"{s}: pattern score"), per_depth(est.pattern_score(traces[s], k=1)))
    np.testing.assert_allclose(line(ax, "standard: pattern score").get_ydata(), 1.0)  # uniform rows
    ref = ax.lines[-1]
    assert ref.get_label() == "uniform (1.0)"
    np.testing.assert_array_equal(ref.get_ydata(), [1.0, 1.0])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    for s in SCHEMES:
        mean = float(est.summary(traces[s], k=1)["pattern_score"].sel(group="sublayers"))
        assert f"{s} (mean {mean:.2f})" in legend
    assert "(k = 1)" in ax.get_ylabel() and "> 1: input-and-recent pattern" in ax.get_ylabel()


def _plots(traces, stacked):
    return [
        lambda: plot_heatmap(traces["dca"], annotate=True),
        lambda: plot_heatmap(traces["denseformer"], symlog=True),
        lambda: plot_heatmap_grid(est.row_normalized(stacked)),
        lambda: plot_heatmap_grid(stacked, "norm_share"),
        lambda: plot_dilution(est.dilution_curves(stacked)),
        lambda: plot_retention(est.relative_retention(traces["standard"])),
        lambda: plot_retention(est.mean_retention(stacked)),
        lambda: plot_pattern_scores(est.pattern_curves(stacked)),
    ]


def test_no_plot_shows_or_writes(traces, stacked, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a plot function called show()")

    monkeypatch.setattr(plt, "show", refuse)
    monkeypatch.setattr(Figure, "show", refuse)
    monkeypatch.chdir(tmp_path)
    for plot in _plots(traces, stacked):
        out = plot()
        fig = out if isinstance(out, Figure) else out.figure
        fig.canvas.draw()  # a full render must not write either
    assert list(tmp_path.iterdir()) == []
