"""Mixture-of-Depths Attention, MoDA (Zhu et al., arXiv 2603.15619; code hustvl/MoDA).

Each attention head attends, in one softmax, to the sequence's keys and values at its own layer
(causal) and to the *depth* keys and values that the preceding layers wrote at the query's own
position, so that features formed in shallow layers stay reachable however much the residual
stream has grown. As implemented, per head, at layer l and position t:

    s_seq(t, u) = q_l(t) . k_l(u) / sqrt(d_head)         u <= t      (rotary q, k)
    s_dep(t, j) = q_l(t) . K_j(t) / sqrt(d_head)         j < l
    (P_seq, P_dep) = softmax over both together
    head output  = sum_u P_seq(t, u) v_l(u) + sum_j P_dep(t, j) V_j(t)

The depth keys and values of block j come from its FFN side, as the paper finds best ("depth KV
from the FFN"): K_j, V_j = W_K^d n_j, W_V^d n_j, with n_j the FFN's own normed input, one
projection pair per block (blocks 0..L-2: the last block's would have no reader).

The paper reports MoDA better with post-norm than with pre-norm; ``norm="post"`` gives the
post-norm stream x_{l+1} = RMSNorm(x_l + f_l(x_l)).

Our choices where the text we could read is silent:

* the depth keys enter without rotary positions, and so does the query for them: at one position
  the rotation is the same on both sides and cancels in q . K;
* the depth KV projections are new matrices per block (not the next layer's W_K, W_V), initialised
  like the sublayers' (normal, std 0.02), and weight-decayed like them; no extra norm on the keys;
* post-norm: the norm after every write is weightless (a gain there would make the stream's
  delta-basis weights per feature; each sublayer's own pre-norm keeps its gain), and the
  sublayers keep their pre-norm (on an already normalised stream it is a learned gain);
* the read-out is the final stream, then the model's final norm, as in every scheme here.

The depth rows (``_depth_kv``): layer l's write splits into its own sequence part (block l) and
one part per block j < l (W_O of P_dep(j) V_j); the depth mass is P_dep, with the sequence's total
mass on block l, so a head's masses sum to 1.

Legend: batch, pos, d_model, head, d_head, block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from depthscope.schemes import names
from depthscope.schemes._common import MLP
from depthscope.schemes._depth_kv import (
    DepthKV,
    DepthRead,
    MemoryAttention,
    MemoryMixer,
    Mixed,
    depth_hooks,
    start,
)
from depthscope.schemes.base import Mixer, ModelConfig, NativeHook, Scheme, Site, register


@dataclass(frozen=True)
class MoDAOptions:
    """Where the stream is normalised: before each sublayer (``pre``) or after each write (``post``)."""

    norm: Literal["pre", "post"] = "pre"


class MoDAAttention(MemoryAttention):
    """One softmax over the causal sequence keys and the earlier blocks' depth keys at this position."""

    def mix(self, inp: DepthRead, q, k, q0, k0, v) -> Mixed:
        """The sequence term (block l) and one depth term per earlier block, from one softmax; writes
        nothing (the MLPs write the depth memory). Without a memory (layer 0): plain attention.
        """
        l = self.block  # noqa: E741
        if not inp.memory:
            z = self.attend(q, k, v)
            return Mixed(z, lambda: {l: z}, {l: torch.ones_like(v[..., 0])})
        keys = torch.stack([m[0] for m in inp.memory], -2)  # [batch, head, pos, block, d_head]
        dtype = torch.promote_types(q0.dtype, torch.float32)
        extra = (keys.to(dtype) @ q0.to(dtype).unsqueeze(-1)).squeeze(-1) * self.scale
        p = self.probabilities(q, k, extra)
        n = q.shape[-2]
        p_seq, p_dep = p[..., :n], p[..., n:]
        terms = {l: p_seq @ v}
        terms.update({j: p_dep[..., j, None] * m[1] for j, m in enumerate(inp.memory)})
        mass = {l: p_seq.sum(-1)}
        mass.update({j: p_dep[..., j] for j in range(len(inp.memory))})
        return Mixed(sum(terms.values()), lambda: terms, mass)


def writes_kv(cfg: ModelConfig, site: Site) -> bool:
    """Whether the sublayer writes depth keys and values: every MLP but the last block's."""
    return site.kind == names.MLP and site.block < cfg.n_layers - 1


class DepthKVMLP(MLP):
    """The MLP, also writing its block's depth keys and values from its normed input."""

    def __init__(self, d_model: int, d_mlp: int, n_heads: int):
        super().__init__(d_model, d_mlp)
        self.depth_kv = DepthKV(d_model, n_heads)

    def forward(self, inp: DepthRead) -> Tensor:  # type: ignore[override]
        """W_out gelu(W_in n) of n = Norm(x), writing (W_K^d n, W_V^d n) to the depth memory."""
        xn = self.norm(inp.x)
        inp.slot.append(self.depth_kv(xn))
        return self.W_out(F.gelu(self.W_in(xn)))


@register
class MoDA(Scheme):
    """Mixture-of-Depths Attention (arXiv 2603.15619), in a pre-norm or a post-norm stream."""

    name = "moda"
    paper = "arXiv 2603.15619: Mixture-of-Depths Attention"
    Options = MoDAOptions
    variants = {"moda": {}, "moda-post": {"norm": "post"}}
    static = {"norm": ("pre",)}  # unit stream weights; post-norm rescales the stream per token

    @classmethod
    def sublayer(cls, cfg: ModelConfig, site: Site) -> nn.Module:
        """MoDA attention; an MLP that writes its block's depth KV (none for the last block)."""
        if site.kind == names.ATTN:
            return MoDAAttention(cfg, site)
        if writes_kv(cfg, site):
            return DepthKVMLP(cfg.d_model, cfg.d_mlp, cfg.n_heads)
        return super().sublayer(cfg, site)

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool):
        """The stream x_0 with an empty depth memory (post-norm: its weights tracked when listened to)."""
        return start(x0, track, post_norm=cfg.options.norm == "post")

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer:
        """The stream (pre- or post-norm), carrying the depth memory (``MemoryMixer``)."""
        return MemoryMixer(cfg, site, memory=site.kind == names.ATTN or writes_kv(cfg, site))

    @classmethod
    def native_hooks(cls, cfg: ModelConfig) -> list[NativeHook]:
        """Every attention's depth mass and the parts of its write, by block."""
        return depth_hooks(cfg)
