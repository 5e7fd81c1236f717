"""Adapter for lucidrains' ``deep-cross-attention`` (``DCAGPT``): DeepCrossAttention, arXiv 2502.06785.

What the package computes (``deep_cross_attention/dca_gpt.py``, 0.1.1). The model keeps a stack
of block outputs G = [x_0, f_0, f_1, ...]: the token embedding x_0 and each block's output
f_j = attn_out_j + ff_out_j (no residual inside the stack: deltas). Block i reads
``select_layers(G[:i + 1])``: the whole stack while it holds fewer than 2k entries, else its
first k and its last k entries (k = ``past_layers_k``). A GRN (the paper's GRN-v3, Sec. 3) with
``num_outputs`` o builds its outputs from the y selected entries g_y:

    out_o = sum_y c[o, y] (*) g_y,   c[o, y, d] = act(w_o . RMSNorm(g_y)) + b[o, y, d]

with ``to_aggregate`` = RMSNorm (with gain) -> Linear(d, o, no bias) -> act (ReLU by default),
giving the dynamic scalar per (o, y, token), and ``bias`` [o, y, d] the static per-channel part
(init 1). A block's GRN has o = 3 outputs, the attention's q, k and v inputs; the q output is
also the block's residual: the feed-forward reads RMSNorm(attn_out + q). The read-out is a
one-output GRN (``final_grn``) over the selected stack, followed by the final norm.

Delta basis. Sources: ``embed``, then ``{j}.attn`` and ``{j}.mlp`` of every block (the two parts
of f_j). A stack entry's weight applies to each of its sources: the embedding entry to
``embed``, block j's entry to ``{j}.attn`` and ``{j}.mlp`` alike (as ``depthscope.schemes.dca``
does). A source whose block is not selected (dropped by ``select_layers``) has weight 0 at that
consumer, not NaN: it was written before, the GRN just does not read it. Consumers, in order:
``{i}.attn.q``, ``{i}.attn.k``, ``{i}.attn.v`` (the inputs of the attention's ``to_q``/``to_k``/
``to_v``), ``{i}.mlp`` (the input of ``pre_ff_norm``: the q weights plus 1 on ``{i}.attn``), and
``readout`` (the final GRN's output). Every weight is per feature, [batch, pos, source, d_model],
handed to the engine in its two parts (``probes.terms.Split``: the static bias and the per-token
gate, never formed whole; the q view and its block's MLP share them); ``mixing`` is its mean over
features.

Native quantities (entry = the position in the selected stack, 0..y-1; padded with NaN up to the
longest stack):

* ``grn_weight`` (layer, entry): token mean of the dynamic part act(w_o . RMSNorm(g_y)), read from
  the output of ``to_aggregate`` (the package's own computation), per consumer view;
* ``grn_bias`` (layer, entry), static: the channel mean of ``bias[o, y]``;
* ``grn_stack`` (layer, entry), static: which stack entry the position holds (0 = embedding,
  j + 1 = block j), so the ``select_layers`` choice is visible.
The MLP rows carry no native GRN values (their weights are the q view's).

Where the package departs from the paper, the trace follows the package: the paper's k-DCA sums
the outputs older than the last k into one entry (``depthscope.schemes.dca``), the package drops
the middle of the stack instead, so those sources read 0. The dynamic part is read, not
recomputed, so a non-default ``grn_activation`` is captured as it is. ``DCAGPT`` has rotary
positions and no context limit; the adapter states ``CTX`` tokens.

Legend: batch, pos, d_model, entry (a selected stack entry), source (embedding + sublayer outputs),
view (q, k, v).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import Any

import numpy as np
import torch
from torch import Tensor

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters import base as ab
from depthscope.probes.adapters.family import package_family
from depthscope.probes.terms import Split
from depthscope.schemes import names

NAME = "deep-cross-attention"
PACKAGE = "deep-cross-attention"
VERSION = "0.1.1"
VIEWS = ("q", "k", "v")
CTX = 1024  # rotary positions: no limit of its own


def from_saved(args: dict) -> Any:
    """The model a saved file describes (``probes.load``): ``DCAGPT(**args)``."""
    from deep_cross_attention import DCAGPT

    return DCAGPT(**args)


def detect(model: Any) -> bool:
    """Whether ``model`` is a ``DCAGPT`` (none exists until ``deep_cross_attention.dca_gpt`` is imported)."""
    package = sys.modules.get("deep_cross_attention.dca_gpt")  # a DCAGPT exists only once it is imported
    return package is not None and isinstance(model, package.DCAGPT)


def selected(n_stack: int, k: int) -> list[int]:
    """The stack entries ``select_layers`` keeps out of ``n_stack``: all below 2k, else first k + last k."""
    if n_stack < 2 * k:
        return list(range(n_stack))
    return list(range(k)) + list(range(n_stack - k, n_stack))


def source_entries(block: int, k: int) -> list[int | None]:
    """For each source written before ``block`` (n_blocks = read-out), its position in the selected
    stack, None if ``select_layers`` dropped it.
    """
    position = {stack: e for e, stack in enumerate(selected(block + 1, k))}
    stacks = [0] + [j + 1 for j in range(block) for _ in (names.ATTN, names.MLP)]
    return [position.get(s) for s in stacks]


def _label(block: int, kind: str, view: str | None = None) -> str:
    base = names.label(block, kind)
    return f"{base}.{view}" if view else base


def _check(model: Any) -> int:
    k = int(model.past_layers_k)
    if k < 1:
        raise DepthscopeError(f"deep-cross-attention: past_layers_k must be >= 1, got {k}")
    for i, block in enumerate(model.dca_blocks):
        if block.qkv_grn.num_layers != len(selected(i + 1, k)) or block.qkv_grn.num_outputs != 3:
            raise DepthscopeError(
                f"deep-cross-attention: block {i}'s GRN does not read the stack select_layers gives it"
            )
    return k


def build(model: Any) -> ab.Adapter:
    """The adapter of a ``DCAGPT``: rows q, k, v and the MLP per block, then the read-out, with weights
    from each GRN's ``to_aggregate`` output and bias; DepthscopeError for a model it cannot read.
    """
    if not detect(model):
        raise DepthscopeError(f"deep-cross-attention: expected a DCAGPT, got a {type(model).__name__}")
    k = _check(model)
    depth = len(model.dca_blocks)
    srcs = [ab.SourceSpec(names.EMBED, names.EMBED, names.EMBED, 0)]
    cons, native = [], []
    for i in range(depth):
        for v in VIEWS:
            label = _label(i, names.ATTN, v)
            cons.append(ab.ConsumerSpec(label, f"{label}.in", names.ATTN, 2 * i + 1, len(srcs), f"{label}.w"))
            native.append(ab.NativeSpec("grn_weight", f"{label}.gate", label, ("entry",)))
        srcs.append(
            ab.SourceSpec(names.label(i, names.ATTN), names.label(i, names.ATTN), names.ATTN, 2 * i + 1)
        )
        mlp = names.label(i, names.MLP)
        cons.append(ab.ConsumerSpec(mlp, f"{mlp}.in", names.MLP, 2 * i + 2, len(srcs), f"{mlp}.w"))
        srcs.append(ab.SourceSpec(mlp, mlp, names.MLP, 2 * i + 2))
    cons.append(
        ab.ConsumerSpec(names.READOUT, "readout.in", names.READOUT, 2 * depth + 1, len(srcs), "readout.w")
    )
    native.append(ab.NativeSpec("grn_weight", "readout.gate", names.READOUT, ("entry",)))
    version = ab.installed_version(PACKAGE) or VERSION
    first = model.dca_blocks[0]
    config = {
        "num_tokens": model.token_emb.num_embeddings,
        "dim": model.token_emb.embedding_dim,
        "depth": depth,
        "past_layers_k": k,
        "heads": first.attn.heads,
        "dim_head": first.attn.to_q[1].out_features // first.attn.heads,
        "grn_activation": type(first.qkv_grn.to_aggregate[2]).__name__,
    }
    return ab.Adapter(
        family=NAME,
        sources=srcs,
        consumers=cons,
        attrs={
            "scheme": "dca",
            "variant": f"dca-k{k}",
            "label": f"{NAME} {version}: dca k={k}",
            "config": json.dumps(config, sort_keys=True),
            "mixing_meaning": "feature mean of act(w . RMSNorm(entry)) + bias[entry, d] (delta basis)",
        },
        ctx=CTX,
        vocab=int(model.token_emb.num_embeddings),
        native=native,
        static_native=lambda: static_native(model, [c.label for c in cons]),
        attach=lambda m, taps: _attach(m, taps, k),
        head=ab.head_of(model.norm, model.to_logits),
    )


def _n_entries(model: Any) -> int:
    return int(model.final_grn.num_layers)  # the longest selected stack: min(2k, depth + 1)


def static_native(model: Any, layers: list[str]) -> dict[str, tuple[tuple[str, ...], Any, dict[str, Any]]]:
    """``grn_bias`` (channel means of the static bias) and ``grn_stack`` (the stack entry each
    position holds), per consumer row and entry; NaN where a row has no such entry.
    """
    k, n = int(model.past_layers_k), _n_entries(model)
    row = {label: i for i, label in enumerate(layers)}
    bias = np.full((len(layers), n), math.nan)
    stack = np.full((len(layers), n), math.nan)

    def put(label: str, b: Tensor, block: int) -> None:
        means = b.detach().double().mean(-1).cpu().numpy()
        bias[row[label], : len(means)] = means
        stack[row[label], : len(means)] = selected(block + 1, k)

    for i, block in enumerate(model.dca_blocks):
        for o, v in enumerate(VIEWS):
            put(_label(i, names.ATTN, v), block.qkv_grn.bias[o], i)
    put(names.READOUT, model.final_grn.bias[0], len(model.dca_blocks))
    coords = {"layer": np.array(layers, dtype=object), "entry": np.arange(n)}
    return {
        "grn_bias": (("layer", "entry"), bias, coords),
        "grn_stack": (("layer", "entry"), stack, coords),
    }


def per_source(static: Tensor, gate: Tensor, entries: list[int | None]) -> tuple[Tensor, Tensor]:
    """Per-entry parts, static [entry, d_model] and gate [batch, pos, entry], -> per-source parts
    [source, d_model] and [batch, pos, source], 0 for a source whose entry was not selected.
    """
    index = torch.tensor([static.shape[0] if e is None else e for e in entries], device=static.device)
    static = torch.cat([static, static.new_zeros(1, static.shape[1])]).index_select(0, index)
    gate = torch.cat([gate, gate.new_zeros(*gate.shape[:-1], 1)], -1).index_select(-1, index)
    return static, gate


class _State:
    """Routes values to the engine's callbacks."""

    def __init__(self, taps: list[tuple[str, ab.Callback]], n_entries: int):
        self.send = ab.router(taps)
        self.n_entries = n_entries

    def gate(self, key: str, dynamic: Tensor) -> None:
        """The native dynamic part [batch, pos, entry], padded with NaN to the longest stack."""
        pad = self.n_entries - dynamic.shape[-1]
        self.send(key, torch.nn.functional.pad(dynamic.double(), (0, pad), value=math.nan))

    def grn(
        self, aggregate: Tensor, bias: Tensor, entries: list[int | None], labels: list[str], base: str | None
    ) -> list[Split]:
        """Weights of every output of one GRN from ``to_aggregate``'s output [o, entry, batch, pos]
        and ``bias`` [o, entry, d_model], as ``Split`` weights (the engine never forms them whole),
        sent under ``{label}.w``; the dynamic part under ``{label}.gate``. The first output's weights
        carry ``base`` (the block's MLP extends them).
        """
        dynamic = aggregate.permute(0, 2, 3, 1)  # [o, batch, pos, entry]
        out = []
        for o, label in enumerate(labels):
            static, gate = per_source(bias[o].detach().to(dynamic.dtype), dynamic[o], entries)
            w = Split(static, gate, base if o == 0 else None)
            self.send(f"{label}.w", w)
            self.gate(f"{label}.gate", dynamic[o])
            out.append(w)
        return out


