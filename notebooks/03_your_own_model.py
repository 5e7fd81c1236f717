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
# # Reading your own model
#
# Depth mixing lives in research code: a nanoGPT fork with DenseFormer's depth-weighted average
# added, say. depthscope reads such a model without any family written for it: name the modules
# whose outputs are sources and the modules whose inputs are consumers (`ModelSpec`), and it finds
# each consumer's weights over the sources from the activations, checking on every batch that the
# input is rebuilt exactly.

# %%
import os

import torch
from torch import nn

import depthscope
from depthscope.figures.heatmaps import plot_heatmap
from depthscope.probes import capture

TOKENS = int(os.environ.get("DEPTHSCOPE_NOTEBOOK_TOKENS", "4096"))  # the tests use fewer
VOCAB, CTX, D = 256, 64, 32  # bytes: the default corpus (the Python standard library) reads as is

# %% [markdown]
# ## A model written from scratch
# nanoGPT's layout (token and position embeddings, blocks of LayerNorm, attention, LayerNorm, MLP,
# a final LayerNorm), and DenseFormer's DWA (arXiv 2402.02622) after every block: the next block
# reads a learned weighted average of the embedding and every block output so far.


# %%
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.mask = nn.Transformer.generate_square_subsequent_mask(CTX)

    def forward(self, x):
        h = self.ln_1(x)
        t = x.shape[1]
        x = x + self.attn(h, h, h, attn_mask=self.mask[:t, :t], is_causal=True, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class DenseGPT(nn.Module):
    def __init__(self, n_layer=4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
        # DWA weights: alpha[i, j] over X_0 .. X_{i+1}; the paper initialises the newest state to 1
        alpha = torch.zeros(n_layer, n_layer + 1)
        alpha[range(n_layer), range(1, n_layer + 1)] = 1.0
        self.alpha = nn.Parameter(alpha + 0.2 * torch.randn_like(alpha).tril(1))  # as if trained
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))  # wpe(...) is [T, D]
        states = [x]
        for i, block in enumerate(self.blocks):
            states.append(block(x))
            x = sum(self.alpha[i, j] * s for j, s in enumerate(states))
        return self.lm_head(self.ln_f(x))


torch.manual_seed(0)
model = DenseGPT().eval()

# %% [markdown]
# ## Where it writes and where it reads
# Sources: the two embeddings and every block's output (a whole state, kind `block`). Consumers:
# every block's input and the final norm's. `*` stands for the layer index.

# %%
spec = depthscope.ModelSpec(
    embed=["wte", "wpe"],
    writes={"block": "blocks.*"},
    reads={"block": "blocks.*", "readout": "ln_f"},
)
trace = capture(model, n_tokens=TOKENS, ctx=CTX, spec=spec, progress=False)
print("weights found:", trace.attrs["weights_found"])
print("largest rebuild error:", float(trace["residual_error"].max()))

# %% [markdown]
# The recovered weights are the model's own DWA weights (static: no spread over tokens).

# %%
row = trace["mixing"].sel(layer="2.block")
print("block 2 reads, recovered:", row.values.round(4))
print("alpha[1] of the model:    ", model.alpha[1, :3].detach().numpy().round(4))
ax = plot_heatmap(trace)

# %% [markdown]
# ## No spec at all
# A plain pre-norm decoder shaped like nanoGPT is found by discovery: the blocks are the longest
# list of one class, each norm a read and the module after it a write. Here it reads the same
# model in the basis of the sublayer outputs instead of the block states.

# %%
found = capture(model, n_tokens=TOKENS, ctx=CTX, progress=False)
print(found.attrs["spec_origin"], list(found["source"].values))
