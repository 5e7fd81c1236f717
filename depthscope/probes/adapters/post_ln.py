"""Adapter for post-LN encoders (BERT, MiniLM, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT):
an exact decomposition through every LayerNorm.

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

The encoders differ in module names and two switches only, so each model type is a row of
``LAYOUTS``. DistilBERT names its norms ``sa_layer_norm`` and ``output_layer_norm`` and has no
token types. RoBERTa-like models number positions from ``pad_token_id + 1``, so their context is
that much shorter than ``max_position_embeddings``. An ELECTRA whose ``embedding_size`` differs
from ``hidden_size`` maps the normalised embeddings into the stream with ``embeddings_project``, a
linear map: every term goes through its weight exactly and its bias is one more source
(``embed.proj``); the embeddings' source values (what ``source_rms`` measures) are then their
images under that weight, in the stream's width, since a trace's sources share one width.

Feed-forward chunking (``chunk_size_feed_forward > 0``): transformers runs the feed-forward once
per chunk of positions, so the modules inside it see one chunk at a time. The MLP's input is read
from a module that sees the whole batch (the attention block's output, DistilBERT's ``ffn``), and
the MLP's write and its LayerNorm's input are assembled from their chunks at the layer's output,
before anything reads them. The window must then be a multiple of the chunk size (transformers'
own requirement), refused in one line otherwise.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters.base import (
    Adapter,
    Callback,
    ConsumerSpec,
    SourceSpec,
    call_model,
    config_values,
    module_attach,
    router,
)
from depthscope.probes.adapters.family import Family
from depthscope.probes.adapters.hf import input_embedding, model_name, model_type, pretrained, text_encoder
from depthscope.probes.terms import Terms
from depthscope.probes.workspace import Workspace
from depthscope.schemes import names

NAME = "post-ln"
MIXING_MEANING = (
    "post-LN: mixing is the token mean of prod 1/sigma over the LayerNorms between source and consumer; "
    "gamma and the centring are inside the terms, and each LayerNorm bias is a source"
)


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
    scales: tuple[float, ...] = ()  # each embedding's static scale (Marian's sqrt(d)); empty: all 1
    origin: str = "layout"  # "layout" (a row of LAYOUTS) or "structure" (found on a probe forward)


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


@dataclass(frozen=True)
class _Plan:
    """One model's layout resolved: the base model's path prefix, the layer count, whether the
    embeddings are projected, the feed-forward chunk size.
    """

    layout: Layout
    prefix: str  # "bert." for a model with a head, "" for the base model
    n_layers: int
    project: str | None  # the projection's path under the base model, where this model has one
    chunk: int  # chunk_size_feed_forward (0: the feed-forward sees the whole batch)

    def paths(self) -> list[str]:
        """Every module the hooks read, as full paths."""
        lay, p = self.layout, self.prefix
        out = [f"{p}{path}" for _, path in lay.embeddings] + ([f"{p}{lay.embed_ln}"] if lay.embed_ln else [])
        out += [f"{p}{self.project}"] if self.project else []
        for i in range(self.n_layers):
            at = f"{p}{lay.layers}.{i}"
            out += [at] + [f"{at}.{m}" for m in (lay.attn_out, lay.ln1, lay.mlp_in.partition(":")[0])]
            out += [f"{at}.{lay.mlp_out}", f"{at}.{lay.ln2}"]
        return out


def _plan(model: Any, found: Layout | None = None) -> _Plan:
    cfg = model.config
    layout = found or LAYOUTS[cfg.model_type]
    prefix = model.base_model_prefix if found is None else ""  # a found layout holds full paths
    base = getattr(model, prefix, None) if prefix else None
    p = f"{prefix}." if isinstance(base, torch.nn.Module) else ""
    base = base if p else model
    project = layout.project if layout.project and (found or hasattr(base, layout.project)) else None
    n_layers = len(model.get_submodule(layout.layers)) if found else int(cfg.num_hidden_layers)
    chunk = 0 if found else int(getattr(cfg, "chunk_size_feed_forward", 0) or 0)  # found: runs once
    plan = _Plan(layout, p, n_layers, project, chunk)
    for path in plan.paths():  # a config the layout does not describe: one line, not a hook's traceback
        try:
            model.get_submodule(path)
        except AttributeError:
            raise DepthscopeError(
                f"the post-LN adapter reads {cfg.model_type} models with a module {path!r}; this "
                f"{type(model).__name__} has none"
            ) from None
    return plan


def build(model: Any, found: Layout | None = None) -> Adapter:
    """The adapter of a post-LN model: embeddings, sublayer outputs and LayerNorm biases as sources;
    each consumer gets its terms propagated through the LayerNorms before it. ``found``: a layout
    found by ``find_layout`` (any post-LN model), else the model type's row of ``LAYOUTS``.
    """
    cfg = model.config
    plan = _plan(model, found)
    n = plan.n_layers
    # in the order the model computes them (the terms are kept in that order)
    srcs = [SourceSpec(label, label, names.EMBED, 0) for label, _ in plan.layout.embeddings]
    if plan.layout.embed_ln:
        srcs.append(SourceSpec("embed.ln", "embed.ln", names.BIAS, 0))
    if plan.project:
        srcs.append(SourceSpec("embed.proj", "embed.proj", names.BIAS, 0))
    cons = []
    for i in range(n):
        for kind, depth, ln in ((names.ATTN, 2 * i + 1, "ln1"), (names.MLP, 2 * i + 2, "ln2")):
            label = names.label(i, kind)
            cons.append(
                ConsumerSpec(label, f"{label}.in", kind, depth, len(srcs), f"{label}.terms", terms=True)
            )
            srcs += [
                SourceSpec(label, label, kind, depth),
                SourceSpec(f"{i}.{ln}", f"{i}.{ln}", names.BIAS, depth),
            ]
    cons.append(
        ConsumerSpec(
            names.READOUT, "readout.in", names.READOUT, 2 * n + 1, len(srcs), "readout.terms", terms=True
        )
    )
    name = model_name(model)
    keep = (
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "embedding_size",
        "num_attention_heads",
        "intermediate_size",
        "hidden_dim",
        "vocab_size",
        "max_position_embeddings",
        "layer_norm_eps",
        "chunk_size_feed_forward",
    )
    offset = (int(getattr(cfg, "pad_token_id", 0) or 0) + 1) if plan.layout.padded_positions else 0
    n_dense = sum(s.kind != names.BIAS for s in srcs)  # the biases are carried as vectors
    return Adapter(
        family=NAME,
        sources=srcs,
        consumers=cons,
        attrs={
            "scheme": "post-ln",
            "variant": name,
            "label": name,
            "config": json.dumps(config_values(cfg, keep, keep_none=True), sort_keys=True, default=str),
            "mixing_meaning": MIXING_MEANING,
            "layout": f"post-ln {plan.layout.origin}",  # "post-ln layout" (a row) or "post-ln structure"
        },
        ctx=int(getattr(cfg, "max_position_embeddings", 0) or 1 << 16) - offset,
        vocab=int(cfg.vocab_size),
        encode=text_encoder(model, "a post-LN encoder's token ids are word pieces, not bytes"),
        attach=lambda m, taps, ws=None: _attach(m, taps, plan, len(srcs), n_dense, ws or Workspace()),
        workspace=True,  # the terms' buffers, from batch to batch
        forward=_chunked_forward(plan.chunk) if plan.chunk else call_model,
        views=False,  # a post-LN layer's input is the stream itself
    )


def _chunked_forward(chunk: int):
    """``model(tokens)``, the window first checked against the feed-forward's chunk size."""

    def forward(model: Any, tokens: Tensor) -> Any:
        if tokens.shape[1] % chunk:
            raise DepthscopeError(
                f"the model runs its feed-forward in chunks of {chunk} positions (chunk_size_feed_forward), "
                f"so the window must be a multiple of {chunk}; got {tokens.shape[1]} (set --ctx)"
            )
        return model(tokens)

    return forward


