"""Adapter for kyegomez's ``attn-res`` (``AttnResTransformer``): Attention Residuals, arXiv 2603.15031.

What the package computes (``attn_res/main.py``, 0.1.0). Sublayers ``layers.{i}`` alternate
attention (even i) and SwiGLU MLP (odd i); each owns an ``AttnResOperator`` with a pseudo-query
w_i in R^d (``pseudo_query``, init 0) and builds its input from a list of entries v_n:

    h_i = sum_n alpha_n v_n,   alpha_n = softmax_n( w_i . RMSNorm(v_n) )

with RMSNorm weightless (``key_norm``: v / sqrt(mean(v^2) + eps)), no temperature (Sec. 3.1).
The sublayer then applies its own RMSNorm and f_i. Entries:

* FULL: the embedding and every earlier sublayer output, [x_0, f_0, ..., f_{i-1}];
* BLOCK: the embedding, the sums of completed blocks, then the partial sum of the current block
  (Sec. 3.2); a block holds S = n_layers // n_blocks consecutive outputs (output j is in block
  j // S; the package closes a block when it starts the next one, so more than ``n_blocks``
  blocks appear when S does not divide n_layers);
* NONE: no operator; the input is the plain residual sum.

Deviation from the paper kept as the package has it: there is no read-out AttnRes, the final
hidden state is the plain SUM of all entries (so of all sources), then ``out_norm``.

Delta basis. Sources: ``embed`` (``token_emb``), then ``{b}.attn`` / ``{b}.mlp`` for sublayer i
(b = i // 2), the outputs of ``layers.{i}``. An entry's weight applies to each of its members:
the embedding entry to ``embed``, a (partial) block's weight to every output it holds, so in
BLOCK mode a row sums to more than 1 while the entry weights sum to 1. The weights are recomputed
in float64 from the stacked entries that a forward pre-hook on ``AttnResOperator`` receives and
``pseudo_query`` (exact up to the package's float32 rounding); the consumer input is the input of
the sublayer's ``norm``, the read-out's the input of ``out_norm`` with all weights 1.

Native: ``attnres_alpha`` (layer, entry): token mean of the softmax weights over the entries
(embedding, blocks, partial sum), NaN-padded to the longest list; NaN on the read-out row.

Legend: batch, pos, d_model, entry (a softmax entry), source (embedding + sublayer outputs).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import Any

import torch
from torch import Tensor

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters import base as ab
from depthscope.probes.adapters.family import package_family
from depthscope.schemes import names

NAME = "attn-res"
PACKAGE = "attn-res"
VERSION = "0.1.0"


def from_saved(args: dict) -> Any:
    """The model a saved file describes (``probes.load``): ``AttnResTransformer(TransformerConfig(**args))``
    with ``attn_res_mode`` given by its value ("full", "block" or "none").
    """
    from attn_res.main import AttnResMode, AttnResTransformer, TransformerConfig

    config = {**args, "attn_res_mode": AttnResMode(args.get("attn_res_mode", "full"))}
    return AttnResTransformer(TransformerConfig(**config))


def detect(model: Any) -> bool:
    """Whether ``model`` is an ``AttnResTransformer`` (there is none until ``attn_res.main`` is imported)."""
    package = sys.modules.get("attn_res.main")  # an AttnResTransformer exists only once it is imported
    return package is not None and isinstance(model, package.AttnResTransformer)


def mode_of(model: Any) -> str:
    """The model's AttnRes mode: "full", "block" or "none"."""
    return str(model.cfg.attn_res_mode.value)  # "full", "block" or "none"


def group_size(model: Any) -> int:
    """Outputs per entry: 1 for FULL (every output is its own entry), S = n_layers // n_blocks for BLOCK."""
    if mode_of(model) == "block":
        size = model.cfg.n_layers // model.cfg.n_blocks
        if size < 1:
            raise DepthscopeError(
                f"attn-res: n_blocks {model.cfg.n_blocks} > n_layers {model.cfg.n_layers} gives empty blocks"
            )
        return size
    return 1


