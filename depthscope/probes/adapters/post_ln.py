"""The post-LN family (BERT, MiniLM, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT, and any
transformers model whose layers compute LN(x + attn), then LN(. + mlp)): the ModelSpec of each, read
through its LayerNorms (``ModelSpec.norms``; the terms carried through them exactly: ``carry``).

The encoders the family names differ in module names and two switches only, so each model type is a
row of ``LAYOUTS``, which ``spec_of`` writes as the model's spec (what ``depthscope spec`` prints).
DistilBERT names its norms ``sa_layer_norm`` and ``output_layer_norm`` and has no token types.
RoBERTa-like models number positions from ``pad_token_id + 1``, so their context is that much
shorter than ``max_position_embeddings`` (the spec's ``ctx``). An ELECTRA whose ``embedding_size``
differs from ``hidden_size`` maps the normalised embeddings into the stream with
``embeddings_project``, a linear map named among the norms (``embed.proj``). Consumers: each layer's
input (its attention's), the attention block's normalised output (the MLP's input, read from a module
that sees the whole window where the feed-forward is chunked), and the last layer's output (the
read-out, what a pooling or head reads).

A model of another type is found post-LN from what its modules compute on a probe forward
(``find_layout``, for the transformers family when the model is not a sum of its writes), written as
a spec the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from depthscope.probes.adapters.base import Adapter
from depthscope.probes.adapters.carry import NAME, is_layer_norm
from depthscope.probes.adapters.family import Family
from depthscope.probes.adapters.hf import input_embedding, model_name, model_type, pretrained
from depthscope.probes.adapters.spec import ModelSpec, build_spec
from depthscope.probes.adapters.structure import Refused, error, fit, layer_list
from depthscope.schemes import names
from depthscope.trace.labels import READOUT


@dataclass(frozen=True)
class Layout:
    """Where one post-LN encoder type keeps its parts: paths under the base model, per-layer paths
    under ``{layers}.{i}``; a tap ends in ``:in`` or ``:out``.
    """

    embeddings: tuple[tuple[str, str], ...]  # (source label, module) in the order the model adds them
    layers: str
    attn_out: str  # the attention block's write, before its LayerNorm
    ln1: str  # the LayerNorm after the attention block
    mlp_in: str  # tap of the MLP's input seen once per batch (never inside a chunked feed-forward)
    mlp_out: str  # the MLP's write (called once per chunk where the feed-forward is chunked)
    ln2: str  # the LayerNorm after the MLP (likewise)
    embed_ln: str | None = "embeddings.LayerNorm"  # None: the embeddings' sum is the first layer's input
    project: str | None = None  # a linear map after the embedding LayerNorm, where the model has one
    padded_positions: bool = False  # positions start at pad_token_id + 1 (RoBERTa): a shorter context


BERT = Layout(
    embeddings=(
        (names.EMBED, "embeddings.word_embeddings"),
        ("token_type", "embeddings.token_type_embeddings"),
        ("pos_embed", "embeddings.position_embeddings"),
    ),
    layers="encoder.layer",
    attn_out="attention.output.dense",
    ln1="attention.output.LayerNorm",
    mlp_in="attention:out",
    mlp_out="output.dense",
    ln2="output.LayerNorm",
)
ROBERTA = replace(BERT, padded_positions=True)
LAYOUTS = {
    "bert": BERT,
    "roberta": ROBERTA,
    "xlm-roberta": ROBERTA,
    "camembert": ROBERTA,
    "electra": replace(BERT, project="embeddings_project"),
    "distilbert": replace(
        BERT,
        embeddings=BERT.embeddings[::2],  # no token types
        layers="transformer.layer",
        attn_out="attention.out_lin",
        ln1="sa_layer_norm",
        mlp_in="ffn:in",
        mlp_out="ffn",
        ln2="output_layer_norm",
    ),
}
MODEL_TYPES = tuple(LAYOUTS)  # model_type of the post-LN encoders this adapter reads (the loader asks)


def detect(model: Any) -> bool:
    """Whether ``model`` is a transformers post-LN encoder (``model_type`` in ``MODEL_TYPES``)."""
    return pretrained(model) and model_type(model) in MODEL_TYPES


def spec_of(model: Any, layout: Layout | None = None) -> ModelSpec:
    """The ModelSpec of a post-LN encoder from its type's row of ``LAYOUTS`` (paths under its base
    model, ``*`` the layer): what the family reads and ``depthscope spec`` prints.
    """
    cfg = model.config
    lay = layout or LAYOUTS[cfg.model_type]
    prefix = model.base_model_prefix
    base = getattr(model, prefix, None) if prefix else None
    p = f"{prefix}." if isinstance(base, torch.nn.Module) else ""
    at = f"{p}{lay.layers}.*"
    norms = {"embed.ln": f"{p}{lay.embed_ln}"} if lay.embed_ln else {}
    if lay.project and hasattr(base if p else model, lay.project):  # ELECTRA with embedding_size set
        norms["embed.proj"] = f"{p}{lay.project}"
    offset = (int(getattr(cfg, "pad_token_id", 0) or 0) + 1) if lay.padded_positions else 0
    last = int(cfg.num_hidden_layers) - 1
    return ModelSpec(
        embed={label: f"{p}{path}" for label, path in lay.embeddings},
        writes={names.ATTN: f"{at}.{lay.attn_out}", names.MLP: f"{at}.{lay.mlp_out}"},
        norms={**norms, "ln1": f"{at}.{lay.ln1}", "ln2": f"{at}.{lay.ln2}"},
        reads={
            names.ATTN: f"{at}:in",
            names.MLP: f"{at}.{lay.mlp_in}",
            READOUT: f"{p}{lay.layers}.{last}:out",
        },
        ctx=_context(cfg, offset),
        label=model_name(model),
        scheme="post-ln",
    )


def build(model: Any, spec: ModelSpec | None = None, *, probe: Any = None, origin: str = "layout") -> Adapter:
    """The family's adapter: ``spec`` (default: the model type's row of ``LAYOUTS``) built and checked
    by ``build_spec`` on the ``probe`` where one is given; ``origin`` is what the trace's ``layout``
    attr says the spec came from (``layout``: a row; ``structure``: ``find_layout``).
    """
    read = build_spec(model, spec or spec_of(model), probe=probe)
    return dataclasses.replace(read, attrs={**read.attrs, "layout": f"post-ln {origin}"})


def _context(cfg: Any, offset: int) -> int:
    """The window a model's position table allows, ``offset`` positions short (RoBERTa's pad id)."""
    return int(getattr(cfg, "max_position_embeddings", 0) or 1 << 16) - offset


def _inside(outer: str, path: str) -> bool:
    return path.startswith(outer + ".")


def _embedding_label(path: str, used: set[str]) -> str:
    name = path.rsplit(".", 1)[-1].lower()
    label = "pos_embed" if "position" in name else "token_type" if "token_type" in name else name
    while label in used or label in (names.EMBED, "embed.ln", "embed.proj"):
        label += "_"
    used.add(label)
    return label


def find_layout(model: Any, probe: Any) -> ModelSpec:
    """The post-LN spec of any transformers model, found on the probe (``structure.Probe``) from
    what its modules compute, not from their names or classes; ``structure.Refused`` naming the
    check that fails. Every layer must compute, in this order:

    * ``ln1(x + a)`` with ``x`` the layer's input and ``a`` the output of one module inside it (the
      attention's write), ``ln1`` a LayerNorm;
    * ``ln2(ln1_out + m)`` with ``m`` the output of one module that runs after ``ln1`` (the MLP's
      write), ``ln2`` a LayerNorm whose output is the layer's output;

    and before the first layer, the first layer's input is a LayerNorm of (or, without one, equal
    to) a scaled sum of embedding modules' outputs, the model's input embedding called first (a
    scale other than 1: Marian's sqrt(d_model) applied outside its embedding). The layers are the
    longest ModuleList whose every layer reads the previous one's output. A module that a chunked
    feed-forward calls more than once is refused (only ``LAYOUTS`` rows read chunked encoders).
    """
    layers, ran = layer_list(model, probe, every=True)
    relative = None
    for i, call in ran:
        rel = _layer_parts(probe, f"{layers}.{i}", i, call)
        if relative is not None and rel != relative:
            raise Refused(f"layer {i} is built otherwise than layer 0 ({rel} against {relative})")
        relative = rel
    attn_out, ln1, mlp_out, ln2 = relative
    labels, paths, scales, embed_ln, padded, project = _embedding_parts(model, probe, layers, ran[0][1])
    at = f"{layers}.*"
    norms = {"embed.ln": embed_ln} if embed_ln else {}
    norms.update({"embed.proj": project} if project else {})
    first = "embed.ln" if embed_ln else f"0.{names.ATTN}"  # reads the embeddings' (scaled) sum
    cfg = model.config if pretrained(model) else None  # a plain module: its position table says the context
    offset = (int(getattr(cfg, "pad_token_id", 0) or 0) + 1) if padded and cfg is not None else 0
    return ModelSpec(
        embed=dict(zip(labels, paths)),
        writes={names.ATTN: f"{at}.{attn_out}", names.MLP: f"{at}.{mlp_out}"},
        norms={**norms, "ln1": f"{at}.{ln1}", "ln2": f"{at}.{ln2}"},
        reads={names.ATTN: f"{at}:in", names.MLP: f"{at}.{ln1}:out", READOUT: f"{layers}.{ran[-1][0]}:out"},
        static={first: list(scales)} if any(c != 1.0 for c in scales) else {},
        ctx=_context(cfg, offset) if cfg is not None else None,
        label=model_name(model) if cfg is not None else None,
        scheme="post-ln",
    )


def _layer_parts(probe: Any, at: str, i: int, call: Any) -> tuple[str, str, str, str]:
    """(attention write, ln1, MLP write, ln2) of layer ``i`` at ``at``, relative to it (``find_layout``)."""
    tol = probe.tolerance()
    inner = [c for c in probe.calls if _inside(at, c.path) and c.input is not None and c.output is not None]
    norms = [c for c in inner if is_layer_norm(c.module)]
    if len(norms) != 2:
        raise Refused(f"layer {i} runs {len(norms)} LayerNorms on the stream, not the 2 of a post-LN layer")
    ln1, ln2 = norms
    if error(call.output, ln2.output) > tol:
        raise Refused(f"layer {i}'s output is not its last LayerNorm's output (not post-LN)")

    def write(target: Tensor, base: Tensor, after: int, before: int) -> Any:
        return next(
            (
                c
                for c in inner
                if after < c.index < before
                and probe.count.get(c.path) == 1
                and not is_layer_norm(c.module)
                and c.output.shape[-1] == target.shape[-1]
                and error(target, base + c.output.double()) <= tol
            ),
            None,
        )

    a = write(ln1.input, call.input.double(), call.index, ln1.index)
    m = write(ln2.input, ln1.output.double(), ln1.index, ln2.index)
    if a is None or m is None:
        which = "attention" if a is None else "MLP"
        raise Refused(f"layer {i}: no module's output is the {which} write its LayerNorm adds to the stream")
    return tuple(c.path[len(at) + 1 :] for c in (a, ln1, m, ln2))


def _embedding_parts(model: Any, probe: Any, layers: str, first: Any) -> tuple:
    """(labels, paths, scales, embedding LayerNorm or None, padded positions) before the layers."""
    tol = probe.tolerance()
    modules = dict(model.named_modules())
    before = [c for c in probe.calls if c.index < first.index and not _inside(layers, c.path)]
    norms = [c for c in before if is_layer_norm(c.module) and c.output is not None and c.input is not None]
    embed_ln = norms[-1] if norms and error(first.input, norms[-1].output) <= tol else None
    project = None
    if embed_ln is None and norms:  # a linear map from the embeddings' width into the stream's (RemBERT)
        project = next(
            (
                c
                for c in before
                if isinstance(c.module, torch.nn.Linear)
                and c.index > norms[-1].index
                and c.input is not None
                and c.output is not None
                and error(c.input, norms[-1].output) <= tol
                and error(first.input, c.output) <= tol
            ),
            None,
        )
        embed_ln = norms[-1] if project is not None else None
    target = embed_ln.input if embed_ln is not None else first.input
    called = [c for c in before if isinstance(c.module, torch.nn.Embedding) and probe.count.get(c.path) == 1]
    values = _outputs(probe, called)  # [batch or 1, pos, width], 2-D ones too
    embeds = [
        c for c in called if values.get(c.path) is not None and values[c.path].shape[-1] == target.shape[-1]
    ]
    embedding = input_embedding(model) if pretrained(model) else None  # a plain module: the first called
    word = next((p for p, m in modules.items() if m is embedding), None) if embedding is not None else None
    word = word if word is not None or not embeds else embeds[0].path
    if not embeds or embeds[0].path != word:
        raise Refused("the input embedding is not the first embedding the model calls before its layers")
    for k in range(len(embeds), 0, -1):  # the embeddings the sum holds: the first k that fit
        scales = fit(target, values[word], [values[e.path] for e in embeds[1:k]], tol, keep=True)
        if scales is not None:
            embeds = embeds[:k]
            break
    else:
        raise Refused("the first layer's input is not a LayerNorm of a scaled sum of the embeddings")
    used: set[str] = set()
    labels = [names.EMBED] + [_embedding_label(e.path, used) for e in embeds[1:]]
    padded = any(
        getattr(modules[e.path], "padding_idx", None) is not None for e in embeds[1:] if "position" in e.path
    )
    ln = embed_ln.path if embed_ln is not None else None
    proj = project.path if project is not None else None
    return labels, [e.path for e in embeds], tuple(float(c) for c in scales), ln, padded, proj


def _outputs(probe: Any, calls: list) -> dict[str, Tensor]:
    """The recorded outputs of ``calls`` as [batch or 1, pos, width]: one of shape [pos, width],
    shared over the batch, gets a leading 1; other shapes are left out.
    """
    got = {}
    for c in calls:
        t = c.raw_out
        if isinstance(t, Tensor) and t.ndim in (2, 3):
            got[c.path] = t.unsqueeze(0) if t.ndim == 2 else t
    return got


FAMILY = Family(
    name=NAME,
    reads=(
        "transformers post-LN encoders (bert, roberta, xlm-roberta, camembert, electra, distilbert): "
        "every term propagated through each LayerNorm (and ELECTRA's embedding projection), LayerNorm "
        "biases as sources; M = accumulated 1/sigma"
    ),
    detect=detect,
    build=build,
    model_types=MODEL_TYPES,
    priority=20,
)
