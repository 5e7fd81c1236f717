"""Each paper's own parametrisation, drawn from the bundled zoo's real weights."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

import depthscope
from depthscope import zoo
from depthscope.figures.causal import plot_native
from depthscope.probes import capture
from depthscope.schemes import DepthModel


def _zoo_trace(name: str, **kw):
    model = depthscope.load(zoo.ZOO_DIR / f"{name}.safetensors")
    return model, capture(model, n_tokens=256, ctx=64, **kw)


def test_denseformer_colourbar_is_labelled_in_plain_numbers_at_the_papers_ticks():
    """The symlog colour bar reads +-1, 0.368, 0.135, 0.05 (Fig. 5), never raw mathtext strings."""
    _, trace = _zoo_trace("denseformer")
    fig = plot_native(trace)
    fig.canvas.draw()  # tick labels are formatted at draw time
    bar = fig.axes[-1]
    labels = [t.get_text() for t in bar.get_yticklabels()]
    assert labels and not any("$" in s or "mathdefault" in s for s in labels)
    ticks = bar.get_yticks()
    np.testing.assert_allclose([float(s) for s in labels], ticks, rtol=5e-3)  # "0.135" for e^-2
    assert {"1", "0.368", "0.135", "0.05", "0"} <= set(labels)
    plt.close(fig)


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
