"""Specs a user gets wrong (a write that is no view of the stream, a state named beside its own
increments, a duplicate write), models in half precision (unit, static weights near 1, per-token
weights), a batch of one, a tiny width, and a stream updated in place after a source was written.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from depthscope import ModelSpec
from tests.adversarial.harness import Case, Recorder
from tests.adversarial.research_parts import (
    CTX,
    MLP,
    VOCAB,
    CausalSelfAttention,
    D,
    NanoGPT,
    scalar,
    scramble_norms,
    weights_of,
)
from tests.adversarial.research_residual import HIGHWAY_SPEC, Highway

NANOGPT_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "h.*.attn", "mlp": "h.*.mlp"},
    reads={"attn": "h.*.ln_1", "mlp": "h.*.ln_2", "readout": "ln_f"},
)


class Logged(nn.Module):
    """A wrapper that keeps running statistics of what its module writes and returns it unchanged."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.inner(x)


def logged_nanogpt() -> NanoGPT:
    """nanoGPT with each attention wrapped in ``Logged``: the wrapper and its inner module write the
    same tensor; a spec naming both under two kinds has two identical sources."""
    model = NanoGPT(seed=50, duplicate=True)
    for b in model.h:
        b.attn = Logged(b.attn)
    return model.eval()


class DecayBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = (
            nn.LayerNorm(D),
            CausalSelfAttention(),
            nn.LayerNorm(D),
            MLP(),
        )
        self.decay = nn.Parameter(torch.ones(2))


class DecayedResidual(Recorder):
    """A residual whose carried stream is decayed before each write, x = lambda * x + f(norm(x)),
    lambda learned near 1 (0.97 .. 0.98 after training; 1 at initialisation): the
    signal-propagation literature's weighted skips (e.g. arXiv 2302.10322). Every weight is within
    a few percent of 1 but is not 1: static weights."""

    def __init__(self, n_layer: int = 2):
        super().__init__()
        torch.manual_seed(51)
        self.config = type("Config", (), {"block_size": CTX})()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.h = nn.ModuleList(DecayBlock() for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        g = torch.Generator().manual_seed(5151)
        scramble_norms(self, g)
        with torch.no_grad():
            for b in self.h:
                b.decay.copy_(0.97 + 0.01 * torch.rand(2, generator=g))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names, coef = ["embed", "embed.wpe"], {"embed": 1.0, "embed.wpe": 1.0}
        for i, b in enumerate(self.h):
            for k, (kind, norm, f) in enumerate((("attn", b.ln_1, b.attn), ("mlp", b.ln_2, b.mlp))):
                self.consumer(f"{i}.{kind}", x, names, weights_of(names, coef, x))
                y = self.source(f"{i}.{kind}", f(norm(x)))
                x = b.decay[k] * x + y
                lam = scalar(b.decay[k])
                names, coef = (
                    [*names, f"{i}.{kind}"],
                    {**{n: lam * w for n, w in coef.items()}, f"{i}.{kind}": 1.0},
                )
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.ln_f(x))


def half(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    return model.to(dtype).eval()


UNDETERMINED = r"not determined|dependent"

CASES = [
    Case(
        "an MLP's fc (4d wide) named as the write",
        "spec-mistake",
        lambda: NanoGPT(seed=52).eval(),
        ModelSpec(
            embed=["wte", "wpe"],
            writes={"attn": "h.*.attn", "mlp": "h.*.mlp.c_fc"},
            reads={"attn": "h.*.ln_1", "mlp": "h.*.ln_2", "readout": "ln_f"},
        ),
        expect="refused",
        match=r"mlp\.c_fc\b.*\b128\b",
    ),
    Case(
        "a block state named beside the increments in it",
        "spec-mistake",
        lambda: NanoGPT(states=True, seed=53).eval(),
        ModelSpec(
            embed=["wte", "wpe"],
            writes={"attn": "h.*.attn", "mlp": "h.*.mlp", "block": "h.*"},
            reads={"attn": "h.*.ln_1", "mlp": "h.*.ln_2", "readout": "ln_f"},
        ),
        expect="refused",
        match=UNDETERMINED,
    ),
    Case(
        "a wrapper and its inner module both named",
        "spec-mistake",
        logged_nanogpt,
        ModelSpec(
            embed=["wte", "wpe"],
            writes={"attn": "h.*.attn", "swa": "h.*.attn.inner", "mlp": "h.*.mlp"},
            reads={"attn": "h.*.ln_1", "mlp": "h.*.ln_2", "readout": "ln_f"},
        ),
        expect="refused",
        match=UNDETERMINED,
    ),
    Case(
        "the same write pattern listed twice",
        "spec-mistake",
        lambda: NanoGPT(seed=54).eval(),
        ModelSpec(
            embed=["wte", "wpe"],
            writes={"attn": ["h.*.attn", "h.*.attn"], "mlp": "h.*.mlp"},
            reads={"attn": "h.*.ln_1", "mlp": "h.*.ln_2", "readout": "ln_f"},
        ),
        expect="refused",
        match=r"0\.attn|twice|duplicate|dependent",
    ),
    Case(
        "bfloat16 nanoGPT, unit weights",
        "precision",
        lambda: half(NanoGPT(seed=55), torch.bfloat16),
        NANOGPT_SPEC,
    ),
    Case(
        "bfloat16 decayed residual, static weights near 1",
        "precision",
        lambda: half(DecayedResidual(), torch.bfloat16),
        NANOGPT_SPEC,
    ),
    Case(
        "float16 decayed residual, static weights near 1",
        "precision",
        lambda: half(DecayedResidual(), torch.float16),
        NANOGPT_SPEC,
    ),
    Case(
        "float16 highway gates, per-token weights",
        "precision",
        lambda: half(Highway(seed=56), torch.float16),
        HIGHWAY_SPEC,
    ),
    Case(
        "bfloat16 highway gates, per-token weights",
        "precision",
        lambda: half(Highway(seed=57), torch.bfloat16),
        HIGHWAY_SPEC,
    ),
    Case(
        "batch of one, per-token weights",
        "batch-1",
        lambda: Highway(seed=58).eval(),
        HIGHWAY_SPEC,
        shape=(1, 16),
    ),
    Case(
        "tiny width: unit weights over more sources than d",
        "tiny-d",
        lambda: NanoGPT(n_layer=6, d=8, seed=59).eval(),
        NANOGPT_SPEC,
    ),
    Case(
        "position 0's embedding zero (padding_idx=0) under per-token gates",
        "zero-write",
        lambda: Highway(padded_positions=True, seed=61).eval(),
        HIGHWAY_SPEC,
        expect="refused",
        match=UNDETERMINED,
    ),
    Case(
        "x += wpe(pos) in place into the token embedding's output",
        "in-place",
        lambda: Highway(inplace=True, seed=60).eval(),
        HIGHWAY_SPEC,
    ),
]