class _Terms:
    """The terms of the current hidden state and their accumulated 1/sigma, batch by batch.

    Per batch, source-major (``accumulate.Terms``): ``dense`` [dense sources, batch, pos, d_model]
    holds the terms of the sublayers and the word embeddings whole; two groups of vectors hold the
    terms that are one vector per position times a per-token factor: ``const`` [k, 1, 1, d] (each
    LayerNorm bias, and an embedding that is the same at every token, such as the token type of
    text without segments) and ``window`` [j, 1, pos, d] (an embedding the same in every window:
    the position embedding). ``scale`` [source, batch, pos] is every term's accumulated 1/sigma.
    Each LayerNorm updates the live terms in place, and a consumer hands the engine views of them
    (the engine folds them before the next LayerNorm). The sum of the terms, ``rebuilt``, is carried
    alongside by the same linear maps (O(d) per token and LayerNorm), so the engine need not sum the
    terms again at every consumer.
    Where the embeddings are projected (``hold``), their terms start in buffers of the embedding
    width and their values reach the engine only once projected into the stream's width. The MLP's
    write and its LayerNorm's input arrive in chunks of positions (``part``, ``norm_part``) and
    reach the engine whole (``flush``).
    """

    GROUPS = ("const", "window")

    def __init__(self, send, n_sources: int, n_dense: int, n_embed: int, hold: bool, workspace: Workspace):
        self.send, self.hold = send, hold
        self.sizes = {"dense": n_dense, "const": n_sources, "window": n_embed, "scale": n_sources}
        # the engine's, lent for the batch and kept by it from batch to batch: the buffers ("embed"
        # before a projection, "stream") and the index tensors
        self.ws = workspace
        self.buf: dict[str, Tensor] = {}
        self.count: dict[str, int] = {}  # live terms per group ("dense", "const", "window")
        self.at: dict[str, list[int]] = {}  # the source index of each live term, per group
        self.n = 0  # live terms in all
        self.held: list[tuple[str, Tensor]] | None = None  # sources waiting for the projection
        self.parts: list[Tensor] = []  # chunks of the MLP's write
        self.xs: list[Tensor] = []  # chunks of its LayerNorm's input

    def _buffers(self, slot: str, lead: tuple[int, int], d: int, like: Tensor) -> dict[str, Tensor]:
        shapes = {
            "dense": (self.sizes["dense"], *lead, d),
            "const": (self.sizes["const"], 1, 1, d),
            "window": (self.sizes["window"], 1, lead[1], d),
            "scale": (self.sizes["scale"], *lead),
        }
        return {k: self.ws.buffer(("post-ln", slot, k), shape, like) for k, shape in shapes.items()}

    def start(self, key: str, t: Tensor) -> None:
        """A new batch, from its first source [batch, pos, d]."""
        self.buf = self._buffers("embed" if self.hold else "stream", t.shape[:2], t.shape[-1], t)
        self.count = {"dense": 0, "const": 0, "window": 0}
        self.at = {"dense": [], "const": [], "window": []}
        self.n = 0
        self.rebuilt = torch.zeros_like(t)
        self.held = [] if self.hold else None
        self.parts, self.xs = [], []
        self.source(key, t)

    def _add(self, group: str, key: str, value: Tensor, whole: Tensor) -> None:
        """Term ``value`` (its group's shape) of source ``key``, whose value is ``whole`` [batch, pos, d]."""
        self.buf[group][self.count[group]] = value
        self.count[group] += 1
        self.at[group].append(self.n)
        if self.held is not None:
            self.held.append((key, whole))
        else:
            self.send(key, whole)
        self.buf["scale"][self.n] = 1.0
        self.rebuilt += value
        self.n += 1

    def source(self, key: str, t: Tensor) -> None:
        """A new term, kept whole with scale 1; sent to the engine as a source (or held for the
        projection).
        """
        self._add("dense", key, t, t)

    def embedding(self, key: str, t: Tensor) -> None:
        """An embedding after the first: kept as a vector where it is one per position in every
        window ([1, pos, d]: the position embedding) or, on a CPU, one for every token (compared
        exactly; on an accelerator the comparison would wait for the device, so it stays whole).
        """
        batch = self.rebuilt.shape[0]
        if t.shape[0] == 1 and batch > 1:
            self._add("window", key, t, t.expand(batch, -1, -1))
        elif t.device.type == "cpu" and torch.equal(t, t[:1, :1].expand_as(t)):
            self._add("const", key, t[:1, :1], t)
        else:
            self._add("dense", key, t.expand(batch, -1, -1), t.expand(batch, -1, -1))

    def bias(self, key: str, v: Tensor) -> None:
        """A new term that is the vector ``v`` [d] at every token (a bias): kept as one vector."""
        self._add("const", key, v.view(1, 1, -1), v.expand_as(self.rebuilt))

    def normalise(self, ln: torch.nn.LayerNorm, x: Tensor, bias_key: str) -> None:
        """Propagate every term through ``ln`` applied to ``x`` (= their sum), then add its bias."""
        # that token's 1/sigma; the variance as the centred input's squared norm (a BLAS-fast
        # reduction, ten times faster on a CPU than Tensor.var's kernel, the same two-pass sum)
        d = x.shape[-1]
        norm = torch.linalg.vector_norm(x - x.mean(-1, keepdim=True), dim=-1, keepdim=True)
        inv = norm.square_().div_(d).add_(ln.eps).rsqrt_()  # [batch, pos, 1], in place: few calls
        gain = (inv * ln.weight if ln.weight is not None else inv).flatten(0, 1)  # [T, d]
        live = self.buf["dense"][: self.count["dense"]].flatten(1, 2)  # [m, T, d]
        # whole-tensor, in place: the means as one reduction over the features (4.3x faster here than
        # a matrix-vector product with 1/d, whose rows of d are too short for BLAS), then one centring
        # and one scaling pass (measured faster than cache-sized token chunks: per-chunk calls dominate)
        live.sub_(live.mean(-1, keepdim=True)).mul_(gain)
        for group in self.GROUPS:  # the fixed part of the map; the token's 1/sigma goes into scale
            vec = self.buf[group][: self.count[group]]
            vec.sub_(vec.mean(-1, keepdim=True))
            if ln.weight is not None:
                vec.mul_(ln.weight)
        r = self.rebuilt  # this batch's own buffer (the engine has folded every view of it)
        r.sub_(r.mean(-1, keepdim=True)).mul_(gain.view_as(r))
        self.buf["scale"][: self.n].mul_(inv.squeeze(-1))
        self.bias(bias_key, ln.bias if ln.bias is not None else x.new_zeros(x.shape[-1]))

    def project(self, linear: torch.nn.Linear, bias_key: str) -> None:
        """Map every term through ``linear``'s weight into the stream's width (the map is linear, so
        the sum of the mapped terms plus its bias is its output); its bias is a new source.
        """
        w = linear.weight  # [d_model, d_embed]
        old = self.buf
        self.buf = self._buffers("stream", old["scale"].shape[1:], w.shape[0], old["dense"])
        for group, k in self.count.items():
            self.buf[group][:k] = old[group][:k] @ w.T
        self.buf["scale"][: self.n] = old["scale"][: self.n]
        self.rebuilt = self.rebuilt @ w.T
        held, self.held = self.held or [], None
        for key, value in held:  # each source's value in the stream's width: its image under the weight
            self.send(key, value @ w.T)
        self.bias(bias_key, linear.bias if linear.bias is not None else w.new_zeros(w.shape[0]))

    def part(self, t: Tensor) -> None:
        """A chunk of positions of the MLP's write."""
        self.parts.append(t)

    def norm_part(self, x: Tensor) -> None:
        """A chunk of positions of the input of the LayerNorm after the MLP."""
        self.xs.append(x)

    def flush(self, key: str, ln: torch.nn.LayerNorm, bias_key: str) -> None:
        """The layer is done: its MLP's write, whole, is a source; its LayerNorm propagates the terms."""
        if not self.parts or not self.xs:  # the engine reports the source that never fired
            return
        t = torch.cat(self.parts, 1) if len(self.parts) > 1 else self.parts[0]
        x = torch.cat(self.xs, 1) if len(self.xs) > 1 else self.xs[0]
        self.parts, self.xs = [], []
        self.source(key, t)
        self.normalise(ln, x, bias_key)

    def _index(self, group: str, device: torch.device) -> Tensor:
        """The source indices of a group's live terms, as a tensor (the same in every batch: cached)."""
        key = ("post-ln index", group, tuple(self.at[group]), device)
        return self.ws.constant(key, lambda: torch.tensor(key[2], dtype=torch.long, device=device))

    def consumer(self, key: str, h: Tensor) -> None:
        """Consumer ``key``'s input and its terms (views, folded by the engine at once)."""
        self.send(f"{key}.in", h)
        at = lambda group: self._index(group, h.device)  # noqa: E731
        live = lambda group: self.buf[group][: self.count[group]]  # noqa: E731
        vecs = tuple((live(g), at(g)) for g in self.GROUPS if self.count[g])
        self.send(
            f"{key}.terms", Terms(live("dense"), at("dense"), vecs, self.buf["scale"][: self.n], self.rebuilt)
        )


