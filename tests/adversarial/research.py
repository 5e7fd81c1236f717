"""Models written the way research code writes them, each a ``Case`` of the adversarial harness
(``harness.py``): its own module names, its own forward, and a record of what it really mixed.

``CASES`` gathers them: the parallel block below, then by module

* ``research_residual``: parallel residuals, ReZero, zero writes, LayerScale, U-Net skips, sandwich
  norms, residual multipliers, x0 re-injection, a functional RMS norm, value residuals, highway
  gates, mixture-of-depths, DeepNorm;
* ``research_depth``: DenseFormer, Attention Residuals, MUDDFormer-like dense connections, an
  SSM / attention hybrid, a tiny width;
* ``research_layout``: time-first streams, flattened tokens, shared layers, Meta's llama, torch's
  encoder layers, norms without modules or called by keyword, tuples, embeddings out of order,
  normed or alone;
* ``research_spec``: specs a user gets wrong, half precision, a batch of one, a tiny width, an
  in-place update.

Each case's ``expect`` is what depthscope should do (exact where the activations determine the
weights and every read is a scalar combination of the named writes; refused otherwise), not
necessarily what it does at a given commit.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from depthscope import ModelSpec
from tests.adversarial import research_depth, research_layout, research_residual, research_spec
from tests.adversarial.harness import Case, Recorder
from tests.adversarial.research_parts import MLP
from tests.adversarial.research_parts import CausalSelfAttention as Attention

VOCAB, CTX, D = 64, 16, 32


class ParallelBlock(nn.Module):
    """GPT-J / PaLM parallel block: x + attn(ln(x)) + mlp(ln(x)), one norm read by both."""

    def __init__(self):
        super().__init__()
        self.ln, self.attn, self.mlp = nn.LayerNorm(D), Attention(), MLP()


class Parallel(Recorder):
    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.wte = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(ParallelBlock() for _ in range(n_layer))
        self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed", self.wte(idx))
        names = ["embed"]
        for i, b in enumerate(self.blocks):
            h = self.consumer(f"{i}.attn", x, names, 1.0)
            n = b.ln(h)  # one norm, read by both branches
            a = self.source(f"{i}.attn", b.attn(n))
            m = self.source(f"{i}.mlp", b.mlp(n))
            x = x + a + m
            names += [f"{i}.attn", f"{i}.mlp"]
        self.consumer("readout", x, names, 1.0)
        return self.head(self.ln_f(x))


CASES = [
    Case(
        "parallel attention + MLP",
        "parallel",
        lambda: Parallel().eval(),
        ModelSpec(
            embed="wte",
            writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
            reads={"attn": "blocks.*.ln", "readout": "ln_f"},
        ),
        vocab=VOCAB,
    ),
    *research_residual.CASES,
    *research_depth.CASES,
    *research_layout.CASES,
    *research_spec.CASES,
]
