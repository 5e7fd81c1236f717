"""Curves: every plotted point is an estimator's value; nothing is shown or written."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import xarray as xr
from matplotlib.figure import Figure

from depthscope.analysis import dilution as est
from depthscope.figures import (
    plot_dilution,
    plot_heatmap,
    plot_heatmap_grid,
    plot_pattern_scores,
    plot_retention,
)
from depthscope.figures.style import scheme_colors
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


def test_dilution_lines_are_share_of_at_layer_depth(traces, stacked):
    ax = plot_dilution(stacked)
    colours = scheme_colors(SCHEMES)
    for s in SCHEMES:
        for which in ("embed", "first", "latest"):
            share = est.share_of(traces[s], which)
            ln = line(ax, f"{s}: {which}")
            assert_line_is(ln, per_depth(share))
            assert ln.get_color() == colours[s]
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


def test_dilution_panels_one_source_per_panel(traces, stacked):
    from depthscope.figures.curves import plot_dilution_panels

    fig = plot_dilution_panels(stacked)
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


def test_dilution_accepts_a_list_and_a_single_trace(traces, stacked):
    a = plot_dilution(stacked, sources=("latest",))
    b = plot_dilution([traces[s] for s in SCHEMES], sources=("latest",))
    c = plot_dilution(traces["attnres"], sources=("latest",))
    for ln_a, ln_b in zip(a.lines, b.lines):
        assert ln_a.get_label() == ln_b.get_label()
        np.testing.assert_array_equal(ln_a.get_xydata(), ln_b.get_xydata())
    np.testing.assert_array_equal(c.lines[0].get_xydata(), line(a, "attnres: latest").get_xydata())
    assert len(a.lines) == len(SCHEMES) + 1


def test_dilution_axis_is_log_when_positive_and_symlog_otherwise(traces):
    t = traces["standard"]
    positive = t.assign(contribution_share=abs(t["contribution_share"]) + 1e-6)
    assert plot_dilution(positive).get_yscale() == "log"
    negative = positive.copy()
    negative["contribution_share"] = negative["contribution_share"].where(
        negative["source"] != "0.attn", -negative["contribution_share"]
    )
    ax = plot_dilution(negative)
    assert ax.get_yscale() == "symlog"
    assert line(ax, "standard: first").get_ydata().min() < 0
    assert plot_dilution(positive, yscale="linear").get_yscale() == "linear"


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
    ax = plot_retention(t)
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
    ax = plot_retention(stacked)
    for s in SCHEMES:
        t = traces[s]
        mean = est.relative_retention(t).where(t["source_kind"] != "embed").mean("source")
        keep = np.isfinite(mean.values)
        ln = line(ax, f"{s}: mean over sublayer sources")
        np.testing.assert_array_equal(ln.get_xdata(), mean["lag"].values[keep])
        np.testing.assert_allclose(ln.get_ydata(), mean.values[keep], rtol=1e-12)
    assert ax.lines[-1].get_label() == "1/T (uniform share)"


def test_pattern_scores_are_the_estimator_per_depth(traces, stacked):
    ax = plot_pattern_scores(stacked, k=1)
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
    assert "> 1: input-and-recent pattern" in ax.get_ylabel()


def test_curves_draw_into_a_given_axes(traces):
    fig = Figure()
    axes = fig.subplots(1, 3)
    assert plot_dilution(traces["dca"], ax=axes[0]) is axes[0]
    assert plot_retention(traces["dca"], ax=axes[1]) is axes[1]
    assert plot_pattern_scores([traces["dca"]], ax=axes[2]) is axes[2]
    assert not axes[0].spines["top"].get_visible()


def _plots(traces, stacked):
    return [
        lambda: plot_heatmap(traces["dca"], annotate=True),
        lambda: plot_heatmap(traces["denseformer"], symlog=True),
        lambda: plot_heatmap_grid(stacked),
        lambda: plot_heatmap_grid(list(traces.values()), "norm_share"),
        lambda: plot_dilution(stacked),
        lambda: plot_retention(traces["standard"]),
        lambda: plot_retention(stacked),
        lambda: plot_pattern_scores(stacked),
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
