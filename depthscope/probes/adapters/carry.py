"""Terms carried through a post-LN model's norms: the reader of a ``ModelSpec`` with ``norms=``
(``spec.build_spec`` resolves and probes its sites, this module checks them and builds the adapter),
which the post-LN family (``post_ln``) and a user's spec share.

A post-LN layer normalises the sum of its input and its sublayer's output, so the stream is not a
sum of sublayer outputs (TransformerLens's ``decompose_resid`` is silently wrong here). But for
each token a LayerNorm is affine given that token's mean and standard deviation:

    LN(x) = gamma * (x - mean(x)) / sigma(x) + beta,   x = sum_s c_s
          = sum_s gamma * (c_s - mean(c_s)) / sigma(x) + beta

so every term propagates through each later LayerNorm as gamma * (c - mean(c)) / sigma, with the
sigma of the whole sum (that token's), and each LayerNorm's bias becomes a source of its own (kind
``bias``, labelled by the norm's key: ``embed.ln``, ``{i}.ln1``). A linear map into the stream's
width (ELECTRA's ``embeddings_project``) carries every term through its weight exactly, its bias one
more source; the embeddings' source values are then their images under that weight, in the
stream's width, since a trace's sources share one width. Each hidden state is again exactly the sum
of its terms, which the engine checks on every batch, and the spec is checked on the probe first:
the embeddings start the stream, a write adds to it, a norm reads it and computes a LayerNorm (or
linear map) of it, a read reads it.

What the trace's variables mean here: ``contribution_share`` and ``norm_share`` are computed from
the carried terms, exactly. ``mixing`` of source s at consumer l is the accumulated factor
prod 1/sigma over the LayerNorms between them (per token, then the token mean): the scale the
stream applied to the source's term, gamma and the centring being inside the terms; a bias
enters with 1 at its own LayerNorm.

Feed-forward chunking (``chunk_size_feed_forward > 0``): transformers runs the feed-forward once
per chunk of positions, so a write and a norm inside it see one chunk at a time; the chunks of a
write wait, and the norm's propagation runs once the chunks of its input make the whole window.
The window must then be a multiple of the chunk size (transformers' own requirement), refused in
one line otherwise; the probe forward runs one chunk.
"""

from __future__ import annotations

import json
import math
from functools import partial
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
from depthscope.probes.adapters.hf import byte_encoder, model_name, pretrained, text_encoder
from depthscope.probes.adapters.structure import FLOAT_TOLERANCE, PROBE_TOLERANCE, Refused, error
from depthscope.probes.terms import Terms
from depthscope.probes.workspace import Workspace
from depthscope.schemes import names
from depthscope.trace.labels import EMBED, READOUT

NAME = "post-ln"
MIXING_MEANING = (
    "post-LN: mixing is the token mean of prod 1/sigma over the LayerNorms between source and consumer; "
    "gamma and the centring are inside the terms, and each LayerNorm bias is a source"
)


