"""Deep Delta Learning (Zhang, Liu, Wang, Gu; arXiv 2601.00417), vector case d_v = 1.

The paper replaces the identity shortcut by a rank-1 delta rule (its update rule, Sec. 2):

    x_{l+1} = x_l + beta k (v - k^T x_l) = (I - beta k k^T) x_l + beta k v,

with a unit direction k in R^d, a scalar value v and a gate beta = 2 sigmoid(.) in [0, 2]. The
spectrum of (I - beta k k^T) is 1 (d - 1 times) and 1 - beta along k: beta -> 0 skips the layer,
beta = 1 erases the k-component of the stream and writes v, beta = 2 is a Householder reflection
plus the write.

Our choices where the paper is silent ("k and v from light branches"):

* k and v come from the sublayer's own output o = f(Norm(x_l)) (the usual attention or MLP
  branch): k = o / max(|o|, eps) and v = |o| (= k^T o when |o| >= eps, eps = 1e-6), so
  beta k v = beta o. The update reads
  x_{l+1} = x_l + beta (o - (k^T x_l) k): write the branch output, erase the stale component of
  the stream along it.
* beta = 2 sigmoid(w_beta . RMSNorm(x_l) + b_beta) per token, one gate per sublayer, with
  w_beta = 0 and b_beta = 0 at init, so beta = 1 exactly at init (the projection). The norm is
  weightless: a gain would be redundant with w_beta.
* The read-out is the final stream x_L, as in the standard model.

How it fits the delta basis. The model applies ``blocks.{i}.hook_{kind}_out`` to whatever the
sublayer returns, and the stream must be exactly the sum of those outputs. So the DDL sublayer
(``DeltaSublayer``, built by ``DDL.sublayer``) wraps the attention or MLP and returns the actual
increment Delta = beta k (v - k^T x) of the delta rule; its input is the stream x itself (the
mixer reads the running sum). The mixers are the standard residual's (``SumMixer``): the stream is
the unit-weight sum of the embedding and the increments, so the delta-basis weights are all ones,
exactly, and DDL's effect lives inside its increments. The wrapped branch's parameters sit under
``blocks.{i}.{kind}.branch`` and the gate under ``blocks.{i}.{kind}.gate``.

Native hooks, on the wrapped sublayer (kind = attn or mlp):
    blocks.{i}.{kind}.hook_branch   raw branch output o = f(Norm(x))   [batch, pos, d_model]
    blocks.{i}.{kind}.hook_beta     gate beta in [0, 2]                [batch, pos]
    blocks.{i}.{kind}.hook_k        unit direction k = o / |o|         [batch, pos, d_model]

Legend: batch, pos, d_model, source (embedding, then sublayer increments).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from depthscope.schemes import names
from depthscope.schemes._common import rms_norm
from depthscope.schemes.base import Mixer, ModelConfig, NativeHook, Scheme, Site, register, sublayer_sites
from depthscope.schemes.standard import SumMixer, SumState


def delta_increment(x: Tensor, k: Tensor, v: Tensor | float, beta: Tensor | float) -> Tensor:
    """Beta k (v - k^T x): the change the delta rule makes to x ([..., d_model]; v, beta [...])."""
    coef = beta * (v - (k * x).sum(-1))  # [...]
    return coef.unsqueeze(-1) * k


def delta_update(x: Tensor, k: Tensor, v: Tensor | float, beta: Tensor | float) -> Tensor:
    """The delta rule x + beta k (v - k^T x) = (I - beta k k^T) x + beta k v, for unit k."""
    return x + delta_increment(x, k, v, beta)


class Gate(nn.Module):
    """beta = 2 sigmoid(w . RMSNorm(x) + b) per token; w = 0, b = 0 at init, so beta = 1."""

    decayed = ("weight",)  # the gate's projection (dynamic) is decayed, its bias is not

    def __init__(self, d_model: int):
        super().__init__()
        # plain parameters, not nn.Linear: the model's global init re-draws every Linear of a sublayer
        self.weight = nn.Parameter(torch.zeros(d_model))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        """Beta [batch, pos] for the stream x: 2 sigmoid(w . RMSNorm(x) + b), in at least float32."""
        logit = rms_norm(x) @ self.weight + self.bias  # [batch, pos]
        dtype = torch.promote_types(logit.dtype, torch.float32)  # float32 at least (bf16 training)
        return (2 * torch.sigmoid(logit.to(dtype))).to(x.dtype)


class DeltaSublayer(nn.Module):
    """An attention or MLP branch f turned into the DDL increment beta (o - (k^T x) k), o = f(x)."""

    def __init__(self, branch: nn.Module, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.branch = branch
        self.gate = Gate(d_model)
        self.eps = eps
        self.hook_branch = HookPoint()  # [batch, pos, d_model]
        self.hook_beta = HookPoint()  # [batch, pos]
        self.hook_k = HookPoint()  # [batch, pos, d_model]

    @property
    def out_proj(self) -> nn.Linear:
        """The wrapped branch's output projection."""
        # the model's init scales the branch's output projection like any sublayer's
        return self.branch.out_proj

    def forward(self, x: Tensor) -> Tensor:
        """The increment beta k (v - k^T x) of the stream x, with o = f(x), v = |o|, k = o / max(|o|, eps)."""
        o = self.hook_branch(self.branch(x))
        beta = self.hook_beta(self.gate(x))
        v = o.norm(dim=-1)  # [batch, pos]; v = k^T o
        k = self.hook_k(o / v.clamp_min(self.eps).unsqueeze(-1))
        return delta_increment(x, k, v, beta)


@register
class DDL(Scheme):
    """Deep Delta Learning, d_v = 1 (arXiv 2601.00417, the delta-rule update of Sec. 2).

    Each sublayer's increment is beta (o - (k^T x) k) with k = o / |o| from its own output o;
    the stream stays a unit-weight sum of the increments, so the mixers are the standard ones.
    """

    name = "ddl"
    paper = "arXiv 2601.00417: Deep Delta Learning"
    static = True  # unit weights on the increments; the input-dependent gates live inside them

    @classmethod
    def sublayer(cls, cfg: ModelConfig, site: Site) -> nn.Module:
        """The attention or MLP wrapped in a ``DeltaSublayer``, which returns the delta-rule increment."""
        return DeltaSublayer(super().sublayer(cfg, site), cfg.d_model)

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> SumState:
        """The stream x_0 is the embedding, one source (the weights need no bookkeeping: all ones)."""
        return SumState(x0, 1)

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer:
        """Every consumer reads the stream x_l (``SumMixer``), and x_{l+1} = x_l + beta k (v - k^T x_l) is
        the sum plus the increment its sublayer returns.
        """
        return SumMixer(cfg, site)

    @classmethod
    def native_hooks(cls, cfg: ModelConfig) -> list[NativeHook]:
        """Token mean of each sublayer's gate, kept on that sublayer's row as ``ddl_beta``."""
        return [
            NativeHook("ddl_beta", names.sublayer_hook(s.block, s.kind, "hook_beta"), s.label)
            for s in sublayer_sites(cfg)
        ]
