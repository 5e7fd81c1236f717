"""Shared building blocks: RMSNorm, rotary causal attention, MLP, and small helpers.

Legend: batch, pos, d_model, head, d_head, source (embedding + sublayer outputs, in order).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint


def listening(hook: HookPoint) -> bool:
    """Whether anything is attached to ``hook`` (weights are only built when someone listens)."""
    return bool(hook._forward_hooks)


EPS = 1e-6  # of every RMS normalisation


def inv_rms(x: Tensor, eps: float = EPS) -> Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dimension, kept: [..., 1].

    The one RMS helper of the package (``rms_norm``, the norms' gains, the schemes' gates and
    keys all go through it), with a one-pass backward (see ``_InvRms``).
    """
    return _InvRms.apply(x, eps)


class _InvRms(torch.autograd.Function):
    """r = (|x|^2 / d + eps)^(-1/2), with the one-pass backward dr/dx = -r^3 x / d.

    Autograd's own backward of the same formula makes three passes over its input (the
    multi-stream schemes call it on n streams per sublayer, where it shows).
    """

    @staticmethod
    def forward(ctx, x: Tensor, eps: float) -> Tensor:
        r = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.shape[-1] + eps)
        ctx.save_for_backward(x, r)
        return r

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        x, r = ctx.saved_tensors
        return x * (grad * r.pow(3) / -x.shape[-1]), None


def rms_norm(x: Tensor, eps: float = EPS) -> Tensor:
    """Weightless RMS normalisation over the last dimension."""
    return x * inv_rms(x, eps)


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain (init 1)."""

    def __init__(self, d_model: int, eps: float = EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.eps) * self.weight


def rotary_tables(ctx: int, d_head: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos/sin tables [pos, d_head/2] for rotary position embeddings (RoFormer, arXiv 2104.09864)."""
    inv = 1.0 / base ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    angles = torch.outer(torch.arange(ctx, dtype=torch.float64), inv)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (first half, second half) of the head dim; x is [batch, head, pos, d_head]."""
    n = x.shape[-2]
    cos, sin = cos[:n].to(x.dtype), sin[:n].to(x.dtype)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def causal_mask(n: int, window: int | None, device: torch.device) -> Tensor | None:
    """Boolean [pos, pos] mask (True = may attend); None means plain causal."""
    if window is None:
        return None
    i = torch.arange(n, device=device)
    diff = i[:, None] - i[None, :]
    return (diff >= 0) & (diff < window)


class Attention(nn.Module):
    """Pre-norm causal multi-head attention with rotary positions.

    Takes one input, or a (query, key, value) triple of inputs (DCA feeds three different
    depth mixes); each input goes through the same pre-norm before its own projection.
    ``window`` limits attention to the last ``window`` positions (sequence-axis ShortSWA).
    """

    def __init__(self, d_model: int, n_heads: int, ctx: int, window: int | None = None):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads, self.d_head, self.window = n_heads, d_model // n_heads, window
        if self.d_head % 2:
            raise ValueError(f"rotary positions need an even head size, got {self.d_head}")
        self.norm = RMSNorm(d_model)
        self.W_Q = nn.Linear(d_model, d_model, bias=False)
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.W_O = nn.Linear(d_model, d_model, bias=False)
        cos, sin = rotary_tables(ctx, self.d_head)
        self.register_buffer("rot_cos", cos, persistent=False)
        self.register_buffer("rot_sin", sin, persistent=False)

    def _heads(self, x: Tensor) -> Tensor:
        return rearrange(x, "batch pos (head d_head) -> batch head pos d_head", head=self.n_heads)

    def forward(self, x: Tensor | tuple[Tensor, Tensor, Tensor]) -> Tensor:
        xq, xk, xv = x if isinstance(x, tuple) else (x, x, x)
        if xk is xq and xv is xq:
            xq = xk = xv = self.norm(xq)
        else:
            xq, xk, xv = self.norm(xq), self.norm(xk), self.norm(xv)
        q = apply_rotary(self._heads(self.W_Q(xq)), self.rot_cos, self.rot_sin)
        k = apply_rotary(self._heads(self.W_K(xk)), self.rot_cos, self.rot_sin)
        v = self._heads(self.W_V(xv))
        n = q.shape[-2]
        mask = causal_mask(n, self.window, q.device)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.W_O(rearrange(z, "batch head pos d_head -> batch pos (head d_head)"))

    @property
    def out_proj(self) -> nn.Linear:
        return self.W_O


class MLP(nn.Module):
    """Pre-norm two-layer GELU MLP."""

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.norm = RMSNorm(d_model)
        self.W_in = nn.Linear(d_model, d_mlp, bias=False)
        self.W_out = nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.W_out(F.gelu(self.W_in(self.norm(x))))

    @property
    def out_proj(self) -> nn.Linear:
        return self.W_out


def init_linear(layer: nn.Linear, std: float) -> None:
    """Normal init of a Linear's weight (and zero bias)."""
    nn.init.normal_(layer.weight, 0.0, std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


def init_sublayer(module: nn.Module, n_sublayers: int) -> None:
    """GPT-2 style init: std 0.02, output projections scaled by 1/sqrt(number of sublayers)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            init_linear(m, 0.02)
    out = getattr(module, "out_proj", None)
    if out is not None:
        init_linear(out, 0.02 / math.sqrt(n_sublayers))
