"""Depth memory inside attention: what MoDA, Depth-Attention and the value residual share.

These schemes keep a plain residual stream (MoDA may renormalise it after every write, post-norm)
and move the depth mixing into attention: an attention layer reads keys and values that earlier
layers wrote at the same position, their *depth memory*. The stream's delta basis is the standard
one (or post-norm's per-token 1/rms products), so every consumer input is still exactly a weighted
sum of the sources; what this module adds is the second, inner route from a layer to a later one.

How the memory travels. The mixer (``MemoryMixer``) of a sublayer that reads or writes the memory
hands it a ``DepthRead``: the stream x (after ``hook_in``), the memory written so far, and a fresh
``slot`` the sublayer fills with what it adds to the memory (other sublayers get x itself); the
mixer's ``write`` appends the slot to the memory of the next state. No state is changed in place.

How an attention output splits. The head outputs are a sum of terms, one per block whose keys or
values they read: the block's own sequence attention is its own block's term. W_O is linear, so W_O
applied to each term gives the parts of the attention's write, which add up to the write exactly
(in exact arithmetic; to rounding in floating point). The output itself comes from the fused
attention kernel where the scheme allows (the value residual, Depth-Attention: attention over the
mixed values); the terms are formed apart, only when something listens (one attention call over
every block's values side by side, ``attend_each``), so that the check below compares two
computations.
Three hooks carry them:

    blocks.{i}.attn.hook_terms       [batch, pos, block, (head d_head)]  the terms of the head outputs
                                     by block, before W_O (NaN for a block the layer does not read)
    blocks.{i}.attn.hook_parts       [batch, pos, block, d_model]  the parts of the write: W_O of each
                                     term (NaN likewise)
    blocks.{i}.attn.hook_depth_mass  [batch, pos, head, block]     the weight each block's memory gets
                                     in each head (attention mass; the value residual's lambdas)

The probe listens to the terms and checks on every batch that W_O of their sum is the write
(``NativeHook.parts_of``, ``project``); it keeps, per part, the token mean of <part, write> =
<term, W_O^T write> (``depth_write``) beside that of |write|^2 (``depth_write_total``): their ratio is
the part's share of the write. Mapping the write back once costs one product per layer where
forming every part costs one per block read.

Legend: batch, pos, d_model, head, d_head, block (a block's index: whose memory a part came through).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from depthscope.schemes import names
from depthscope.schemes._common import Attention, apply_rotary, inv_rms, listening
from depthscope.schemes.base import Mixer, ModelConfig, NativeHook, Site, sublayer_sites
from depthscope.schemes.standard import ones_weights


@dataclass(frozen=True)
class DepthRead:
    """A sublayer's input in a depth-memory scheme: the stream, the memory, and the slot it writes to."""

    x: Tensor  # [batch, pos, d_model], after the consumer's hook_in
    memory: tuple[Any, ...]  # what earlier sublayers wrote, in execution order
    slot: list  # filled by the sublayer with what it adds to the memory


@dataclass(frozen=True)
class MemoryState:
    """The stream, its number of sources, the depth memory and, when tracked, the stream's weights.

    ``w`` [batch, pos, n] is None where every weight is 1 (the pre-norm stream) or nobody listens.
    ``pending`` is the ``DepthRead`` handed to the sublayer between the mixer's read and its write.
    """

    x: Tensor
    n: int
    memory: tuple[Any, ...] = ()
    w: Tensor | None = None
    post_norm: bool = False
    track: bool = False
    pending: DepthRead | None = None


def start(x0: Tensor, track: bool, post_norm: bool = False) -> MemoryState:
    """The state after the embedding: one source, an empty memory; post-norm tracks its weights."""
    w = torch.ones(*x0.shape[:-1], 1, dtype=x0.dtype, device=x0.device) if post_norm and track else None
    return MemoryState(x0, 1, (), w, post_norm, track)


