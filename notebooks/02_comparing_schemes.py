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
# Capture every checkpoint of the bundled zoo, stack the traces along a `scheme` dimension and
# compare how the schemes mix depth: the heatmap grid on one colour scale, contribution shares
# against the 1/T baseline, and the input-and-recent-layers pattern score.

# %%
import os

import depthscope
from depthscope import zoo
from depthscope.analysis.dilution import summary
from depthscope.figures.curves import dilution_curves, pattern_scores
from depthscope.figures.heatmaps import heatmap_grid
from depthscope.probes import capture
from depthscope.probes.trace import select_scheme, stack_traces

TOKENS = int(os.environ.get("DEPTHSCOPE_NOTEBOOK_TOKENS", "8192"))  # the tests use fewer

# %%
traces = [capture(depthscope.load(path), n_tokens=TOKENS, checkpoint=str(path)) for path in zoo.checkpoints()]
stacked = stack_traces(traces)
print(list(stacked["scheme"].values))

# %% [markdown]
# ## Heatmap grid
# Signed weights (DenseFormer's can be negative) read best on the symmetric-log scale of the
# DenseFormer paper.

# %%
fig = heatmap_grid(stacked, "mixing", symlog=True)

# %% [markdown]
# ## Contribution shares on one scale
# Shares sum to 1 over each row whatever the scheme, so they compare directly.

# %%
fig = heatmap_grid(stacked, "contribution_share")

# %% [markdown]
# ## Dilution curves and pattern scores

# %%
ax = dilution_curves(stacked)

# %%
ax = pattern_scores(stacked)

# %%
rows = {label: summary(select_scheme(stacked, label)) for label in stacked["scheme"].values}
for label, s in rows.items():
    print(f"{label:16s} pattern {float(s['pattern_score']):6.3f}   read-out embedding share {float(s['readout_embed_share']):6.3f}")
