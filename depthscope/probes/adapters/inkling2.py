"""Adapter for Inkling-2 in ``transformers`` (``inkling2``, ``inkling2_text``): Block Attention Residuals.

Legend: batch, pos, d_model, entry (a softmax entry: a completed block state or the partial
block), view (q, k, v: the three inputs of a full-attention layer), source (the embedding, then
every sublayer output in execution order).

What the model computes (``modeling_inkling2.py``, ``Inkling2BlockAttentionResidual``; Block
Attention Residuals, arXiv 2603.15031 Sec. 3.2). The decoder keeps a list of completed block
states b_0, b_1, ... (``block_states``) and the partial sum p of the current block (the hidden
state handed from layer to layer). Each sublayer input is a softmax over the entries
e = [b_0, ..., b_{k-1}, p], each normalised by a weightless RMSNorm, against a learned query q
(zero-initialised, float32) scaled by d^-1/2:

    input = sum_e alpha_e e / rms(e),   alpha = softmax_e( q . (e / rms(e)) / sqrt(d) ),
    rms(e) = sqrt(mean_c e_c^2 + 1e-6)

(the values are normalised too, not only the keys). Layer 0's attention has no mix: it reads the
embedding. A full-attention layer (``layer_types`` ``hybrid``) has three queries, one each for
its query, key and value inputs (``num_queries=3``), read through ``q/k/v_input_layernorm``: the
depths that queries, keys and values read differ, as DeepCrossAttention (arXiv 2502.06785)
claims they should. Every attention and MLP output then goes through a causal depthwise short
convolution with its own skip, (conv(f) + f) / sqrt(kernel + 1) (``post_attention_convolution``,
``post_mlp_convolution``), and that is what is added to the partial sum. A layer whose index is a
multiple of ``n_layers_per_attn_res_block`` is a block boundary: the partial sum it receives
becomes a block state (layer 0's: the embedding, b_0), and the partial restarts with its
attention output. The read-out (``final_input``) is one more mix over all block states and the
last partial sum, before the final norm.

How it maps to the delta basis (exact per token). Sources: the token embedding (the output of
``embed_tokens``, its RMSNorm included) and each attention and MLP output after its short
convolution (what is added to the stream). A block state or the partial sum is the plain sum of
its members, so an entry's weight alpha_e / rms(e) applies to every source it holds: a row of M
is alpha_e / rms(e) on the members of entry e (rows do not sum to 1; each member of a block
counts). Consumers, in execution order: ``{i}.attn`` (a sliding-window layer's attention input,
before ``input_layernorm``) or ``{i}.attn.q``, ``{i}.attn.k``, ``{i}.attn.v`` (a full-attention
layer's three inputs, before their norms), ``{i}.mlp`` (before ``post_attention_layernorm``) and
``readout`` (``final_input``'s output, before the final norm). Layer 0's attention rows read the
embedding with weight 1. alpha and rms are recomputed in float64 from the block states and
partial sum that a forward hook on each ``Inkling2BlockAttentionResidual`` receives, with its own
query; which sources each entry holds follows from the block boundaries. The residual identity
checks all of it on every batch.

Native: ``attnres_alpha`` (layer, entry), the token mean of the softmax weights in slots
embed (b_0), block 1 .. block K-1, partial (K: the number of block boundaries), NaN where a read
has no such entry and on layer 0's attention rows. A boundary layer's attention reads the block
just completed in the ``partial`` slot, as the model itself stacks it (it becomes a block state
only after that read). Attrs: ``block_size`` (``n_layers_per_attn_res_block``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from depthscope.probes.adapters import base as ab
from depthscope.probes.adapters.family import transformers_family
from depthscope.probes.adapters.hf import decoder_adapter, family_attrs, prefix_of, text_model
from depthscope.schemes import names

NAME = "inkling2"
MODEL_TYPES = ("inkling2", "inkling2_text")  # the multimodal config and its text config
BASE_CLASS = "Inkling2TextModel"
VIEWS = ("q", "k", "v")


@dataclass(frozen=True)
class Read:
    """One mix of the block states: which consumer rows it feeds (one per query) and, for every
    entry it stacks, the sources that entry holds (the last entry is the partial sum).
    """

    mix: str  # the module path (``layers.3.attention_input``)
    rows: tuple[str, ...]
    entries: tuple[tuple[int, ...], ...]

    @property
    def n_sources(self) -> int:
        """Sources written before the mix: its last entry holds the latest of them."""
        return 1 + max(max(held) for held in self.entries)


def _label(i: int, view: str | None = None) -> str:
    return names.label(i, names.ATTN) + (f".{view}" if view else "")


def plan(layer_types: list[str], block: int) -> tuple[list[ab.SourceSpec], list[ab.ConsumerSpec], list[Read]]:
    """Sources, consumers and every mix's entries of an Inkling-2 decoder with these layer types and
    ``n_layers_per_attn_res_block`` = ``block``, following the block boundaries as the model does.
    """
    srcs = [ab.SourceSpec(names.EMBED, names.EMBED, names.EMBED, 0)]
    cons: list[ab.ConsumerSpec] = []
    reads: list[Read] = []
    done: list[tuple[int, ...]] = []  # completed block states, as source indices
    partial: tuple[int, ...] = (0,)  # the hidden state handed on: the embedding at first
    for i, kind in enumerate(layer_types):
        full = kind != "hybrid_sliding"
        rows = tuple(_label(i, v) for v in VIEWS) if full else (_label(i),)
        depth = len(srcs)
        for row in rows:
            cons.append(
                ab.ConsumerSpec(row, f"{row}.in", names.ATTN, depth, depth, None if i == 0 else f"{row}.w")
            )
        if i > 0:
            reads.append(Read(f"layers.{i}.attention_input", rows, (*done, partial)))
        attn = len(srcs)
        srcs.append(ab.SourceSpec(names.label(i, names.ATTN), names.label(i, names.ATTN), names.ATTN, depth))
        if i % block == 0:  # a block boundary: what the layer received becomes a block state
            done, partial = [*done, partial], (attn,)
        else:
            partial = (*partial, attn)
        mlp = names.label(i, names.MLP)
        cons.append(ab.ConsumerSpec(mlp, f"{mlp}.in", names.MLP, len(srcs), len(srcs), f"{mlp}.w"))
        reads.append(Read(f"layers.{i}.mlp_input", (mlp,), (*done, partial)))
        srcs.append(ab.SourceSpec(mlp, mlp, names.MLP, len(srcs)))
        partial = (*partial, len(srcs) - 1)
    ro = names.READOUT
    cons.append(ab.ConsumerSpec(ro, f"{ro}.in", ro, len(srcs), len(srcs), f"{ro}.w"))
    reads.append(Read("final_input", (ro,), (*done, partial)))
    return srcs, cons, reads


def n_slots(n_layers: int, block: int) -> int:
    """Slots of ``attnres_alpha``: one per block boundary (b_0 .. b_{K-1}) and the partial sum."""
    return math.ceil(n_layers / block) + 1


def build(model: Any) -> ab.Adapter:
    """The adapter of an Inkling-2 model: per-token weights from the block states' softmax, q/k/v rows
    on full-attention layers, ``attnres_alpha`` kept as a native quantity.
    """
    p = prefix_of(model, BASE_CLASS, NAME)
    cfg = text_model(model, p).config
    block = int(cfg.n_layers_per_attn_res_block)
    srcs, cons, reads = plan(list(cfg.layer_types), block)
    native = [
        ab.NativeSpec("attnres_alpha", f"{row}.alpha", row, ("entry",)) for r in reads for row in r.rows
    ]
    keep = (
        "layer_types",
        "n_layers_per_attn_res_block",
        "conv_kernel_size",
        "n_routed_experts",
        "num_experts_per_tok",
    )
    attrs = family_attrs(model, cfg, keep, "attnres", block_size=block)
    vocab = int(min(cfg.vocab_size, getattr(cfg, "unpadded_vocab_size", None) or cfg.vocab_size))
    slots = n_slots(cfg.num_hidden_layers, block)
    attach = partial(_attach, p=p, layer_types=cfg.layer_types, reads=reads, slots=slots)
    equations = "block attention residuals"
    return decoder_adapter(
        model, cfg, NAME, srcs, cons, attrs, equations, vocab=vocab, native=native, attach=attach
    )


def entry_weights(module: Any, block_states: Tensor, partial: Tensor) -> tuple[Tensor, Tensor]:
    """A mix's softmax alpha [batch, pos, query, entry] and each entry's RMS [batch, pos, entry], in
    float64 from what the module stacks (its block states and partial sum) and its own queries.
    """
    stacked = torch.cat([block_states, partial.unsqueeze(-2)], dim=-2).double()
    d = stacked.shape[-1]
    rms = torch.sqrt(torch.linalg.vector_norm(stacked, dim=-1).square() / d + module.norm.eps)
    query = module.query.double().view(-1, d)
    # query . (v_e / rms_e) as (query . v_e) / rms_e: the normalised keys are never materialised
    logits = torch.einsum("bped,qd->bpqe", stacked, query) / (rms.unsqueeze(-2) * math.sqrt(d))
    return torch.softmax(logits, dim=-1), rms


def delta_weights(alpha: Tensor, rms: Tensor, entries: tuple[tuple[int, ...], ...], n: int) -> Tensor:
    """Per-token weights [batch, pos, query, n] over the first n sources: alpha_e / rms(e) on every
    member of entry e.
    """
    member = torch.zeros(len(entries), n, dtype=alpha.dtype, device=alpha.device)
    for e, held in enumerate(entries):
        member[e, list(held)] = 1.0
    return torch.einsum("bpqe,en->bpqn", alpha / rms.unsqueeze(-2), member)


def _slots(alpha: Tensor, slots: int) -> Tensor:
    """The softmax [.., entry] in fixed slots (block states first, the partial sum last); NaN elsewhere."""
    out = alpha.new_full((*alpha.shape[:-1], slots), float("nan"))
    out[..., : alpha.shape[-1] - 1] = alpha[..., :-1]
    out[..., -1] = alpha[..., -1]
    return out


def _mix_hook(send: Callable[[str, Any], Any], read: Read, slots: int) -> ab.Hook:
    def hook(module, args, out) -> None:
        alpha, rms = entry_weights(module, args[0], args[1])
        w = delta_weights(alpha, rms, read.entries, read.n_sources)
        for q, row in enumerate(read.rows):
            send(f"{row}.w", w[:, :, q])
            send(f"{row}.alpha", _slots(alpha[:, :, q], slots))

    return hook


def _input_taps(p: str, layer_types: list[str]) -> list[tuple[str, str]]:
    """(consumer row, ``path:in``): the input of the norm each consumer's input goes through."""
    out = []
    for i, kind in enumerate(layer_types):
        layer = f"{p}layers.{i}"
        if kind == "hybrid_sliding":
            out.append((_label(i), f"{layer}.input_layernorm:in"))
        else:
            out += [(_label(i, v), f"{layer}.{v}_input_layernorm:in") for v in VIEWS]
        out.append((names.label(i, names.MLP), f"{layer}.post_attention_layernorm:in"))
    return [*out, (names.READOUT, f"{p}norm:in")]