@contextlib.contextmanager
def _attach(model: Any, taps: list[tuple[str, ab.Callback]], k: int):
    state = _State(taps, _n_entries(model))
    depth = len(model.dca_blocks)

    def forward_to(key: str):
        return lambda t: state.send(key, t)

    def block_weights(i: int):
        grn = model.dca_blocks[i].qkv_grn
        entries = source_entries(i, k)
        labels = [_label(i, names.ATTN, v) for v in VIEWS]

        def hook(aggregate: Tensor) -> None:
            q = state.grn(aggregate, grn.bias, entries, labels, base=labels[0])[0]
            # the MLP reads the q view's input plus this block's attention output (weight 1)
            static = torch.cat([q.static, q.static.new_ones(1, q.static.shape[1])])
            gate = torch.cat([q.gate, q.gate.new_zeros(*q.gate.shape[:-1], 1)], -1)
            state.send(f"{names.label(i, names.MLP)}.w", Split(static, gate, q.base, extra=1))

        return hook

    def readout_weights(aggregate: Tensor) -> None:
        state.grn(aggregate, model.final_grn.bias, source_entries(depth, k), [names.READOUT], None)

    hooks = [("token_emb:out", forward_to(names.EMBED))]
    for i in range(depth):
        p = f"dca_blocks.{i}"
        hooks.append((f"{p}.qkv_grn.to_aggregate:out", block_weights(i)))
        for v in VIEWS:
            hooks.append((f"{p}.attn.to_{v}:in", forward_to(f"{_label(i, names.ATTN, v)}.in")))
        hooks += [
            (f"{p}.attn:out", forward_to(names.label(i, names.ATTN))),
            (f"{p}.pre_ff_norm:in", forward_to(f"{names.label(i, names.MLP)}.in")),
            (f"{p}.ff:out", forward_to(names.label(i, names.MLP))),
        ]
    hooks += [
        ("final_grn.to_aggregate:out", readout_weights),
        ("final_grn:out", forward_to("readout.in")),
    ]
    with ab.module_attach(model, hooks):
        yield


FAMILY = package_family(
    NAME,
    (
        "deep-cross-attention DCAGPT: each GRN's to_aggregate output + static bias, per q/k/v view; "
        "a stack entry's per-feature weight applies to each of its sources (0 where select_layers drops it)"
    ),
    PACKAGE,
    VERSION,
    detect,
    build,
    from_saved,
)
