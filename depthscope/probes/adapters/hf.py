"""Helpers of the adapters for Hugging Face ``transformers`` models (no family of its own)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters.base import Adapter, config_values, find_module, installed_version


def pretrained(model: Any) -> bool:
    """Whether ``model`` is a ``transformers`` PreTrainedModel."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers comes with transformer-lens
        return False
    return isinstance(model, PreTrainedModel)


def input_embedding(model: Any) -> Any:
    """The model's token embedding (``get_input_embeddings``), or None: custom modeling code written
    for an older transformers may not define it (transformers then raises NotImplementedError).
    """
    try:
        return model.get_input_embeddings()
    except Exception:  # noqa: BLE001 - whatever it raises, the model does not say
        return None


def model_type(model: Any) -> Any:
    """``model.config.model_type``, or None where the model has no config or its config will not say
    (transformers' per-layer configs refuse some attributes).
    """
    try:
        return getattr(getattr(model, "config", None), "model_type", None)
    except Exception:  # noqa: BLE001 - a config property that raises says nothing about the type
        return None


def model_name(model: Any) -> str:
    """The model's name: its directory's or file's (``_name_or_path``), else its model type."""
    path = str(getattr(model.config, "_name_or_path", "") or "")
    return Path(path).name.removesuffix(".gguf") or model.config.model_type


def encoder(tokenizer: Any):
    """Text -> ids with a Hugging Face tokenizer, without special tokens (plain text windows); its
    ``tokenization`` says which (recorded in the trace).
    """

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]

    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    encode.tokenization = f"tokenizer {Path(name).name or name} ({type(tokenizer).__name__})"
    return encode


# the vocabulary read as bytes when a transformers model has no tokenizer: exactly the 256 bytes. A
# byte-level vocabulary with special ids before the bytes (ByT5: 3, so 384 ids) would read every byte
# offset, and a larger one is a learned vocabulary: both are refused, with --tokenizer to name one
BYTE_VOCAB = 256


def text_encoder(model: Any, why: str = ""):
    """How the corpus becomes a transformers model's token ids: its tokenizer (``model.tokenizer``,
    which the loader sets from the files saved with it), else ``byte_encoder`` (``why``: what makes
    the ids not bytes, whatever the vocabulary).
    """
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        return encoder(tokenizer)
    return byte_encoder(int(getattr(model.config, "vocab_size", 0) or 0), model_name(model), why)


def byte_encoder(vocab: int, name: str, why: str = ""):
    """A model with no tokenizer: the corpus's bytes as its ids (None) for a vocabulary of exactly
    ``BYTE_VOCAB``, else an encoder that refuses in one line (saying how to name a tokenizer).
    """
    if not why and vocab == BYTE_VOCAB:
        return None
    why = why or (
        f"its vocabulary of {vocab} ids is not exactly the {BYTE_VOCAB} bytes (special ids before them "
        "would shift every byte)"
    )

    def refuse(text: str) -> list[int]:
        raise DepthscopeError(
            f"{name} has no tokenizer and {why}: name one with --tokenizer NAME_OR_DIR (Python: "
            "capture(..., tokenizer=...)), save its files in the model directory, or pass token ids "
            "(Python: capture(model, ids))"
        )

    return refuse


def prefix_of(model: Any, class_name: str, family: str) -> str:
    """``"model."`` for a *ForCausalLM, ``""`` for the base model; DepthscopeError for another model."""
    path = find_module(model, class_name) if pretrained(model) else None
    if path is None:
        kind = type(model).__name__
        raise DepthscopeError(f"the {family} adapter reads transformers {class_name} models, not a {kind}")
    return f"{path}." if path else ""


def text_model(model: Any, prefix: str) -> Any:
    """The base model under ``prefix`` (from ``prefix_of``): the model itself when it is empty."""
    return model.get_submodule(prefix.rstrip(".")) if prefix else model


SHAPE_KEYS = ("model_type", "num_hidden_layers", "hidden_size", "vocab_size", "max_position_embeddings")


def family_attrs(model: Any, cfg: Any, keep: tuple[str, ...], scheme: str, **extra: Any) -> dict[str, Any]:
    """The trace attrs a transformers family records: its scheme, the model's name (``variant``),
    the label, the config values ``SHAPE_KEYS`` and ``keep`` name (as JSON), then ``extra``.
    """
    return {
        "scheme": scheme,
        "variant": model_name(model),
        "label": label_of(model, cfg.model_type),
        "config": json.dumps(config_values(cfg, SHAPE_KEYS + keep), sort_keys=True, default=str),
        **extra,
    }


def label_of(model: Any, model_type: str) -> str:
    """Trace label: transformers' version and the model type, and the model's name when it has one."""
    name = model_name(model)
    base = f"transformers {installed_version('transformers') or '?'}: {model_type}"
    return base if name in (model_type, model.config.model_type) else f"{base} ({name})"


def decoder_adapter(
    model: Any, cfg: Any, name: str, sources: list, consumers: list, attrs: dict, equations: str, **more: Any
) -> Adapter:
    """The adapter of a transformers decoder family: context, vocabulary and tokenizer from the model
    and its config, the first position left out (its attention sink), and a hint naming the
    ``equations`` it unrolls for when the forward no longer matches them; ``more`` adds or overrides.
    """
    fields = {"ctx": int(cfg.max_position_embeddings), "vocab": int(cfg.vocab_size), **more}
    return Adapter(
        family=name,
        sources=sources,
        consumers=consumers,
        attrs=attrs,
        **_family_fields(model, name, equations, fields),
    )


def as_family(read: Adapter, model: Any, name: str, attrs: dict, equations: str = "", **more: Any) -> Adapter:
    """An adapter built from a family's ModelSpec (``spec.build_spec``) as that family's: its name and
    attrs, the tokenizer, the first position left out and the hint of ``decoder_adapter`` (or the
    ``hint`` given in ``more``).
    """
    return dataclasses.replace(read, family=name, attrs=attrs, **_family_fields(model, name, equations, more))


def _family_fields(model: Any, name: str, equations: str, more: dict) -> dict[str, Any]:
    return {
        "encode": text_encoder(model),
        "skip_positions": 1,
        "hint": f"; the {name} forward no longer matches the {equations} this adapter unrolls",
        **more,
    }