KEEP = (  # the config values a post-LN trace records
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


def chunk_of(model: Any) -> int:
    """The positions a transformers model runs its feed-forward on at once (0: the whole window)."""
    return int(getattr(getattr(model, "config", None), "chunk_size_feed_forward", 0) or 0)


def adapter(
    model: Any, spec: Any, roles: list, values: dict, named: list, output, vocab: int, ctx: int, chunk: int
) -> Adapter:
    """The adapter of a spec with norms (``ModelSpec.norms``), its sites resolved by ``spec.build_spec``:
    ``roles`` (role, site) in the order the probe forward reached them, ``values`` each site's probe
    value (``spec._value``), ``named`` the embeddings (label, site) as named, ``output(path)`` a
    module's probe output; ``chunk`` the feed-forward's chunk size (0: none). Checked on the probe
    (``_Walk``): embeddings, writes and each norm's bias are sources, and each read gets its terms
    carried through the norms before it.
    """
    forward = spec.forward or call_model
    walk = _Walk(model, spec, roles, values, named, output)
    label = spec.label or (model_name(model) if pretrained(model) else type(model).__name__)
    cfg = getattr(model, "config", None)
    described = config_values(cfg, KEEP, keep_none=True) if pretrained(model) else spec.describe()
    n_dense = sum(s.kind != names.BIAS for s in walk.sources)  # the biases are carried as vectors
    hold = any(role == "norm" and isinstance(walk.module(s), torch.nn.Linear) for role, s in roles)
    layouts = {tap: layout for tap, (_, layout, _) in values.items()}

    def attach(m: Any, taps: list[tuple[str, Callback]], ws: Workspace | None = None):
        state = _Terms(router(taps), len(walk.sources), n_dense, len(named), hold, ws or Workspace())
        return module_attach(m, walk.hooks(state), layouts=layouts)

    def run(m: Any, ids: Tensor) -> Any:
        if chunk and ids.shape[1] % chunk:
            raise DepthscopeError(
                f"the model runs its feed-forward in chunks of {chunk} positions (chunk_size_feed_forward), "
                f"so the window must be a multiple of {chunk}; got {ids.shape[1]} (set --ctx)"
            )
        return forward(m, ids)

    return Adapter(
        family=NAME,
        sources=walk.sources,
        consumers=walk.consumers,
        attrs={
            "scheme": spec.scheme,
            "variant": label,
            "label": label,
            "config": json.dumps(described, sort_keys=True, default=str),
            "mixing_meaning": MIXING_MEANING,
            "layout": "post-ln spec",  # the family says "post-ln layout" or "post-ln structure"
            "weights_found": json.dumps({c.label: "carried" for c in walk.consumers}, sort_keys=True),
        },
        ctx=ctx,
        vocab=vocab,
        encode=(
            text_encoder(model, "a post-LN encoder's token ids are word pieces, not bytes")
            if pretrained(model)
            else byte_encoder(vocab, label)
        ),
        attach=attach,
        workspace=True,  # the terms' buffers, from batch to batch
        forward=run,
        views=False,  # a post-LN layer's input is the stream itself
    )


class _Walk:
    """A post-LN spec's sites in the order the forward reaches them, walked once on the probe: the
    sources and consumers they make, and the check that they describe the model: the embeddings
    (the first named first, each times its scale) start the stream, a write adds to it, a norm's input
    is it and its output (a LayerNorm of its input, or a linear map) is the stream from then on, a
    read reads it; ``Refused`` naming the first site that is not so.
    """

    def __init__(self, model: Any, spec: Any, roles: list, values: dict, named: list, output):
        self.model, self.roles, self.labels, self.output = model, roles, {}, output
        self.sources: list[SourceSpec] = []
        self.consumers: list[ConsumerSpec] = []
        n_embed = len(named)
        embed_labels = [label for label, _ in named]
        if [site for _, site in roles[:n_embed]] != [site for _, site in named]:
            raise Refused(
                "ModelSpec: the embeddings must run in the order named (the token embedding first), before "
                "any other module named"
            )
        later = [_label(s) for _, s in roles[n_embed:]]
        self.scales = self._scales(spec, later[0] if later else READOUT, n_embed)
        dtype = values[roles[0][1].tap][2]
        tol = PROBE_TOLERANCE.get(dtype, FLOAT_TOLERANCE)
        stream, writes = None, 0
        linear = [
            s.path for role, s in roles if role == "norm" and isinstance(self.module(s), torch.nn.Linear)
        ]
        for k, (role, site) in enumerate(roles):
            value = values[site.tap][0]
            label = embed_labels[k] if k < n_embed else later[k - n_embed]
            self.labels[site.tap] = label
            if stream is not None and role in (EMBED, "write") and value.shape[-1] != stream.shape[-1]:
                raise Refused(
                    f"ModelSpec: {site.path} writes a width of {value.shape[-1]}, the stream's is "
                    f"{stream.shape[-1]}: name the module whose output is added to the stream"
                )
            if role == EMBED:
                term = value * self.scales[k]
                stream = term if stream is None else stream + term
                self.sources.append(SourceSpec(label, label, names.EMBED, 0))
            elif role == "write":
                writes += 1
                stream = stream + value
                self.sources.append(SourceSpec(label, label, site.key.split(".")[0], writes))
            elif role == "norm":
                if site.path in linear and (writes or self.consumers):
                    raise Refused(
                        f"ModelSpec: the linear map {site.path} comes after a write or read (not read): a "
                        "linear map may only carry the embeddings into the stream's width"
                    )
                with torch.no_grad():
                    stream = self._norm(site, label, value, stream, tol)
                self.sources.append(SourceSpec(label, label, names.BIAS, writes))
            else:
                _reads_stream(f"consumer {label} ({site.path})", value, stream, tol)
                kind = READOUT if site.key == READOUT else site.key.split(".")[0]
                n = len(self.sources)
                self.consumers.append(
                    ConsumerSpec(label, f"{label}.in", kind, writes + 1, n, f"{label}.terms", terms=True)
                )
        for what, specs in (("writes and norms", self.sources), ("reads", self.consumers)):
            seen = [s.label for s in specs]
            twice = next((label for label in seen if seen.count(label) > 1), None)
            if twice is not None:
                raise DepthscopeError(
                    f"ModelSpec: two {what} are both {twice}; name one module per layer and key"
                )

    def module(self, site: Any) -> Any:
        """The module a site names."""
        return self.model.get_submodule(site.path)

    @staticmethod
    def _scales(spec: Any, first: str, n_embed: int) -> list[float]:
        """The embeddings' scales: ``static=`` of the first norm or read after them, else 1 each."""
        unknown = sorted(set(spec.static) - {first})
        if unknown:
            raise DepthscopeError(
                f"ModelSpec: a post-LN spec gives static= only to {first} (the embeddings' scales), not to "
                f"{', '.join(unknown)}"
            )
        given = [float(x) for x in spec.static.get(first, [1.0] * n_embed)]
        if len(given) != n_embed or not all(math.isfinite(x) for x in given):
            raise DepthscopeError(f"ModelSpec: static= gives {first} {given!r:.80}: one scale per embedding")
        return given

    def _norm(self, site: Any, label: str, x: Tensor, stream: Tensor, tol: float) -> Tensor:
        """The stream after norm ``site`` (input ``x``): its recorded output, checked to follow from the
        stream as the terms are carried: its input is the stream, its output a LayerNorm of its input or
        a linear map of it.
        """
        module = self.module(site)
        out = self.output(site.path)
        _reads_stream(f"norm {label} ({site.path})", x, stream, tol)
        if isinstance(module, torch.nn.Linear):
            want = torch.nn.functional.linear(x, module.weight.double(), _double(module.bias))
        elif is_layer_norm(module) and isinstance(getattr(module, "eps", None), float):
            weight, bias = _double(getattr(module, "weight", None)), _double(getattr(module, "bias", None))
            want = torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, module.eps)
        else:
            raise Refused(
                f"ModelSpec: norm {label} ({site.path}) is a {type(module).__name__}: not a LayerNorm"
            )
        if not error(out, want) <= tol:
            raise Refused(
                f"ModelSpec: norm {label} ({site.path}) does not compute what a LayerNorm or linear map of "
                f"its input does (relative error {error(out, want):.2g})"
            )
        return out

    def hooks(self, state: _Terms) -> list[tuple[str, Callback]]:
        """Every (tap, callback) of the model, in the order the forward reaches them."""
        out: list[tuple[str, Callback]] = []
        for k, (role, site) in enumerate(self.roles):
            label = self.labels[site.tap]
            if role == EMBED:
                out.append((site.tap, partial(state.embed, label, self.scales[k], k == 0)))
            elif role == "write":
                out.append((site.tap, partial(state.write, label)))
            elif role == "norm":
                out.append((site.tap, partial(state.norm, self.module(site), label)))
            else:
                out.append((site.tap, partial(state.consumer, label)))
        return out