@contextlib.contextmanager
def _attach(
    model: Any, taps: list[tuple[str, Callback]], plan: _Plan, n_sources: int, n_dense: int, ws: Workspace
):
    state = _Terms(
        router(taps), n_sources, n_dense, len(plan.layout.embeddings), plan.project is not None, ws
    )
    with module_attach(model, _hooks(model, plan, state)):
        yield


def _hooks(model: Any, plan: _Plan, state: _Terms) -> list[tuple[str, Callback]]:
    """Every (tap, callback) of one model, in the order the forward reaches them."""
    lay, p = plan.layout, plan.prefix

    def layer_norm(path: str, bias_key: str):
        ln = model.get_submodule(path)
        return lambda x: state.normalise(ln, x, bias_key)

    scales = lay.scales or (1.0,) * len(lay.embeddings)

    def scaled(f: Callback, c: float) -> Callback:
        """An embedding's write as the stream receives it: [pos, d] as [1, pos, d], times its scale."""

        def write(t: Tensor) -> None:
            t = t.unsqueeze(0) if t.ndim == 2 else t
            f(t * c if c != 1.0 else t)

        return write

    ((first, first_path), *rest), (c0, *cs) = lay.embeddings, scales
    hooks = [(f"{p}{first_path}:out", scaled(lambda t: state.start(first, t), c0))]  # a new batch starts here
    hooks += [
        (f"{p}{path}:out", scaled(lambda t, key=label: state.embedding(key, t), c))
        for (label, path), c in zip(rest, cs)
    ]
    if lay.embed_ln:
        hooks.append((f"{p}{lay.embed_ln}:in", layer_norm(f"{p}{lay.embed_ln}", "embed.ln")))
    if plan.project:
        linear = model.get_submodule(f"{p}{plan.project}")
        hooks.append((f"{p}{plan.project}:in", lambda x: state.project(linear, "embed.proj")))
    for i in range(plan.n_layers):
        at = f"{p}{lay.layers}.{i}"
        ln2 = model.get_submodule(f"{at}.{lay.ln2}")
        hooks += [
            (f"{at}:in", lambda h, i=i: state.consumer(f"{i}.attn", h)),
            (f"{at}.{lay.attn_out}:out", lambda t, i=i: state.source(f"{i}.attn", t)),
            (f"{at}.{lay.ln1}:in", layer_norm(f"{at}.{lay.ln1}", f"{i}.ln1")),
            (f"{at}.{lay.mlp_in}", lambda h, i=i: state.consumer(f"{i}.mlp", h)),
            (f"{at}.{lay.mlp_out}:out", state.part),
            (f"{at}.{lay.ln2}:in", state.norm_part),
            (f"{at}:out", lambda h, i=i, ln=ln2: state.flush(f"{i}.mlp", ln, f"{i}.ln2")),
        ]
    # after the last layer's flush (hooks on one module run in the order they were registered)
    hooks.append((f"{p}{lay.layers}.{plan.n_layers - 1}:out", lambda h: state.consumer("readout", h)))
    return hooks


