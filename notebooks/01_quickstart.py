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
# # depthscope quickstart
#
# Load a checkpoint from the bundled zoo, capture what each layer's input is made of, and draw
# the layer-weight heatmap. Every scheme is expressed in one basis: the input of consumer `l`
# (a sublayer input, or the read-out) is `sum_s M[l, s] * v_s` over the token embedding and the
# earlier sublayer outputs.

# %%
import os

import depthscope
from depthscope import zoo
from depthscope.analysis.dilution import consumer_table, summary
from depthscope.figures.heatmaps import plot_heatmap
from depthscope.probes import capture

TOKENS = int(os.environ.get("DEPTHSCOPE_NOTEBOOK_TOKENS", "8192"))  # the tests use fewer

# %% [markdown]
# ## Load a checkpoint
# The zoo holds one small model per scheme (8 blocks, width 64), trained by depthscope itself on
# the Python standard library.

# %%
model = depthscope.load(zoo.ZOO_DIR / "attnres.safetensors")
print(model.cfg)
print(f"{model.n_params():,} parameters, validation loss {model.training_summary['val_loss']:.3f} nats/byte")

# %% [markdown]
# ## Capture a trace
# `capture` streams batches of text through the model and keeps only float64 sums, so its
# memory does not depend on the number of tokens.

# %%
trace = capture(model, n_tokens=TOKENS)
trace

# %% [markdown]
# ## The heatmap
# Rows are consumers (each sublayer input, then the read-out), columns are sources. For Attention
# Residuals every row is a softmax over depth, so it sums to 1.

# %%
ax = plot_heatmap(trace)
print("row sums:", trace["mixing"].sum("source").values.round(6))

# %% [markdown]
# ## Against the 1/T baseline
# The dilution index is a source's share times the number of available sources: 1 is exactly the
# uniform 1/T share of a standard pre-norm residual.

# %%
print(
    consumer_table(trace)
    .to_dataframe()[
        ["n_sources", "embed_share", "latest_share", "embed_index", "latest_index", "pattern_score"]
    ]
    .round(3)
)
print(summary(trace))
