"""Adapter for TransformerLens ``TransformerBridge`` models with a standard pre-norm residual stream.

Sources: ``hook_embed``, ``hook_pos_embed`` when the model has learned absolute positions (its
``cfg.positional_embedding_type`` is ``standard``; a rotary model has the hook point but it never
fires), then ``blocks.{i}.hook_attn_out`` / ``hook_mlp_out``. Consumers: ``blocks.{i}.hook_resid_pre``
(attention input), ``blocks.{i}.hook_resid_mid`` (MLP input) and the last ``hook_resid_post``
(read-out), read at the norms' inputs (``blocks.{i}.ln1.hook_in``, ``ln2``, ``ln_final``) where the
bridge has them: the same values, but replacing one changes only what its sublayer reads. Every
weight is 1. Hook names are not trusted: the engine checks on every batch that each input is the
sum of its sources, so a post-LN model or an architecture whose ``*_out`` hooks
hold residual-added states is refused instead of being decomposed wrongly.
"""

from __future__ import annotations

import json
from typing import Any

from depthscope.errors import TraceError
from depthscope.probes.adapters.base import Adapter, ConsumerSpec, SourceSpec, head_of
from depthscope.probes.adapters.family import Family
from depthscope.probes.adapters.hf import encoder
from depthscope.schemes import names

NAME = "transformer-lens"
HINT = (
    "; it looks post-LN (BERT) or its *_out hooks hold residual-added states: a plain sum cannot decompose "
    "it, load the Hugging Face directory with depthscope.load (the post-LN adapter decomposes BERT exactly)"
)


def detect(model: Any) -> bool:
    """Whether ``model`` is a TransformerLens ``TransformerBridge``."""
    try:
        from transformer_lens import TransformerBridge
    except ImportError:  # pragma: no cover - transformer-lens is a dependency
        return False
    return isinstance(model, TransformerBridge)


def build(model: Any) -> Adapter:
    """The adapter of a bridge with a pre-norm residual: unit weights, consumers at the norms' inputs
    where the bridge has them (else the resid hooks); TraceError if a hook it needs is missing.
    """
    cfg = model.cfg
    n = cfg.n_layers
    available = set(model.hook_dict)
    # the norms' inputs are views of the stream (replacing one changes only what its sublayer reads,
    # which removing a source from chosen consumers needs); the resid hooks hold the same values
    views = "ln_final.hook_in" in available and all(
        f"blocks.{i}.ln{k}.hook_in" in available for i in range(n) for k in (1, 2)
    )
    attn_in = (lambda i: f"blocks.{i}.ln1.hook_in") if views else names.resid_pre
    mlp_in = (lambda i: f"blocks.{i}.ln2.hook_in") if views else names.resid_mid
    srcs = [SourceSpec(names.EMBED, names.HOOK_EMBED, names.EMBED, 0)]
    if getattr(cfg, "positional_embedding_type", "standard") == "standard":
        srcs.append(SourceSpec("pos_embed", names.HOOK_POS_EMBED, names.EMBED, 0))
    cons = []
    for i in range(n):
        attn, mlp = names.label(i, names.ATTN), names.label(i, names.MLP)
        cons.append(ConsumerSpec(attn, attn_in(i), names.ATTN, 2 * i + 1, len(srcs)))
        srcs.append(SourceSpec(attn, names.source_out(i, names.ATTN), names.ATTN, 2 * i + 1))
        cons.append(ConsumerSpec(mlp, mlp_in(i), names.MLP, 2 * i + 2, len(srcs)))
        srcs.append(SourceSpec(mlp, names.source_out(i, names.MLP), names.MLP, 2 * i + 2))
    readout_in = "ln_final.hook_in" if views else names.resid_post(n - 1)
    cons.append(ConsumerSpec(names.READOUT, readout_in, names.READOUT, 2 * n + 1, len(srcs)))
    missing = [t for t in [s.tap for s in srcs] + [c.tap for c in cons] if t not in available]
    if missing:
        raise TraceError(
            f"model has no hook {missing[0]}: not a standard residual stream depthscope can decompose"
        )
    name = getattr(cfg, "model_name", None) or type(model).__name__
    tokenizer = getattr(model, "tokenizer", None)
    return Adapter(
        family=NAME,
        sources=srcs,
        consumers=cons,
        attrs={
            "scheme": "standard",
            "variant": str(name),
            "label": f"bridge:{name}",
            "config": _config(cfg),
        },
        ctx=int(cfg.n_ctx),
        vocab=int(cfg.d_vocab),
        encode=None if tokenizer is None else encoder(tokenizer),
        hint=HINT,
        skip_positions=1,
        head=_head(model),
        views=views,
    )


def _head(model: Any):
    """The bridge's final norm and unembedding, as the wrapped model's own modules (None if hidden)."""
    inner = []
    for name in ("ln_final", "unembed"):
        module = getattr(model, name, None)
        inner.append(
            getattr(module, "original_component", None) or getattr(module, "_original_component", None)
        )
    return None if None in inner else head_of(*inner)


def _config(cfg: Any) -> str:
    keep = (
        "model_name",
        "n_layers",
        "d_model",
        "n_heads",
        "d_mlp",
        "n_ctx",
        "d_vocab",
        "normalization_type",
        "positional_embedding_type",
    )
    return json.dumps({k: getattr(cfg, k, None) for k in keep}, default=str, sort_keys=True)


FAMILY = Family(
    name=NAME,
    reads=(
        "TransformerLens TransformerBridge models with a pre-norm residual: hook_embed (+ hook_pos_embed), "
        "hook_attn_out/hook_mlp_out; unit weights"
    ),
    detect=detect,
    build=build,
    priority=10,
)
