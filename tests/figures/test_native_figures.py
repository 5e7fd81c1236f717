"""Each paper's own parametrisation, drawn from the bundled zoo's real weights."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

import depthscope
from depthscope import zoo
from depthscope.analysis.native import stream_composite
from depthscope.figures.causal import native_figure, plot_dwa, plot_entries, plot_stream_matrix
from depthscope.probes import capture
from depthscope.schemes import DepthModel
from depthscope.trace import load_trace, split_models


def _zoo_trace(name: str, **kw):
    model = depthscope.load(zoo.ZOO_DIR / f"{name}.safetensors")
    return model, capture(model, n_tokens=256, ctx=64, **kw)


def _bundled(name: str):
    """The last checkpoint of a bundled trajectory: real trained weights, nothing to capture."""
    return split_models(load_trace(zoo.ZOO_DIR / "trajectories" / f"{name}.nc"))[-1]


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_denseformer_colourbar_is_labelled_in_plain_numbers_at_the_papers_ticks():
    """The symlog colour bar reads +-1, 0.368, 0.135, 0.05 (Fig. 5), never raw mathtext strings."""
    _, trace = _zoo_trace("denseformer")
    fig = native_figure(trace)
    fig.canvas.draw()  # tick labels are formatted at draw time
    bar = fig.axes[-1]
    labels = [t.get_text() for t in bar.get_yticklabels()]
    assert labels and not any("$" in s or "mathdefault" in s for s in labels)
    ticks = bar.get_yticks()
    np.testing.assert_allclose([float(s) for s in labels], ticks, rtol=5e-3)  # "0.135" for e^-2
    assert {"1", "0.368", "0.135", "0.05", "0"} <= set(labels)


def test_dwa_panel_is_the_trace_weights_in_a_users_axes():
    t = _bundled("denseformer")
    ax = Figure().subplots()
    assert plot_dwa(t["dwa_alpha"], ax) is ax
    alpha = t["dwa_alpha"].transpose("dwa", "state").values
    shown = np.ma.asarray(ax.images[0].get_array())
    np.testing.assert_array_equal(np.ma.getmaskarray(shown), np.isnan(alpha))
    np.testing.assert_array_equal(shown.compressed(), alpha[np.isfinite(alpha)])
    wrapped = native_figure(t)  # the wrapper draws the same panel, titled by the model
    np.testing.assert_array_equal(wrapped.axes[0].images[0].get_array(), ax.images[0].get_array())
    assert wrapped.axes[0].get_title(loc="left").startswith(t.attrs["label"] + ": DWA weights")


def test_entries_panels_are_the_softmax_weights_of_each_kind_of_consumer():
    t = _bundled("attnres-block4")
    alpha = t["attnres_alpha"]
    fig = native_figure(t)
    for ax, kind in zip(fig.axes[:3], ("attn", "mlp", "readout")):
        rows = alpha.isel(layer=np.flatnonzero(t["layer_kind"].values == kind))
        np.testing.assert_array_equal(ax.images[0].get_array().filled(np.nan), rows.values)
        own = plot_entries(alpha, Figure().subplots(), kind=kind)
        np.testing.assert_array_equal(own.images[0].get_array(), ax.images[0].get_array())
        assert [x.get_text() for x in ax.get_yticklabels()] == [str(v) for v in rows["layer"].values]
    assert [x.get_text() for x in fig.axes[0].get_xticklabels()][::5] == ["embed", "partial"]


def test_stream_panels_are_h_res_and_its_composite_over_depth():
    t = _bundled("hc")
    res = t["hc_res"].dropna("layer", how="all")
    fig = native_figure(t)
    n = res.sizes["layer"]
    for ax, i in zip(fig.axes, (0, n // 2, n - 1)):
        np.testing.assert_array_equal(ax.images[0].get_array(), res.isel(layer=i).values)
    composite = fig.axes[3].images[0].get_array()
    np.testing.assert_allclose(composite, stream_composite(res).values)
    assert [x.get_text() for x in fig.axes[3].texts] == [f"{v:.2f}" for v in np.ravel(composite)]
    ax = Figure().subplots()
    assert plot_stream_matrix(res.isel(layer=0), ax, title="first") is ax
    assert ax.get_title(loc="left") == "first"
    assert "composite max row sum" in fig.get_suptitle()


def test_mhc_h_res_of_the_first_and_last_sublayer_never_trains():
    """Real weights: the zoo's mHC keeps its initial H_res at 0.attn and at the last sublayer.

    At 0.attn every stream is the embedding, and after the last sublayer the read-out sums the
    streams, so a doubly stochastic H_res cannot change the output there and gets no gradient;
    every sublayer in between moved. (Init: the model built from the same config, no training.)
    """
    model, trained = _zoo_trace("mhc")
    init = capture(DepthModel(model.cfg).eval(), n_tokens=256, ctx=64)
    a, b = trained["hc_res"], init["hc_res"]
    last = [str(x) for x in a["layer"].values if str(x) != "readout"][-1]
    for layer in ("0.attn", last):
        np.testing.assert_allclose(a.sel(layer=layer).values, b.sel(layer=layer).values, atol=5e-3)
    moved = [
        str(x)
        for x in a["layer"].values
        if str(x) not in ("0.attn", last, "readout")
        and np.abs(a.sel(layer=x).values - b.sel(layer=x).values).max() > 0.05
    ]
    assert len(moved) == len(a["layer"]) - 3