def _reads_stream(what: str, value: Tensor, stream: Tensor, tol: float) -> None:
    """Refused unless ``value`` is the stream (float64 on the probe) to ``tol``; NaN fails."""
    err = error(value, stream)
    if not err <= tol:
        raise Refused(
            f"ModelSpec: {what} does not read the stream (the last norm's output plus the writes since; "
            f"relative error {err:.2g})"
        )


def _label(site: Any) -> str:
    """A site's label: ``readout``, ``{i}.{key}`` in layer ``i``, else its key (``embed.ln``)."""
    return (
        READOUT if site.key == READOUT else f"{site.index}.{site.key}" if site.index is not None else site.key
    )


def _double(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().double()


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
        self.part_key = ""  # whose write the chunks are
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

    def embed(self, key: str, scale: float, first: bool, t: Tensor) -> None:
        """An embedding's write [batch or 1, pos, d], times its scale; the first starts a batch."""
        t = t * scale if scale != 1.0 else t
        if first:
            self.start(key, t)
        else:
            self.embedding(key, t)

    def write(self, key: str, t: Tensor) -> None:
        """A write; a chunk of positions of it (a chunked feed-forward) waits for the rest."""
        if t.shape[1] < self.rebuilt.shape[1]:
            self.parts.append(t)
            self.part_key = key
        else:
            self.source(key, t)

    def norm(self, module: Any, key: str, x: Tensor) -> None:
        """A norm reads the stream ``x``: every term carried through it (a LayerNorm, or a linear map);
        a chunk of positions waits until the chunks make the whole window, its write's with it.
        """
        if x.shape[1] < self.rebuilt.shape[1]:
            self.xs.append(x)
            if sum(c.shape[1] for c in self.xs) < self.rebuilt.shape[1]:
                return
            x, self.xs = torch.cat(self.xs, 1), []
            if self.parts:  # the engine reports a write that never came
                self.source(self.part_key, torch.cat(self.parts, 1))
                self.parts = []
        if isinstance(module, torch.nn.Linear):
            self.project(module, key)
        else:
            self.normalise(module, x, key)

    def _index(self, group: str, device: torch.device) -> Tensor:
        """The source indices of a group's live terms, as a tensor (the same in every batch: cached)."""
        key = ("post-ln index", group, tuple(self.at[group]), device)
        return self.ws.constant(key, lambda: torch.tensor(key[2], dtype=torch.long, device=device))

    def consumer(self, key: str, h: Tensor) -> None:
        """Consumer ``key``'s input and its terms (views, folded by the engine at once)."""
        if h.shape[1] != self.rebuilt.shape[1]:
            raise DepthscopeError(
                f"consumer {key} is read inside a feed-forward that runs in chunks of positions: read it "
                "from a module that sees the whole window"
            )
        self.send(f"{key}.in", h)
        at = lambda group: self._index(group, h.device)  # noqa: E731
        live = lambda group: self.buf[group][: self.count[group]]  # noqa: E731
        vecs = tuple((live(g), at(g)) for g in self.GROUPS if self.count[g])
        self.send(
            f"{key}.terms", Terms(live("dense"), at("dense"), vecs, self.buf["scale"][: self.n], self.rebuilt)
        )


def is_layer_norm(module: Any) -> bool:
    """A LayerNorm by class or by name (a model's own ``BertLayerNorm``)."""
    return isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith("LayerNorm")