class MemoryMixer(Mixer):
    """Reads the stream and hands the sublayer a ``DepthRead``; writes x + out and the memory.

    Pre-norm: x_{l+1} = x_l + out, every weight 1. Post-norm: x_{l+1} = (x_l + out) / rms(x_l + out),
    weightless, so every earlier source's weight is multiplied by the same per-token 1/rms (the
    delta-basis weights are per token, exact).
    """

    def __init__(self, cfg: ModelConfig, site: Site, memory: bool):
        super().__init__(cfg, site)
        self.memory = memory  # whether the sublayer reads or writes the depth memory

    def read(self, state: MemoryState) -> tuple[Any, MemoryState]:
        """The stream x_l; for a sublayer of the memory, wrapped with the memory and an empty slot."""
        self.emit(lambda: state.w if state.w is not None else ones_weights(state.x, state.n))
        x = self.hook_in(state.x)
        if not self.memory:
            return x, replace(state, pending=None)
        inp = DepthRead(x, state.memory, [])
        return inp, replace(state, pending=inp)

    def write(self, state: MemoryState, out: Tensor) -> MemoryState:
        """The output joins the stream as one more source; what the sublayer wrote joins the memory."""
        x = state.x + out
        memory = state.memory + tuple(state.pending.slot) if state.pending else state.memory
        w = state.w
        if state.post_norm:
            r = inv_rms(x)
            x = x * r
            if state.track:
                w = torch.cat([w, torch.ones_like(w[..., :1])], -1) * r
        return MemoryState(x, state.n + 1, memory, w, state.post_norm, state.track)


@dataclass(frozen=True)
class Mixed:
    """What one attention over depth computed: the head outputs ``z`` [batch, head, pos, d_head];
    ``terms()``, their terms by block {block: [batch, head, pos, d_head]}, formed on demand (for
    the parts of the write) apart from z; the depth mass {block: [batch, head, pos]}; what the layer
    adds to the memory, or None.
    """

    z: Tensor
    terms: Callable[[], dict[int, Tensor]]
    mass: dict[int, Tensor]
    written: Any = None


