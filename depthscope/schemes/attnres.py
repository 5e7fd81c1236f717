"""Attention Residuals (Kimi Team, arXiv 2603.15031), full and block.

Every attention and every MLP is a layer l with a learned pseudo-query w_l in R^d (init 0) and
its own RMSNorm on the keys. Its input is a softmax over depth (Sec. 3.1):

    h_l = sum_i alpha_{i->l} v_i,   alpha_{i->l} = softmax_i( w_l . RMSNorm_l(v_i) )

with v_0 = embedding and v_i = f_i(h_i) the (un-normalised) layer outputs; no 1/sqrt(d)
temperature. The layer itself still applies its own pre-norm, f_l(Norm(h_l)). A read-out
AttnRes (own w, own norm) mixes the sources before the final norm. With w = 0 every weight is
uniform, 1/(number of sources): an equal-weight average, not the unit-weight residual sum.

Block AttnRes (Sec. 3.2): the L layers are split into N blocks of S = L // N (the last block
takes the remainder). Sources of a layer are the embedding b_0, the sums b_1..b_{n} of completed
blocks, and, from the second layer of a block on, the partial sum of the current block. The
read-out mixes b_0 and all N block sums. N = L is Full AttnRes, computed by the same code.
In the delta basis a block's weight is shared by all of its members.

Legend: batch, pos, d_model, entry (a softmax source: embedding, block sum or partial sum),
source (embedding + sublayer outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from depthscope.errors import ConfigError
from depthscope.schemes import names
from depthscope.schemes._common import listening, rms_norm
from depthscope.schemes.base import (
    Mixer,
    ModelConfig,
    NativeHook,
    Scheme,
    Site,
    readout_site,
    register,
    sublayer_sites,
)


@dataclass(frozen=True)
class AttnResOptions:
    """Block AttnRes' number of blocks N (Sec. 3.2); None is Full AttnRes, one block per sublayer."""

    blocks: int | None = None  # number of blocks N; None = Full AttnRes (N = number of sublayers)


def n_blocks(cfg: ModelConfig) -> int:
    """The number of blocks N: the ``blocks`` option, or the number of sublayers for Full AttnRes."""
    return cfg.options.blocks or cfg.n_sublayers


