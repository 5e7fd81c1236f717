"""Depth-Attention (arXiv 2606.05014): before a layer attends over the sequence, its query
attends over the keys that the earlier layers computed at the same position, and mixes their
values into the value that self-attention then reads. No parameters, no state beyond the KV cache.

As implemented, per head, at layer l and position t (q, k, v the layer's own projections of its
normed input; k_j, v_j those layer j computed at t):

    alpha_{l,j}(t) = softmax_j( q_l(t) . k_j(t) / sqrt(d_head) ),    j = 0..l
    v'_l(t)        = sum_j alpha_{l,j}(t) v_j(t)
    out_l          = W_O  CausalAttention(q_l, k_l, v'_l)

Our choices where the text is silent:

* the depth softmax runs over the earlier layers *and the layer itself* (j = 0..l), so layer 0 is
  plain attention and every layer can keep its own value (alpha = 1 on itself); the mix is convex;
* the depth scores use the keys and query before the rotary positions are applied: at one
  position the rotation is the same on both sides and cancels in the dot product;
* the sequence attention reads the layer's own keys; only its values are mixed over depth;
* the residual stream is the standard pre-norm one (the paper's Qwen3-style decoders), so every
  consumer's stream weights are 1, and the depth mixing lives inside attention.

The depth rows (``_depth_kv``): layer l's write splits into one part per layer j <= l, W_O of
P (alpha_j v_j) with P the sequence attention; the depth mass is alpha.

Legend: batch, pos, d_model, head, d_head, block.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from depthscope.schemes import names
from depthscope.schemes._depth_kv import DepthRead, MemoryAttention, MemoryMixer, Mixed, depth_hooks, start
from depthscope.schemes.base import Mixer, ModelConfig, NativeHook, Site, register
from depthscope.schemes.standard import Standard


class DepthValueAttention(MemoryAttention):
    """Self-attention over values mixed across depth by the query's attention over earlier keys."""

    def mix(self, inp: DepthRead, q, k, q0, k0, v) -> Mixed:
        """Attention over v' = sum_j alpha_j v_j (j <= l), whose terms are P (alpha_j v_j); writes
        this layer's (k0, v).
        """
        keys = torch.stack([m[0] for m in inp.memory] + [k0], -2)  # [batch, head, pos, block, d_head]
        values = [m[1] for m in inp.memory] + [v]
        dtype = torch.promote_types(q0.dtype, torch.float32)
        scores = (keys.to(dtype) @ q0.to(dtype).unsqueeze(-1)).squeeze(-1) * self.scale
        alpha = torch.softmax(scores, -1).to(v.dtype)  # [batch, head, pos, block]
        mixed = sum(alpha[..., j, None] * vj for j, vj in enumerate(values))

        def terms() -> dict[int, Tensor]:
            return self.attend_each(q, k, {j: alpha[..., j, None] * vj for j, vj in enumerate(values)})

        z = self.attend(q, k, mixed)
        return Mixed(z, terms, {j: alpha[..., j] for j in range(len(values))}, (k0, v))


@register
class DepthAttention(Standard):
    """Depth-Attention (arXiv 2606.05014): values mixed over earlier layers by the query, then attended.

    The stream is the standard one (unit weights, static); the depth mixing lives inside attention.
    """

    name = "depth-attention"
    paper = "arXiv 2606.05014: Depth-Attention"

    @classmethod
    def sublayer(cls, cfg: ModelConfig, site: Site) -> nn.Module:
        """Attention reads the earlier layers' keys and values at its position; the MLP is standard."""
        if site.kind == names.ATTN:
            return DepthValueAttention(cfg, site)
        return super().sublayer(cfg, site)

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool):
        """The stream x_0 with an empty depth memory."""
        return start(x0, track)

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer:
        """The running sum, carrying the depth memory (``MemoryMixer``)."""
        return MemoryMixer(cfg, site, memory=site.kind == names.ATTN)

    @classmethod
    def native_hooks(cls, cfg: ModelConfig) -> list[NativeHook]:
        """Every attention's depth mass (alpha) and the parts of its write, by layer."""
        return depth_hooks(cfg)