class MemoryAttention(Attention, abc.ABC):
    """Causal rotary attention whose head outputs are a sum of per-block terms (``terms``).

    ``mix`` gives the head outputs, their term of every block read (on demand), its depth mass and
    what the layer adds to the memory; q, k are rotated, q0, k0 not (at one position the rotation
    cancels in q . k, so depth scores use q0 . k0).
    """

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg.d_model, cfg.n_heads, cfg.ctx)
        self.block, self.n_blocks = site.block, cfg.n_layers
        self.scale = 1.0 / math.sqrt(self.d_head)
        self.hook_depth_mass = HookPoint()  # [batch, pos, head, block]
        self.hook_terms = HookPoint()  # [batch, pos, block, (head d_head)]
        self.hook_parts = HookPoint()  # [batch, pos, block, d_model]

    def forward(self, inp: DepthRead) -> Tensor:  # type: ignore[override]
        """W_O of the head outputs; the parts and the depth mass to their hooks when listened to."""
        x = self.norm(inp.x)
        q0, k0, v = self._heads(self.W_Q(x)), self._heads(self.W_K(x)), self._heads(self.W_V(x))
        q = apply_rotary(q0, self.rot_cos, self.rot_sin)
        k = apply_rotary(k0, self.rot_cos, self.rot_sin)
        mixed = self.mix(inp, q, k, q0, k0, v)
        if mixed.written is not None:
            inp.slot.append(mixed.written)
        if listening(self.hook_depth_mass):
            self.hook_depth_mass(self._by_block(mixed.mass, "batch head pos block -> batch pos head block"))
        if listening(self.hook_terms) or listening(self.hook_parts):  # formed apart from z: checked
            terms = self.hook_terms(self._terms(mixed.terms()))
            if listening(self.hook_parts):
                self.hook_parts(self.W_O(terms))
        return self.W_O(rearrange(mixed.z, "batch head pos d_head -> batch pos (head d_head)"))

    def _terms(self, terms: dict[int, Tensor]) -> Tensor:
        """Each block's term, heads merged, [batch, pos, block, (head d_head)], NaN for a block not
        read (W_O maps a NaN term to a NaN part).
        """
        like = next(iter(terms.values()))
        out = like.new_empty((like.shape[0], like.shape[2], self.n_blocks, self.W_O.in_features))
        for j in range(self.n_blocks):
            if j in terms:
                out[:, :, j] = rearrange(terms[j], "batch head pos d_head -> batch pos (head d_head)")
            else:
                out[:, :, j] = float("nan")
        return out

    @abc.abstractmethod
    def mix(self, inp: DepthRead, q, k, q0, k0, v) -> Mixed:
        """The head outputs, their terms by block and the depth mass (``Mixed``)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Causal attention of q over (k, v) [batch, head, pos, d_head] (the fused kernel)."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def attend_each(self, q: Tensor, k: Tensor, values: dict[int, Tensor]) -> dict[int, Tensor]:
        """Causal attention of q over k with each of ``values`` by block: one call over the values
        joined on their last axis (attention is linear in its values). PyTorch picks the kernel; on
        CPU, values wider than the queries take its unfused one, measured here as fast as writing
        the probabilities out and multiplying each value.
        """
        out = self.attend(q, k, torch.cat(list(values.values()), -1))
        return dict(zip(values, out.split(q.shape[-1], -1)))

    def _by_block(self, per_block: dict[int, Tensor], pattern: str) -> Tensor:
        """The per-block tensors stacked on a block axis of every block (NaN where a block is not read)."""
        like = next(iter(per_block.values()))
        out = like.new_full((*like.shape[:3], self.n_blocks, *like.shape[3:]), float("nan"))
        for j, t in per_block.items():
            out[:, :, :, j] = t
        return rearrange(out, pattern)

    def probabilities(self, q: Tensor, k: Tensor, extra: Tensor | None = None) -> Tensor:
        """Causal softmax over the sequence scores q . k / sqrt(d_head) [batch, head, pos, pos], joined
        (one softmax) with ``extra`` scores [batch, head, pos, m] when given: [..., pos + m].
        In at least float32, returned in q's dtype.
        """
        n = q.shape[-2]
        dtype = torch.promote_types(q.dtype, torch.float32)
        scores = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * self.scale
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        if extra is not None:
            scores = torch.cat([scores, extra.to(dtype)], -1)
        return F.softmax(scores, dim=-1).to(q.dtype)


def depth_hooks(cfg: ModelConfig) -> list[NativeHook]:
    """Every attention's depth mass (``depth_mass`` (layer, head, depth)) and the parts of its write
    (``depth_write`` (layer, depth), from the terms before W_O, checked to add up to the write, with
    ``depth_write_total``).
    """
    out = []
    for s in sublayer_sites(cfg):
        if s.kind == names.ATTN:
            mass = names.sublayer_hook(s.block, s.kind, "hook_depth_mass")
            terms = names.sublayer_hook(s.block, s.kind, "hook_terms")
            project = names.sublayer_hook(s.block, s.kind, "W_O")
            out.append(NativeHook("depth_mass", mass, s.label, ("head", "depth")))
            out.append(
                NativeHook("depth_write", terms, s.label, ("depth",), parts_of=s.label, project=project)
            )
    return out


def heads(x: Tensor, n_heads: int) -> Tensor:
    """[batch, pos, (head d_head)] -> [batch, head, pos, d_head]."""
    return rearrange(x, "batch pos (head d_head) -> batch head pos d_head", head=n_heads)


class DepthKV(nn.Module):
    """A linear key and value projection of a sublayer's normed input (MoDA's depth KV), per head."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)

    def forward(self, xn: Tensor) -> tuple[Tensor, Tensor]:
        """(keys, values) [batch, head, pos, d_head] of the normed input ``xn``."""
        return heads(self.W_K(xn), self.n_heads), heads(self.W_V(xn), self.n_heads)
