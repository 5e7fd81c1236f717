# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Figures for a report or a paper
#
# The choices of `depthscope plot` from Python: the quantity (row-normalised weights, raw weights,
# contribution shares, or the departure from 1/T centred at 1), a selection of consumers and
# sources (labels, kinds, blocks, block ranges), a colour scale and a size; then PDF and SVG files.
# The data are the bundled zoo's trajectories, so nothing is captured here.

# %%
import os
from pathlib import Path

from depthscope import zoo
from depthscope.analysis.select import QUANTITIES, pick, quantity
from depthscope.figures.heatmaps import plot_heatmap
from depthscope.figures.style import save
from depthscope.trace import load_trace, select_model

OUT = Path(os.environ.get("DEPTHSCOPE_NOTEBOOK_OUT", "figures"))
OUT.mkdir(parents=True, exist_ok=True)
hc = select_model(load_trace(zoo.ZOO_DIR / "trajectories" / "hc.nc"), "hc@4000")
deep = select_model(load_trace(zoo.ZOO_DIR / "deep" / "trajectories" / "standard.nc"), "standard@2000")
for name, (short, caption) in QUANTITIES.items():
    print(f"{name:10s} {short:25s} {caption}")

# %% [markdown]
# ## The input-and-recent pattern, as a departure from 1/T
# share x n_l on a diverging scale centred at 1 (the uniform share): red cells take more than
# their 1/T share. Only the attention inputs and the read-out, in a single column's width.

# %%
da = pick(quantity(hc, "departure"), "layer", "attn,readout")
ax = plot_heatmap(da, center=1.0, figsize=(3.5, 3.0), title="HC: share x n_l")
save(ax.figure, OUT / "hc-departure", formats=("pdf", "svg"), caption=QUANTITIES["departure"][1])

# %% [markdown]
# ## A deep model by blocks, on a log scale with a fixed range
# `vmin` and `vmax` hold on every scale, so two figures can share one colour range.

# %%
ax = plot_heatmap(quantity(deep, "weights", blocks=True), log=True, vmin=1e-3, vmax=1.0, figsize=(4.5, 4.0))
save(ax.figure, OUT / "deep-weights", formats=("pdf",))
