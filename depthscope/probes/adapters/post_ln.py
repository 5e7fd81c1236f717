"""Adapter for post-LN encoders (BERT, MiniLM): an exact decomposition through every LayerNorm.

A post-LN layer normalises the sum of its input and its sublayer's output, so the stream is not a
sum of sublayer outputs (TransformerLens's ``decompose_resid`` is silently wrong here). But for
each token a LayerNorm is affine given that token's mean and standard deviation:

    LN(x) = gamma * (x - mean(x)) / sigma(x) + beta,   x = sum_s c_s
          = sum_s gamma * (c_s - mean(c_s)) / sigma(x) + beta

so every term propagates through each later LayerNorm as gamma * (c - mean(c)) / sigma, with the
sigma of the whole sum (that token's), and each LayerNorm's bias becomes a source of its own
(``embed.ln``, ``{i}.ln1``, ``{i}.ln2``; kind ``bias``). The embeddings (word, position, token
type) are sources too. Each hidden state is then again exactly the sum of its terms, which the
engine checks on every batch.

What the trace's variables mean here: ``contribution_share`` and ``norm_share`` are computed from
the propagated terms, exactly. ``mixing`` of source s at consumer l is the accumulated factor
prod 1/sigma over the LayerNorms between them (per token, then the token mean): the scale the
stream applied to the source's term, gamma and the centring being inside the terms; a bias
enters with 1 at its own LayerNorm. Consumers: each layer's input (its attention's), the
attention block's normalised output (the MLP's input), and the last layer's output (the
read-out, what a pooling or head reads).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import torch
from torch import Tensor

from depthscope.probes.accumulate import CHUNK_BYTES
from depthscope.probes.adapters.base import Adapter, Callback, ConsumerSpec, SourceSpec, module_attach, router
from depthscope.probes.adapters.hf import encoder, model_name, pretrained
from depthscope.schemes import names

FAMILY = "post-ln"
PRIORITY = 20
READS = (
    "transformers post-LN encoders (bert): every term propagated through each LayerNorm, LayerNorm biases as "
    "sources; M = accumulated 1/sigma"
)
MIXING_MEANING = (
    "post-LN: mixing is the token mean of prod 1/sigma over the LayerNorms between source and consumer; "
    "gamma and the centring are inside the terms, and each LayerNorm bias is a source"
)
MODEL_TYPES = ("bert",)  # model_type of the post-LN encoders this adapter reads (the loader asks)


def detect(model: Any) -> bool:
    """Whether ``model`` is a transformers post-LN encoder (``model_type`` in ``MODEL_TYPES``)."""
    return pretrained(model) and getattr(model.config, "model_type", None) in MODEL_TYPES


def _prefix(model: Any) -> str:
    return "bert." if hasattr(model, "bert") else ""


def build(model: Any) -> Adapter:
    """The adapter of a BERT-like encoder: embeddings, sublayer outputs and LayerNorm biases as sources;
    each consumer gets its terms propagated through the LayerNorms before it.
    """
    cfg = model.config
    n = cfg.num_hidden_layers
    # in the order the model computes them (the terms are kept in that order)
    emb = [
        SourceSpec(names.EMBED, "word", names.EMBED, 0),
        SourceSpec("token_type", "token_type", names.EMBED, 0),
        SourceSpec("pos_embed", "position", names.EMBED, 0),
        SourceSpec("embed.ln", "embed.ln", names.BIAS, 0),
    ]
    srcs, cons = list(emb), []
    for i in range(n):
        cons.append(
            ConsumerSpec(
                names.label(i, names.ATTN),
                f"{i}.attn.in",
                names.ATTN,
                2 * i + 1,
                len(srcs),
                f"{i}.attn.terms",
                terms=True,
            )
        )
        srcs += [
            SourceSpec(names.label(i, names.ATTN), f"{i}.attn", names.ATTN, 2 * i + 1),
            SourceSpec(f"{i}.ln1", f"{i}.ln1", names.BIAS, 2 * i + 1),
        ]
        cons.append(
            ConsumerSpec(
                names.label(i, names.MLP),
                f"{i}.mlp.in",
                names.MLP,
                2 * i + 2,
                len(srcs),
                f"{i}.mlp.terms",
                terms=True,
            )
        )
        srcs += [
            SourceSpec(names.label(i, names.MLP), f"{i}.mlp", names.MLP, 2 * i + 2),
            SourceSpec(f"{i}.ln2", f"{i}.ln2", names.BIAS, 2 * i + 2),
        ]
    cons.append(
        ConsumerSpec(
            names.READOUT, "readout.in", names.READOUT, 2 * n + 1, len(srcs), "readout.terms", terms=True
        )
    )
    name = model_name(model)
    tokenizer = getattr(model, "tokenizer", None)
    keep = (
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "layer_norm_eps",
    )
    return Adapter(
        family=FAMILY,
        sources=srcs,
        consumers=cons,
        attrs={
            "scheme": "post-ln",
            "variant": name,
            "label": name,
            "family": FAMILY,
            "config": json.dumps(
                {k: getattr(cfg, k) for k in keep if hasattr(cfg, k)}, sort_keys=True, default=str
            ),
            "mixing_meaning": MIXING_MEANING,
        },
        ctx=int(cfg.max_position_embeddings),
        vocab=int(cfg.vocab_size),
        encode=None if tokenizer is None else encoder(tokenizer),
        attach=lambda m, taps: _attach(m, taps, n, len(srcs)),
        views=False,  # a post-LN layer's input is the stream itself
    )


class _Terms:
    """The terms of the current hidden state and their accumulated 1/sigma, batch by batch.

    One buffer per batch, source-major: ``terms`` [source, batch, pos, d_model] (the first ``n``
    live) and ``scale`` [source, batch, pos]; each LayerNorm updates the live terms in place, and a
    consumer hands the engine a view of them (the engine folds it before the next LayerNorm).
    """

    def __init__(self, send, n_sources: int):
        self.send, self.n_sources = send, n_sources
        self.terms: Tensor | None = None
        self.scale: Tensor | None = None
        self.n = 0

    def start(self, t: Tensor) -> None:
        """A new batch, from its first source [batch, pos, d_model]."""
        shape = (self.n_sources, *t.shape)
        if self.terms is None or self.terms.shape != shape or self.terms.dtype != t.dtype:
            self.terms = t.new_empty(shape)
            self.scale = t.new_empty(shape[:-1])
        self.n = 0

    def source(self, key: str, t: Tensor) -> None:
        """A new term: sent to the engine as a source, kept with scale 1."""
        t = t.expand(self.terms.shape[1], -1, -1) if t.shape[0] != self.terms.shape[1] else t
        self.send(key, t)
        self.terms[self.n] = t
        self.scale[self.n] = 1.0
        self.n += 1

    def normalise(self, ln: torch.nn.LayerNorm, x: Tensor, bias_key: str) -> None:
        """Propagate every term through ``ln`` applied to ``x`` (= their sum), then add its bias."""
        inv = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + ln.eps)  # that token's 1/sigma
        gain = (inv * ln.weight if ln.weight is not None else inv).flatten(0, 1)  # [T, d]
        live = self.terms[: self.n].flatten(1, 2)  # [n, T, d]
        step = max(1, CHUNK_BYTES // (live.element_size() * live.shape[0] * live.shape[-1]))
        for a in range(0, live.shape[1], step):  # token chunks that stay in cache: one pass over memory
            c = live[:, a : a + step]
            c -= c.mean(-1, keepdim=True)
            c *= gain[a : a + step]
        self.scale[: self.n] *= inv.squeeze(-1)
        beta = ln.bias if ln.bias is not None else x.new_zeros(x.shape[-1])
        self.source(bias_key, beta.expand_as(x))

    def consumer(self, key: str, h: Tensor) -> None:
        self.send(f"{key}.in", h)
        self.send(f"{key}.terms", (self.terms[: self.n], self.scale[: self.n]))


@contextlib.contextmanager
def _attach(model: Any, taps: list[tuple[str, Callback]], n_layers: int, n_sources: int):
    state = _Terms(router(taps), n_sources)
    p = _prefix(model)

    def word(t: Tensor) -> None:
        state.start(t)  # a new batch starts here
        state.source("word", t)

    def layer_norm(path: str, bias_key: str):
        ln = model.get_submodule(path)
        return lambda x: state.normalise(ln, x, bias_key)

    hooks = [
        (f"{p}embeddings.word_embeddings:out", word),
        (f"{p}embeddings.token_type_embeddings:out", lambda t: state.source("token_type", t)),
        (f"{p}embeddings.position_embeddings:out", lambda t: state.source("position", t)),
        (f"{p}embeddings.LayerNorm:in", layer_norm(f"{p}embeddings.LayerNorm", "embed.ln")),
    ]
    for i in range(n_layers):
        layer = f"{p}encoder.layer.{i}"
        hooks += [
            (f"{layer}:in", lambda h, i=i: state.consumer(f"{i}.attn", h)),
            (f"{layer}.attention.output.dense:out", lambda t, i=i: state.source(f"{i}.attn", t)),
            (
                f"{layer}.attention.output.LayerNorm:in",
                layer_norm(f"{layer}.attention.output.LayerNorm", f"{i}.ln1"),
            ),
            (f"{layer}.intermediate:in", lambda h, i=i: state.consumer(f"{i}.mlp", h)),
            (f"{layer}.output.dense:out", lambda t, i=i: state.source(f"{i}.mlp", t)),
            (f"{layer}.output.LayerNorm:in", layer_norm(f"{layer}.output.LayerNorm", f"{i}.ln2")),
        ]
    hooks.append((f"{p}encoder.layer.{n_layers - 1}:out", lambda h: state.consumer("readout", h)))
    with module_attach(model, hooks):
        yield
