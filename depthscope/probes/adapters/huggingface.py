"""Adapter for Hugging Face ``transformers`` pre-norm decoders (Llama/Mistral/Qwen/SmolLM, GPT-2, GPT-NeoX).

Plain PyTorch hooks on the model's own modules (no wrapper, so a capture costs little more than
the model's forward): sources are the token embedding (and GPT-2's learned position embedding as
its own source), then every attention and MLP output; consumers are read at the inputs of the
norms: each layer's first norm (the attention's input), its second norm (the MLP's) and the final
norm (the read-out) — the stream's values, but a view of it: replacing one changes only what that
sublayer reads. Every weight is 1: a standard residual. GPT-NeoX with ``use_parallel_residual`` has
its MLP read the layer's input, so the MLP consumer does not see its own block's attention output.

Like every family, the residual identity is checked on every batch: a model whose inputs are not
the sum of these sources (an embedding scaled inside the forward, sandwich norms, a post-LN
layout) is refused, never decomposed wrongly. Architectures are recognised by ``model_type``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from depthscope.probes.adapters.base import Adapter, ConsumerSpec, SourceSpec, head_of, module_attach
from depthscope.probes.adapters.hf import encoder, model_name, pretrained
from depthscope.schemes import names

FAMILY = "huggingface"
PRIORITY = 20
READS = (
    "transformers pre-norm decoders (llama, mistral, qwen2, qwen3, smollm3, phi3, gpt2, gpt_neox): "
    "module hooks on embeddings, attention and MLP outputs, norm inputs; unit weights"
)


@dataclass(frozen=True)
class DecoderLayout:
    """Module paths of one architecture, relative to its base model (``{i}`` = layer index)."""

    base: tuple[str, ...]  # attribute of the *For* classes holding the base model, tried in order
    embed: str
    positions: str | None  # learned position embedding, if any
    layer: str
    attn_input: str  # the module whose input is the attention's input (its pre-norm): a view of the stream
    attn: str
    mlp: str
    mlp_input: str  # the module whose input is the MLP's input (its pre-norm)
    readout: str  # the final norm
    parallel: str | None = None  # config flag: the MLP reads the layer's input (parallel residual)


LLAMA = DecoderLayout(
    base=("model",),
    embed="embed_tokens",
    positions=None,
    layer="layers.{i}",
    attn_input="layers.{i}.input_layernorm",
    attn="layers.{i}.self_attn",
    mlp="layers.{i}.mlp",
    mlp_input="layers.{i}.post_attention_layernorm",
    readout="norm",
)
LAYOUTS = {
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3"), LLAMA),
    "gpt2": DecoderLayout(
        base=("transformer",),
        embed="wte",
        positions="wpe",
        layer="h.{i}",
        attn_input="h.{i}.ln_1",
        attn="h.{i}.attn",
        mlp="h.{i}.mlp",
        mlp_input="h.{i}.ln_2",
        readout="ln_f",
    ),
    "gpt_neox": DecoderLayout(
        base=("gpt_neox",),
        embed="embed_in",
        positions=None,
        layer="layers.{i}",
        attn_input="layers.{i}.input_layernorm",
        attn="layers.{i}.attention",
        mlp="layers.{i}.mlp",
        mlp_input="layers.{i}.post_attention_layernorm",
        readout="final_layer_norm",
        parallel="use_parallel_residual",
    ),
}


MODEL_TYPES = tuple(LAYOUTS)  # config.model_type of the models this adapter reads (the loader asks)


def detect(model: Any) -> bool:
    """Whether ``model`` is a transformers model of a pre-norm decoder type that ``LAYOUTS`` knows."""
    return pretrained(model) and getattr(model.config, "model_type", None) in LAYOUTS


def base_prefix(model: Any, layout: DecoderLayout) -> str:
    """``"model."`` for a *ForCausalLM, ``""`` for the base model itself."""
    for attr in layout.base:
        if hasattr(model, attr) and hasattr(getattr(model, attr), layout.embed):
            return f"{attr}."
    return ""


def build(model: Any) -> Adapter:
    """The adapter of a pre-norm decoder from its ``DecoderLayout``: unit weights; with a parallel
    residual the MLP's row leaves out its own block's attention output.
    """
    cfg = model.config
    layout = LAYOUTS[cfg.model_type]
    p = base_prefix(model, layout)
    n = cfg.num_hidden_layers
    parallel = bool(layout.parallel and getattr(cfg, layout.parallel, False))
    srcs = [SourceSpec(names.EMBED, f"{p}{layout.embed}:out", names.EMBED, 0)]
    if layout.positions:
        srcs.append(SourceSpec("pos_embed", f"{p}{layout.positions}:out", names.EMBED, 0))
    cons = []
    for i in range(n):
        before = len(srcs)
        cons.append(
            ConsumerSpec(
                names.label(i, names.ATTN),
                f"{p}{layout.attn_input.format(i=i)}:in",
                names.ATTN,
                2 * i + 1,
                before,
            )
        )
        srcs.append(
            SourceSpec(names.label(i, names.ATTN), f"{p}{layout.attn.format(i=i)}:out", names.ATTN, 2 * i + 1)
        )
        mlp_sees = before if parallel else len(srcs)
        cons.append(
            ConsumerSpec(
                names.label(i, names.MLP),
                f"{p}{layout.mlp_input.format(i=i)}:in",
                names.MLP,
                2 * i + 2,
                mlp_sees,
            )
        )
        srcs.append(
            SourceSpec(names.label(i, names.MLP), f"{p}{layout.mlp.format(i=i)}:out", names.MLP, 2 * i + 2)
        )
    cons.append(ConsumerSpec(names.READOUT, f"{p}{layout.readout}:in", names.READOUT, 2 * n + 1, len(srcs)))
    name = model_name(model)
    tokenizer = getattr(model, "tokenizer", None)
    keep = (
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "n_positions",
        "tie_word_embeddings",
    )
    config = {k: getattr(cfg, k) for k in keep if getattr(cfg, k, None) is not None}
    return Adapter(
        family=FAMILY,
        sources=srcs,
        consumers=cons,
        attrs={
            "scheme": "standard",
            "variant": name,
            "label": name,
            "family": FAMILY,
            "config": json.dumps(config, sort_keys=True, default=str),
            "parallel_residual": int(parallel),
        },
        ctx=int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 1024)),
        vocab=int(cfg.vocab_size),
        encode=None if tokenizer is None else encoder(tokenizer),
        attach=module_attach,
        skip_positions=1,
        head=head_of(model.get_submodule(f"{p}{layout.readout}"), model.get_output_embeddings())
        if model.get_output_embeddings() is not None
        else None,
        hint=f"; {cfg.model_type} is not a plain pre-norm residual stream here",
    )