@contextlib.contextmanager
def _attach(
    model: Any,
    taps: list[tuple[str, ab.Callback]],
    p: str,
    layer_types: list[str],
    reads: list[Read],
    slots: int,
):
    send = ab.router(taps)
    hooks: list[tuple[str, ab.Hook]] = [(f"{p}embed_tokens", ab.output_hook(send, names.EMBED))]
    for i in range(len(layer_types)):
        for kind, conv in ((names.ATTN, "post_attention_convolution"), (names.MLP, "post_mlp_convolution")):
            hooks.append((f"{p}layers.{i}.{conv}", ab.output_hook(send, names.label(i, kind))))
    hooks += [(f"{p}{r.mix}", _mix_hook(send, r, slots)) for r in reads]
    inputs = [(path, ab.relay(send, f"{row}.in")) for row, path in _input_taps(p, layer_types)]
    with ab.forward_hooks(model, hooks), ab.module_attach(model, inputs):
        yield


FAMILY = transformers_family(
    NAME,
    (
        "transformers inkling2 (Block AttnRes, weightless RMSNorm on keys and values): softmax over "
        "block states "
        ""
        "recomputed from each mix's inputs; M = alpha_e / rms(e) on entry e's members; q/k/v rows on "
        "full layers"
    ),
    MODEL_TYPES,
    BASE_CLASS,
    build,
)
