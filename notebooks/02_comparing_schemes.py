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
# # Comparing schemes
#
# Capture every checkpoint of the bundled zoo, stack the traces along a `model` dimension and
# compare how the schemes mix depth: the heatmap grid on one colour scale, contribution shares
# against the 1/T baseline, and the input-and-recent-layers pattern score.

# %%
import os

import depthscope
from depthscope import zoo
from depthscope.analysis.dilution import dilution_curves, pattern_curves, row_normalized, summary
from depthscope.figures.curves import plot_dilution, plot_pattern_scores
from depthscope.figures.heatmaps import plot_heatmap_grid
from depthscope.probes import capture
from depthscope.trace import stack_traces

TOKENS = int(os.environ.get("DEPTHSCOPE_NOTEBOOK_TOKENS", "8192"))  # the tests use fewer

# %%
traces = [capture(depthscope.load(path), n_tokens=TOKENS, checkpoint=str(path)) for path in zoo.checkpoints()]
stacked = stack_traces(traces)
print(list(stacked["model"].values))

# %% [markdown]
# ## Heatmap grid
# The plot functions draw what an estimator returns. Here the row-normalised weight
# |M[l, s]| / sum_s |M[l, s]| of every model (`row_normalized` keeps the `model` dimension): every
# consumer of a pre-norm model goes through a norm, so a row's scale is irrelevant, and a standard
# residual reads 1/n on each available cell (the 1/T baseline) whatever the scheme's read-out scale.

# %%
fig = plot_heatmap_grid(row_normalized(stacked))

# %% [markdown]
# The raw weights M: signed (DenseFormer's can be negative), so they read best on the
# symmetric-log scale of the DenseFormer paper.

# %%
fig = plot_heatmap_grid(stacked, "mixing", symlog=True)

# %% [markdown]
# ## Contribution shares on one scale
# Shares sum to 1 over each row whatever the scheme, so they compare directly.

# %%
fig = plot_heatmap_grid(stacked, "contribution_share")

# %% [markdown]
# ## Dilution curves and pattern scores
# Per consumer depth, model by model (each coloured by its scheme): the shares of the embedding,
# the first and the latest source against the 1/T baseline, and the input-and-recent pattern.

# %%
curves = dilution_curves(stacked)
ax = plot_dilution(curves)

# %%
ax = plot_pattern_scores(pattern_curves(stacked))

# %%
# one summary per model, along a `group` dimension: all sublayer inputs, attention inputs, MLP
# inputs, the read-out (DCA's q/k/v views of one attention input averaged first)
table = summary(stacked)
print(table["pattern_score"].sel(group=["sublayers", "attn", "mlp", "readout"]).to_pandas().round(3))
print(table["embed_share"].sel(group="readout").to_pandas().round(3))
