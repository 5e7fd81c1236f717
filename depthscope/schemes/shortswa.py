"""Residual Stream Duality (Y. Zhang, arXiv 2603.16039): short sliding-window attention, ShortSWA.

The paper reads the residual stream of one token as a sequence over depth, h^(0) = embedding,
h^(l+1) = h^(l) + o_l, and shows that depth routing is attention along that axis: with the window
W_l = [h^(max(0, l-K+1)); ...; h^(l)] of K_l = min(K, l + 1) states,

    z^(l) = softmax(q k^T / sqrt(d_k)) V,   q = W_Q Norm(h^(l)),  k_j = W_K Norm(h^(j)),  V_j = h^(j) W_V,

i.e. causal short sliding-window attention over depth (K >= number of sublayers is the
full-memory variant). Its recommendation is to put ShortSWA on the sequence axis instead. Both
are options of this one scheme:

``axis="depth"`` (``window`` = K depth states). Sublayer l takes z^(l). Since W_V is linear and
shared over the window, z^(l) = u W_V with u = sum_j alpha_j h^(j); the mixer emits the mixed
state u through ``hook_in`` and then applies W_V, the consumer's value projection (mathematically
the paper's operator). u is an exact per-token scalar combination of the delta-basis sources:
source s (embed = 0, o_i = i + 1) sits in every state h^(j) with j >= s, so its weight is the sum
of alpha_j over those window states; sources older than the window have weight exactly 1.
The mixer computes u in that form, u = h^(l-K_l+1) + sum_s (sum_{j >= s} alpha_j) o_s over the
K_l - 1 most recent outputs, so the reported weights rebuild ``hook_in`` to rounding in any
dtype. Note that ``hook_in`` is u; the sublayer itself receives u W_V (W_V = I at init).
The residual sum is kept: sublayer outputs are added to the latest state as usual.
Choices (the paper is silent): one head over depth with d_k = d_model // n_heads; Norm is the
weightless RMS norm (a gain is redundant with W_Q, W_K); W_V = identity, W_Q = 0 and W_K normal
with std 0.02, so every window starts uniform (softmax of zero logits) and a window of 1 is
exactly the standard residual; the read-out is the plain final state h^(L) (weights all ones);
a consumer whose window holds one state (K_l = 1) has no W_Q, W_K.

``axis="sequence"`` (``window`` = w positions). Each block gets a third sublayer, kind ``swa``,
before its attention: S = H + ShortSWA(Norm(H); w); A = S + Attn(Norm(S)); H' = A + MLP(Norm(A)),
where ShortSWA is the model's rotary causal attention restricted to the last w positions
(the position itself included). Depth is an ordinary residual: all delta-basis weights are 1.

Native hook (depth axis), on each sublayer's mixer:
    blocks.{i}.{kind}_mix.hook_window   alpha over the window, oldest state first   [batch, pos, K_l]

Legend: batch, pos, d_model, d_k (query/key size over depth), window (the K_l depth states of a
consumer's window, oldest first), source (embedding, then sublayer outputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from depthscope.errors import ConfigError
from depthscope.schemes import names
from depthscope.schemes._common import Attention, listening, rms_norm
from depthscope.schemes.base import Mixer, ModelConfig, Scheme, Site, register
from depthscope.schemes.standard import SumMixer, SumState, ones_weights


@dataclass(frozen=True)
class ShortSWAOptions:
    """The axis ShortSWA runs over (depth or sequence) and its window: K depth states or w positions."""

    axis: Literal["depth", "sequence"] = "depth"
    window: int = 4  # depth: K states (embedding included); sequence: w positions (itself included)


@dataclass
class WindowState(SumState):
    """The running sum x = h^(l), plus the last K depth states, their RMS norms, and the last
    K - 1 sublayer outputs, oldest first.
    """

    states: list[Tensor] = field(default_factory=list)  # [batch, pos, d_model] each
    normed: list[Tensor] = field(default_factory=list)
    outputs: list[Tensor] = field(default_factory=list)


class DepthWindow(Mixer):
    """Softmax attention of one consumer over the last K depth states of its token."""

    decayed = ("W_Q", "W_K")  # projections like any attention's; W_V stays near its identity init

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        self.window = cfg.options.window  # K
        self.size = min(self.window, site.index + 1)  # K_l
        self.d_k = cfg.d_model // cfg.n_heads
        if self.size > 1:
            # W_Q = 0 makes every logit 0 (a uniform window) while W_Q still gets a gradient
            # through W_K; with both at zero neither would ever move.
            self.W_Q = nn.Parameter(torch.zeros(self.d_k, cfg.d_model))
            self.W_K = nn.Parameter(torch.randn(self.d_k, cfg.d_model) * 0.02)
        self.W_V = nn.Parameter(torch.eye(cfg.d_model))  # identity: window 1 = standard residual
        self.hook_window = HookPoint()  # [batch, pos, window]

    def read(self, state: WindowState) -> tuple[Tensor, WindowState]:
        """z^(l) = softmax(q k^T / sqrt(d_k)) V over the last K_l states: ``hook_in`` gets the depth mix
        u = sum_j alpha_j h^(j), the sublayer u W_V (K_l = 1: u = h^(l)).
        """
        if self.size == 1:
            u = state.x
            if listening(self.hook_window):
                self.hook_window(torch.ones_like(u[..., :1]))
            self.emit(lambda: ones_weights(u, state.n))
        else:
            normed = state.normed[-self.size :]  # [batch, pos, d_model] each
            # q . k_j = (W_Q n_l) . (W_K n_j) = (W_K^T W_Q n_l) . n_j: no per-state key projection
            query = (normed[-1] @ self.W_Q.T) @ self.W_K / math.sqrt(self.d_k)  # [batch, pos, d_model]
            logits = torch.stack([(n * query).sum(-1) for n in normed], dim=-1)  # [batch, pos, window]
            dtype = torch.promote_types(logits.dtype, torch.float32)
            alpha = self.hook_window(logits.softmax(-1, dtype=dtype).to(logits.dtype))
            # sum_j alpha_j h^(j) = h^(first) + sum_{s > first} (sum_{j >= s} alpha_j) o_s: the oldest
            # window state carries every older source with weight exactly 1
            tail = suffix_sums(alpha)[..., 1:]  # [batch, pos, window - 1]
            u = state.states[-self.size]
            for j, o in enumerate(state.outputs[1 - self.size :]):
                u = u + tail[..., j, None] * o
            self.emit(lambda: torch.cat([ones_weights(u, state.n - self.size + 1), tail], dim=-1))
        return self.hook_in(u) @ self.W_V, state

    def write(self, state: WindowState, out: Tensor) -> WindowState:
        """h^(l+1) = h^(l) + o_l; keep the last K states (with their RMS norms) and the last K - 1 outputs."""
        x = state.x + out
        keep = max(0, len(state.states) + 1 - self.window)  # the last K states and K - 1 outputs
        return WindowState(
            x,
            state.n + 1,
            state.states[keep:] + [x],
            state.normed[keep:] + [rms_norm(x)],
            (state.outputs + [out])[-(self.window - 1) :] if self.window > 1 else [],
        )


def suffix_sums(alpha: Tensor) -> Tensor:
    """sum_{j' >= j} alpha_j' over the last dim: the weight of the source that first appears in state j."""
    return alpha.flip(-1).cumsum(-1).flip(-1)


@register
class ShortSWA(Scheme):
    """ShortSWA over depth or over the sequence (arXiv 2603.16039, Residual Stream Duality)."""

    name = "shortswa"
    paper = "arXiv 2603.16039: Residual Stream Duality"
    Options = ShortSWAOptions
    variants = {"shortswa": {}, "shortswa-seq": {"axis": "sequence", "window": 16}}
    static = {"axis": ("sequence",)}  # depth is a plain residual there; depth windows are not static

    @classmethod
    def kinds(cls, options: ShortSWAOptions) -> tuple[names.Kind, ...]:
        """Per block: (swa, attn, mlp) over the sequence, (attn, mlp) over depth."""
        return (names.SWA, names.ATTN, names.MLP) if options.axis == "sequence" else (names.ATTN, names.MLP)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Refuse a window below 1, and a window over the sequence longer than ctx."""
        window = cfg.options.window
        if window < 1:
            raise ConfigError(f"shortswa window must be at least 1, got {window}")
        if cfg.options.axis == "sequence" and window > cfg.ctx:
            raise ConfigError(
                f"shortswa window over the sequence must be at most ctx {cfg.ctx}, got {window}"
            )

    @classmethod
    def trace_attrs(cls, cfg: ModelConfig) -> dict[str, str]:
        """Over depth, ``consumer_input``: a sublayer's row is u (``hook_in``), not the u W_V it receives."""
        if cfg.options.axis == "sequence":
            return {}
        return {
            "consumer_input": "each sublayer row is hook_in, the depth-mixed state u = sum_j alpha_j h^(j) "
            "(an exact "
            "per-token combination of the sources); the sublayer itself receives u W_V"
        }

    @classmethod
    def sublayer(cls, cfg: ModelConfig, site: Site) -> nn.Module:
        """The ``swa`` sublayer is rotary causal attention over the last w positions; the others as usual."""
        if site.kind == names.SWA:
            return Attention(cfg.d_model, cfg.n_heads, cfg.ctx, window=cfg.options.window)
        return super().sublayer(cfg, site)

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> SumState:
        """The running sum h^(0) = embedding; over depth, with the window [h^(0)] and its RMS norm."""
        if cfg.options.axis == "sequence":
            return SumState(x0, 1)
        return WindowState(x0, 1, [x0], [rms_norm(x0)])

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer:
        """Over depth a ``DepthWindow`` per sublayer; the read-out, and over the sequence every consumer,
        reads the running sum (``SumMixer``).
        """
        if cfg.options.axis == "sequence" or site.kind == names.READOUT:
            return SumMixer(cfg, site)  # the read-out takes the final state h^(L)
        return DepthWindow(cfg, site)
