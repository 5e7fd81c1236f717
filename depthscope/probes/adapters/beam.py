"""Adapter for Beam in ``transformers`` (``model_type`` ``beam``): sandwich norms and a depth-scaled residual.

Legend: batch, pos, d_model, source (the embedding, then every sublayer output in execution order).

What the model computes (``modeling_beam.py``, ``depth_scaled_residual_add``). Every sublayer is
wrapped in two RMSNorms (sandwich norms): it reads RMSNorm(h) and writes f = RMSNorm(sublayer(.))
(``post_attention_layernorm`` / ``post_feedforward_layernorm`` outputs). The write is a
depth-scaled residual add with index k:

    h <- sqrt((k - 1) / k) h + f / sqrt(k)

where k is ``attn_residual_add_idx`` = 2 (l + 1) for the attention of decoder layer l (0-based)
and ``mlp_residual_add_idx`` = 2 (l + 1) + 1 for its MLP: the adds are numbered 2, 3, 4, ... in
execution order, the embedding counting as term 1.

The exact depth counting (the statement for the README). The stream after add k is
(e + f_1 + ... + f_{k-1}) / sqrt(k): a running mean in the sqrt sense, with the embedding e and the
k - 1 sublayer outputs written so far each weighted exactly 1/sqrt(k). So a consumer at depth K
(the attention of layer l: K = 2l + 1; its MLP: K = 2l + 2; the read-out of an L-layer model:
K = 2L + 1) reads its K available sources each with weight exactly 1/sqrt(K): M[l, s] = 1/sqrt(K_l)
on every available cell, a static, exactly uniform scheme (it does not dilute any source more than
another; it shrinks the whole input by 1/sqrt(K), which the consumer's RMSNorm undoes).

How it maps to the delta basis: sources are the token embedding and each sandwich-normed sublayer
output (what the add receives as f); consumers are each sublayer's input before its pre-norm
(``input_layernorm`` / ``pre_feedforward_layernorm`` inputs) and the final norm's input. The family
is a ModelSpec (``spec_of``) whose static weights are given, not found: unrolled at build time from
the add indices the decoder layers carry (coefficients c over the sources: c <- sqrt((k-1)/k) c,
then append 1/sqrt(k)); ``spec.build_spec`` checks them against the inputs on the probe forward,
and the engine's residual identity on every batch.

Native (static) quantities, per consumer, of the add that produced its input (NaN for the first
attention, which reads the embedding directly): ``residual_add_idx`` (layer) k,
``residual_scale`` (layer) sqrt((k-1)/k) and ``branch_scale`` (layer) 1/sqrt(k).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from depthscope.probes.adapters.base import Adapter
from depthscope.probes.adapters.family import transformers_family
from depthscope.probes.adapters.hf import as_family, family_attrs, prefix_of, text_model
from depthscope.probes.adapters.spec import ModelSpec, build_spec
from depthscope.schemes import names

NAME = "beam"
MODEL_TYPES = ("beam",)
BASE_CLASS = "BeamModel"


def add_indices(inner: Any) -> list[int]:
    """The residual add index k of every sublayer, in execution order, as the decoder layers carry them."""
    return [k for layer in inner.layers for k in (layer.attn_residual_add_idx, layer.mlp_residual_add_idx)]


def unrolled_weights(indices: list[int]) -> list[list[float]]:
    """Per consumer (each sublayer, then the read-out), the weight of each available source."""
    coef, rows = [1.0], []  # the stream holds sum_j coef[j] v_j: the embedding alone at first
    for k in indices:
        rows.append(list(coef))
        coef = [c * math.sqrt((k - 1) / k) for c in coef] + [1.0 / math.sqrt(k)]
    rows.append(coef)
    return rows


def spec_of(model: Any) -> ModelSpec:
    """Beam's reading as a ModelSpec: the embedding and each sandwich-normed sublayer output written,
    each pre-norm's input and the final norm's read, the static weights 1/sqrt(K) given as the layers'
    add indices unroll them (checked on the probe forward, then on every batch).
    """
    p = prefix_of(model, BASE_CLASS, NAME)
    inner = text_model(model, p)
    cfg, at = inner.config, f"{p}layers.*"
    rows = unrolled_weights(add_indices(inner))
    labels = [names.label(i, kind) for i in range(len(inner.layers)) for kind in (names.ATTN, names.MLP)]
    static = {lab: tuple(row) for lab, row in zip([*labels, names.READOUT], rows) if len(row) > 1}
    return ModelSpec(
        embed=f"{p}embed_tokens",
        writes={names.ATTN: f"{at}.post_attention_layernorm", names.MLP: f"{at}.post_feedforward_layernorm"},
        reads={
            names.ATTN: f"{at}.input_layernorm",
            names.MLP: f"{at}.pre_feedforward_layernorm",
            names.READOUT: f"{p}norm",
        },
        ctx=int(cfg.max_position_embeddings),
        vocab=int(cfg.vocab_size),
        static=static,
    )


def build(model: Any) -> Adapter:
    """The adapter of a Beam model: its ModelSpec (``spec_of``), built and checked as any spec is."""
    read = build_spec(model, spec_of(model), find=False)
    inner = text_model(model, prefix_of(model, BASE_CLASS, NAME))
    keep = ("layer_types", "mlp_layer_types", "num_experts")
    attrs = family_attrs(
        model,
        inner.config,
        keep,
        "depth-scaled",
        mixing_meaning="static: every available source has weight 1/sqrt(K) at a consumer of depth K",
    )
    scales = partial(static_scales, add_indices(inner), [c.label for c in read.consumers])
    return as_family(read, model, NAME, attrs, "depth-scaled residual", static_native=scales, head=None)


def static_scales(indices: list[int], labels: list[str]) -> dict[str, tuple[tuple[str, ...], Any, dict]]:
    """Per consumer, the add that produced its input: its index and its two scales (NaN for the first)."""
    k = np.array([np.nan, *indices], dtype=np.float64)  # consumer r reads the stream after add r - 1
    coords = {"layer": np.array(labels, dtype=object)}
    return {
        "residual_add_idx": (("layer",), k, coords),
        "residual_scale": (("layer",), np.sqrt((k - 1) / k), coords),
        "branch_scale": (("layer",), 1.0 / np.sqrt(k), coords),
    }


FAMILY = transformers_family(
    NAME,
    (
        "transformers beam (sandwich norms, depth_scaled_residual_add): post-norm sublayer outputs "
        "as sources; "
        "static M = 1/sqrt(K) at a consumer of depth K, unrolled from the layers' residual_add_idx"
    ),
    MODEL_TYPES,
    BASE_CLASS,
    build,
)