def entry_of_source(index: int, size: int) -> list[int]:
    """For each source available to sublayer ``index``: its entry (0 = embedding, 1 + j // size for f_j)."""
    return [0] + [1 + j // size for j in range(index)]


def n_entries(index: int, size: int) -> int:
    """Softmax entries sublayer ``index`` reads: the embedding, one per (partial) group of earlier outputs."""
    return 1 + -(-index // size)


def _label(i: int) -> str:
    return names.label(i // 2, names.ATTN if i % 2 == 0 else names.MLP)


def build(model: Any) -> ab.Adapter:
    """The adapter of an ``AttnResTransformer``: each sublayer's entry weights recomputed from its
    operator's input (unit weights in mode none), the read-out a plain sum.
    """
    if not detect(model):
        raise DepthscopeError(f"attn-res: expected an AttnResTransformer, got a {type(model).__name__}")
    cfg, mode = model.cfg, mode_of(model)
    size = group_size(model)
    n = len(model.layers)
    srcs = [ab.SourceSpec(names.EMBED, names.EMBED, names.EMBED, 0)]
    cons, native = [], []
    for i, layer in enumerate(model.layers):
        kind = names.ATTN if layer.is_attention else names.MLP
        if kind != (names.ATTN if i % 2 == 0 else names.MLP):
            raise DepthscopeError(f"attn-res: sublayer {i} is not in the attention/MLP alternation")
        label = _label(i)
        weights = f"{label}.w" if mode != "none" else None
        cons.append(ab.ConsumerSpec(label, f"{label}.in", kind, i + 1, len(srcs), weights))
        if mode != "none":
            native.append(ab.NativeSpec("attnres_alpha", f"{label}.alpha", label, ("entry",)))
        srcs.append(ab.SourceSpec(label, label, kind, i + 1))
    cons.append(ab.ConsumerSpec(names.READOUT, "readout.in", names.READOUT, n + 1, len(srcs)))
    version = ab.installed_version(PACKAGE) or VERSION
    variant = mode if mode != "block" else f"block-{cfg.n_blocks}"
    config = {
        "d_model": cfg.d_model,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "vocab_size": cfg.vocab_size,
        "max_seq_len": cfg.max_seq_len,
        "ffn_mult": cfg.ffn_mult,
        "attn_res_mode": mode,
        "n_blocks": cfg.n_blocks,
        "block_size": size,
        "eps": cfg.eps,
    }
    return ab.Adapter(
        family=NAME,
        sources=srcs,
        consumers=cons,
        attrs={
            "scheme": "attnres" if mode != "none" else "residual",
            "variant": variant,
            "label": f"{NAME} {version}: {variant}",
            "config": json.dumps(config, sort_keys=True),
            "readout": "plain sum of all entries (no read-out AttnRes in this package)",
        },
        ctx=int(cfg.max_seq_len),
        vocab=int(cfg.vocab_size),
        native=native,
        attach=lambda m, taps: _attach(m, taps, size, mode),
        head=ab.head_of(model.out_norm, model.lm_head),
    )


def entry_weights(entries: Tensor, query: Tensor, eps: float) -> Tensor:
    """softmax_n(query . RMSNorm(v_n)): [entry, batch, pos, d_model] -> [batch, pos, entry], float64.

    As query . v_n / rms(v_n): one product with the query and one norm per entry, never the
    normalised keys themselves (a copy of every entry). The product and the norm are reduced in the
    entries' dtype, as the model reduces them, and the rest is float64: a float64 copy of every
    entry cost more than the rest of the capture's work on this consumer.
    """
    d = entries.shape[-1]
    mean_sq = torch.linalg.vector_norm(entries, dim=-1).double().square() / d
    logits = (entries @ query.detach().to(entries.dtype)).double() * torch.rsqrt(mean_sq + eps)
    return logits.permute(1, 2, 0).softmax(-1)  # [entry, batch, pos] -> [batch, pos, entry]


@contextlib.contextmanager
def _attach(model: Any, taps: list[tuple[str, ab.Callback]], size: int, mode: str):
    send = ab.router(taps)
    longest = n_entries(len(model.layers) - 1, size)

    def weights(i: int):
        op = model.layers[i].attn_res
        label, index = _label(i), entry_of_source(i, size)

        def hook(entries: Tensor) -> None:
            if entries.shape[0] != n_entries(i, size):
                raise DepthscopeError(
                    f"attn-res: sublayer {i} read {entries.shape[0]} entries, the layout gives "
                    f"{n_entries(i, size)}"
                )
            alpha = entry_weights(entries, op.pseudo_query, op.key_norm.eps)  # [batch, pos, entry]
            send(f"{label}.w", alpha[:, :, index].to(entries.dtype))
            send(
                f"{label}.alpha",
                torch.nn.functional.pad(alpha, (0, longest - alpha.shape[-1]), value=math.nan),
            )

        return hook

    hooks = [("token_emb:out", ab.relay(send, names.EMBED))]
    for i in range(len(model.layers)):
        if mode != "none":
            hooks.append((f"layers.{i}.attn_res:in", weights(i)))
        hooks += [
            (f"layers.{i}.norm:in", ab.relay(send, f"{_label(i)}.in")),
            (f"layers.{i}:out", ab.relay(send, _label(i))),
        ]
    hooks.append(("out_norm:in", ab.relay(send, "readout.in")))
    with ab.module_attach(model, hooks):
        yield


FAMILY = package_family(
    NAME,
    (
        "attn-res AttnResTransformer (full, block): softmax(pseudo_query . RMSNorm(entry)) recomputed from a "
        "pre-hook on AttnResOperator; a block's weight applies to each member; read-out: plain sum (all 1)"
    ),
    PACKAGE,
    VERSION,
    detect,
    build,
    from_saved,
)