def block_of(cfg: ModelConfig, index: int) -> int:
    """Block of sublayer ``index``: blocks of S = L // N, the last takes the remainder."""
    size = cfg.n_sublayers // n_blocks(cfg)
    return min(index // size, n_blocks(cfg) - 1)


@dataclass
class BlockState:
    """Completed entries (embedding, block sums) with their weightless RMS norms, and the partial sum."""

    entries: list[Tensor]
    normed: list[Tensor]
    partial: Tensor | None = None


def entry_of_source(cfg: ModelConfig, site: Site) -> list[int]:
    """For each source available at ``site``, the index of the softmax entry that holds it."""
    n_done = 1 + (block_of(cfg, site.index) if site.kind != names.READOUT else n_blocks(cfg))
    out = [0]  # the embedding is entry 0
    for s in range(site.index):  # sublayer outputs written before this consumer
        b = block_of(cfg, s)
        out.append(b + 1 if b + 1 < n_done else n_done)  # completed block, else the partial entry
    return out


class DepthAttention(Mixer):
    """Softmax over depth with a static pseudo-query (one per consumer)."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        self.cfg = cfg
        self.query = nn.Parameter(torch.zeros(cfg.d_model))  # w_l, init 0 => uniform weights
        self.key_gain = nn.Parameter(torch.ones(cfg.d_model))  # the gain of RMSNorm_l
        self.register_buffer("entry_index", torch.tensor(entry_of_source(cfg, site)), persistent=False)
        self.last_in_block = site.kind != names.READOUT and (
            site.index == cfg.n_sublayers - 1 or block_of(cfg, site.index + 1) != block_of(cfg, site.index)
        )
        self.hook_alpha = HookPoint()  # [batch, pos, entry]: the softmax over its native entries
        self.n_slots = n_blocks(cfg) + 2  # embed, the N block sums, the partial sum

    def read(self, state: BlockState) -> tuple[Tensor, BlockState]:
        """h_l = sum_i alpha_{i->l} v_i, alpha_{i->l} = softmax_i(w_l . RMSNorm_l(v_i)) (Sec. 3.1), over the
        completed entries and the current block's partial sum (Sec. 3.2); the state goes on unchanged.
        """
        values, normed = state.entries, state.normed
        if state.partial is not None:
            values, normed = values + [state.partial], normed + [rms_norm(state.partial)]
        # w . (g * rmsnorm(v)) = (w * g) . rmsnorm(v): norm each entry once, fold the gain into the query
        q = self.query * self.key_gain
        logits = torch.stack([k @ q for k in normed], dim=-1)  # [batch, pos, entry]
        alpha = logits.softmax(-1, dtype=torch.promote_types(logits.dtype, torch.float32)).to(logits.dtype)
        self.emit(lambda: alpha[..., self.entry_index])
        if listening(self.hook_alpha):
            self.hook_alpha(self._slots(alpha, state.partial is not None))
        # one product per entry rather than stacking them: no copy of every entry per consumer
        # (measured faster on CPU, forward and backward)
        h = values[0] * alpha[..., :1]
        for i, v in enumerate(values[1:], start=1):
            h = torch.addcmul(h, v, alpha[..., i : i + 1])
        return self.hook_in(h), state

    def _slots(self, alpha: Tensor, has_partial: bool) -> Tensor:
        """The softmax in fixed slots (embed, block 1..N, partial); NaN where an entry is absent."""
        out = alpha.new_full((*alpha.shape[:-1], self.n_slots), float("nan"))
        done = alpha.shape[-1] - int(has_partial)
        out[..., :done] = alpha[..., :done]
        if has_partial:
            out[..., -1] = alpha[..., -1]
        return out

    def write(self, state: BlockState, out: Tensor) -> BlockState:
        """Add the output to the block's partial sum; the block's last sublayer commits it as entry b_n."""
        partial = out if state.partial is None else state.partial + out
        if self.last_in_block:
            return BlockState(state.entries + [partial], state.normed + [rms_norm(partial)], None)
        return BlockState(state.entries, state.normed, partial)


@register
class AttnRes(Scheme):
    """Attention Residuals, full (blocks=None) or block (blocks=N); arXiv 2603.15031 Eq. 3-4."""

    name = "attnres"
    paper = "arXiv 2603.15031: Attention Residuals"
    Options = AttnResOptions
    variants = {"attnres": {}, "attnres-block4": {"blocks": 4}}

    @classmethod
    def native_hooks(cls, cfg: ModelConfig) -> list[NativeHook]:
        """Block AttnRes: the softmax over its entries (embed, block sums, partial), as the paper draws
        it (Fig. 8), kept as ``attnres_alpha`` (layer, entry). Full AttnRes' entries are its sources.
        """
        if cfg.options.blocks is None:
            return []
        return [
            NativeHook("attnres_alpha", names.mixer_hook(s.block, s.kind, "hook_alpha"), s.label, ("entry",))
            for s in [*sublayer_sites(cfg), readout_site(cfg)]
        ]

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Refuse a number of blocks N outside 1..number of sublayers."""
        n = cfg.options.blocks
        if n is not None and not 1 <= n <= cfg.n_sublayers:
            raise ConfigError(f"attnres blocks must be between 1 and {cfg.n_sublayers} (sublayers), got {n}")

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> BlockState:
        """The entries start as the embedding b_0 = h_1 (with its weightless RMS norm), no partial sum yet."""
        return BlockState([x0], [rms_norm(x0)])

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer:
        """A softmax over depth with its own pseudo-query and key norm (``DepthAttention``) for every
        consumer, read-out included.
        """
        return DepthAttention(cfg, site)