# --- post-LN by structure: the layout found on a probe forward ----------------------------------


def _is_layer_norm(module: Any) -> bool:
    return isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith("LayerNorm")


def _inside(outer: str, path: str) -> bool:
    return path.startswith(outer + ".")


def _embedding_label(path: str, used: set[str]) -> str:
    name = path.rsplit(".", 1)[-1].lower()
    label = "pos_embed" if "position" in name else "token_type" if "token_type" in name else name
    while label in used or label in (names.EMBED, "embed.ln", "embed.proj"):
        label += "_"
    used.add(label)
    return label


def find_layout(model: Any, probe: Any) -> Layout:
    """The post-LN layout of any transformers model, found on the probe (``structure.Probe``) from
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
    from depthscope.probes.adapters.structure import Refused, layer_list

    layers, ran = layer_list(model, probe, every=True)
    relative = None
    for i, call in ran:
        rel = _layer_parts(probe, f"{layers}.{i}", i, call)
        if relative is not None and rel != relative:
            raise Refused(f"layer {i} is built otherwise than layer 0 ({rel} against {relative})")
        relative = rel
    attn_out, ln1, mlp_out, ln2 = relative
    labels, paths, scales, embed_ln, padded, project = _embedding_parts(model, probe, layers, ran[0][1])
    return Layout(
        embeddings=tuple(zip(labels, paths)),
        layers=layers,
        attn_out=attn_out,
        ln1=ln1,
        mlp_in=f"{ln1}:out",
        mlp_out=mlp_out,
        ln2=ln2,
        embed_ln=embed_ln,
        project=project,
        padded_positions=padded,
        scales=scales,
        origin="structure",
    )


def _layer_parts(probe: Any, at: str, i: int, call: Any) -> tuple[str, str, str, str]:
    """(attention write, ln1, MLP write, ln2) of layer ``i`` at ``at``, relative to it (``find_layout``)."""
    from depthscope.probes.adapters.structure import Refused, error

    tol = probe.tolerance()
    inner = [c for c in probe.calls if _inside(at, c.path) and c.input is not None and c.output is not None]
    norms = [c for c in inner if _is_layer_norm(c.module)]
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
                and not _is_layer_norm(c.module)
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
    from depthscope.probes.adapters.structure import Refused, error, fit

    tol = probe.tolerance()
    modules = dict(model.named_modules())
    before = [c for c in probe.calls if c.index < first.index and not _inside(layers, c.path)]
    norms = [c for c in before if _is_layer_norm(c.module) and c.output is not None and c.input is not None]
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
    embedding = input_embedding(model)
    word = next((p for p, m in modules.items() if m is embedding), None) if embedding is not None else None
    called = [c for c in before if isinstance(c.module, torch.nn.Embedding) and probe.count.get(c.path) == 1]
    values = _outputs(probe, called)  # [batch or 1, pos, width], 2-D ones too
    embeds = [
        c for c in called if values.get(c.path) is not None and values[c.path].shape[-1] == target.shape[-1]
    ]
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
