"""Value residual learning (ResFormer; Zhou et al., arXiv 2410.17897), and the x0 lambdas of the
2025-26 speedrun code (modded-nanogpt, nanochat).

ResFormer keeps the residual stream and adds a residual path between the *values* of attention:
every layer after the first attends over a mix of its own values and the first layer's,

    V'_l = lambda_1 V_l + lambda_2 V_1          (l >= 2 in the paper's 1-based count)

so that the first layer's token representations reach every layer directly, whatever the stream
has piled on since. The first layer's values V_1 = W_V^1 Norm(x_0) are computed from the
embedding alone.

The x0 variant (``mode="x0"``) re-injects the embedding into the stream instead, at the start of
every block, with learned scalars as in modded-nanogpt's ``x = lambdas[0] * x + lambdas[1] * x0``:

    x <- a_l x + b_l x_0                        (before block l's attention reads it)

Our choices where the texts are silent:

* lambda_1 and lambda_2 are learned scalars per layer, both initialised to 0.5 (the paper's fixed
  value; its learnable variant starts there); not weight-decayed, like every scalar here.
* the values are mixed before the rotary attention reads them, per head (all heads share the two
  lambdas); the first layer writes V_1 to the depth memory (``_depth_kv``), later layers read it.
* x0 variant: a_l = 1, b_l = 0 at init, so the model starts as the standard residual exactly; the
  re-injection happens at every block, block 0 included (where it scales the embedding by a + b).
  The delta-basis weights are then static: a running product of the a's on everything written
  before, plus the b's on the embedding.

The depth rows (``_depth_kv``): at layer l the attention's write splits into the part through its
own values (lambda_1 V_l, block l) and the part through the first layer's (lambda_2 V_1, block 0);
the depth mass holds lambda_1 at block l and lambda_2 at block 0 (layer 0: 1 on itself).

Legend: batch, pos, d_model, head, d_head, source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from depthscope.schemes import names
from depthscope.schemes._depth_kv import DepthRead, MemoryAttention, MemoryMixer, Mixed, depth_hooks, start
from depthscope.schemes.base import Mixer, ModelConfig, NativeHook, Scheme, Site, register


@dataclass(frozen=True)
class ValueResidualOptions:
    """``value``: the first layer's values mixed into every attention's (ResFormer); ``x0``: the
    embedding re-injected into the stream before every block (the speedrun's x0 lambdas).
    """

    mode: Literal["value", "x0"] = "value"


class ValueResidualAttention(MemoryAttention):
    """Attention over V'_l = lambda_1 V_l + lambda_2 V_1 (layer 0: its own values, which it writes)."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        if site.block > 0:
            self.lambdas = nn.Parameter(torch.full((2,), 0.5))  # (lambda_1, lambda_2)

    def mix(self, inp: DepthRead, q, k, q0, k0, v) -> Mixed:
        """Layer 0: attention over V_0, which it writes; layer l: over lambda_1 V_l + lambda_2 V_0,
        whose terms are P (lambda_1 V_l) and P (lambda_2 V_0).
        """
        l = self.block  # noqa: E741
        ones = torch.ones_like(v[..., 0])
        if l == 0:
            z = self.attend(q, k, v)
            return Mixed(z, lambda: {0: z}, {0: ones}, v)
        lam = self.lambdas.to(v.dtype)
        (v0,) = inp.memory

        def terms() -> dict[int, Tensor]:
            return self.attend_each(q, k, {l: lam[0] * v, 0: lam[1] * v0})

        z = self.attend(q, k, lam[0] * v + lam[1] * v0)
        return Mixed(z, terms, {l: lam[0] * ones, 0: lam[1] * ones})


class X0Mixer(Mixer):
    """Before block l's attention: x <- a_l x + b_l x_0 (a = 1, b = 0 at init); then the running sum."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        self.reinject = site.kind == names.ATTN
        if self.reinject:
            self.a = nn.Parameter(torch.ones(()))
            self.b = nn.Parameter(torch.zeros(()))

    def read(self, state: X0State) -> tuple[Tensor, X0State]:
        """The stream, re-injected first at an attention; its static weights when tracked."""
        if self.reinject:
            a, b = self.a.to(state.x.dtype), self.b.to(state.x.dtype)
            w = torch.cat([state.w[:1] * a + b, state.w[1:] * a])
            state = X0State(a * state.x + b * state.x0, state.n, state.x0, w)
        self.emit(lambda: state.w.expand(*state.x.shape[:-1], state.n))
        return self.hook_in(state.x), state

    def write(self, state: X0State, out: Tensor) -> X0State:
        """The output joins the stream with weight 1."""
        return X0State(state.x + out, state.n + 1, state.x0, torch.cat([state.w, state.w.new_ones(1)]))


@dataclass(frozen=True)
class X0State:
    """The stream, its number of sources, the embedding and the sources' weights [n]."""

    x: Tensor
    n: int
    x0: Tensor
    w: Tensor


@register
class ValueResidual(Scheme):
    """Value residual learning (arXiv 2410.17897), and the x0 lambdas of the speedrun code."""

    name = "value-residual"
    paper = "arXiv 2410.17897: Value Residual Learning"
    Options = ValueResidualOptions
    variants = {"value-residual": {}, "value-residual-x0": {"mode": "x0"}}
    static = True  # unit stream weights (value) or learned scalars (x0); the value mix is in attention

    @classmethod
    def sublayer(cls, cfg: ModelConfig, site: Site) -> nn.Module:
        """ResFormer's attention reads the first layer's values; the x0 variant's sublayers are standard."""
        if cfg.options.mode == "value" and site.kind == names.ATTN:
            return ValueResidualAttention(cfg, site)
        return super().sublayer(cfg, site)

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool):
        """The stream x_0 (with the depth memory, or with the embedding kept for re-injection)."""
        if cfg.options.mode == "value":
            return start(x0, track)
        return X0State(x0, 1, x0, x0.new_ones(1))

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer:
        """The running sum, carrying the memory (value) or re-injecting the embedding (x0)."""
        if cfg.options.mode == "value":
            return MemoryMixer(cfg, site, memory=site.kind == names.ATTN)
        return X0Mixer(cfg, site)

    @classmethod
    def native_hooks(cls, cfg: ModelConfig) -> list[NativeHook]:
        """ResFormer: every attention's depth mass and the parts of its write (``_depth_kv``)."""
        return depth_hooks(cfg) if cfg.options.mode == "value" else []
