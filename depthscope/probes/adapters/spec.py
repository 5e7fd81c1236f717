"""Any ``torch.nn.Module``, read from where it writes and where it reads: ``ModelSpec``.

Research code adds depth mixing to its own blocks (a nanoGPT fork with DenseFormer's DWA, an
AttnRes or mHC block from a paper's pseudocode). Such a model needs no family: the user names
the modules whose OUTPUTS are sources and the modules whose INPUTS are consumers, ``*`` standing
for the layer index::

    spec = ModelSpec(
        embed=["wte", "wpe"],                                    # token and position embeddings
        writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},  # sources, by kind
        reads={"attn": "blocks.*.ln_1", "mlp": "blocks.*.ln_2", "readout": "ln_f"},  # consumers
    )
    trace = depthscope.probes.capture(model, data, spec=spec)

One probe forward of random token ids (batch 2 x 8 positions) records every named module's first
input and output, and depthscope

1. checks their shapes: each must be a view of the stream, [batch, pos, d_model] ([1, pos, d] or
   [pos, d]: shared over the batch, a position embedding of ``arange``; [batch * pos, d]: a block
   that flattens the tokens, a MoE layer; [pos, batch, d]: a time-first stream), all of one width,
   else it is refused naming the module and the shape it gave;
2. finds each consumer's weights over the sources written before it from the activations
   themselves (``fit``): unit (a standard residual), static scalars (DenseFormer's DWA, a scaled
   residual) or per-token scalars (AttnRes, hyper-connections and mHC unrolled into the delta
   basis, MUDDFormer's dynamic dense weights), **chosen by the evidence** (the richer hypothesis is
   kept only when it explains significantly more, by an F test in float64) and refused where the
   activations do not determine them (dependent sources, more per-token-weighted sources than the
   width) or where no scalar combination rebuilds the input (per-feature weights: give them as
   ``weights=``; a read of something not named).

The capture engine then checks the identity on every batch, as for every family, and per-token
weights are solved again on every batch with the same identifiability rule, token by token.

A post-LN model (the stream renormalised after each write: BERT, the original transformer) names
its LayerNorms as ``norms=``: nothing is fitted then; every term is carried through each norm
exactly (``carry``), and the spec is checked on the probe site by site.

Sources may be increments (a sublayer's output) or whole states (a block's output, which
DenseFormer averages): the engine only needs each input to be a combination of them. A module may
be named under several read keys (MUDDFormer's layer 0 reads its query, key and value from one
``attention_norm``, later layers from ``attention_norms.0/1/2``): one consumer per key.

Labels: ``embed`` for the first embedding, ``embed.NAME`` for the others (NAME the module's last
path part; ``embed`` may instead map labels to modules, the first labelled ``embed``:
``{"embed": "wte", "pos_embed": "wpe"}``, as the transformers reader labels them);
path part); ``{i}.{key}`` for a write or read of layer ``i`` under the key it is named by (``0.attn``,
``3.attn.q``), ``i`` the ``*`` of its pattern or else the first number in its path; ``readout``. A
key's kind is its first dotted part (``attn``, ``mlp``, ``swa``, ``ssm`` or ``block``). A module
read with a keyword argument (``self.ln(x=h)``) is read through that argument.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from depthscope.errors import DepthscopeError, first_line
from depthscope.probes.adapters import carry, fit
from depthscope.probes.adapters.base import (
    Adapter,
    Callback,
    ConsumerSpec,
    Head,
    SourceSpec,
    call_model,
    head_of,
    module_attach,
    router,
    stream_layout,
    to_stream,
)
from depthscope.probes.adapters.hf import byte_encoder
from depthscope.probes.adapters.structure import (
    FLOAT_TOLERANCE,
    PROBE_SHAPE,
    PROBE_TOLERANCE,
    Probe,
    Refused,
    verify,
)
from depthscope.trace.labels import BLOCK, EMBED, READOUT, SUBLAYER_KINDS, Kind

NAME = "spec"  # the adapter's family attr (this module is no family: it defines no FAMILY)
KEY_KINDS: tuple[Kind, ...] = (*SUBLAYER_KINDS, BLOCK)
PLE = "ple"  # a key of kind embed: a per-layer embedding added to the stream (gemma4's) and its read
CONTEXT_ATTRS = ("block_size", "max_position_embeddings", "n_positions", "max_seq_len", "n_ctx", "ctx")
DOCS = "docs/reference.md#modelspec"
SPEC_COMMAND = "`depthscope spec MODEL` (Python: depthscope.suggest_spec(model)) prints one to start from"

Patterns = str | Sequence[str]


@dataclass(frozen=True)
class ModelSpec:
    """Where a model writes and where it reads, in module paths (``*``: the layer index).

    Args:
        embed: module(s) whose outputs are the sources before the first layer (token embedding
            first; a position embedding of shape [pos, d_model] is shared over the batch), or a
            mapping label -> module, the first labelled ``embed`` (``{"embed": "wte", "pos_embed":
            "wpe"}``), to label them.
        writes: kind -> pattern(s) of modules whose outputs are sources (``"blocks.*.attn"``);
            kinds: attn, mlp, swa, ssm, or block (a whole block's output, a state).
        reads: key -> pattern(s) of modules whose INPUT is a consumer; ``readout`` names the
            module reading the final stream (the final norm). A key is a kind or a kind with a
            view (``"attn.q"``, ``"attn.k"``, ``"attn.v"`` for separate query, key, value inputs);
            one module may be named under several keys.
        head: (final norm, unembedding) paths for logits (default: the read-out module and
            ``lm_head`` where both exist).
        ctx, vocab: the context length and vocabulary (default: read from the model's config or
            embeddings; the context also from the token ids a capture is given).
        label, scheme: the trace's label and scheme attrs (default: the model's class name,
            ``"custom"``).
        forward: how to call the model on token ids [batch, pos] (default ``model(ids)``).
        static: consumer label -> its static weights over the first sources written before it,
            given rather than found (a layouts row's multipliers); fewer numbers than sources before
            it read only the first ones (a parallel sublayer that does not see its neighbour's write,
            which runs first). Checked on the probe like found weights.
        weights: read key -> ``fn(index, sources, h)`` giving a consumer's weights where the
            activations cannot (per-feature weights, as DCA's GRN has): ``index`` the layer index
            (``*``), ``sources`` [n, batch, pos, d] the sources available, ``h`` [batch, pos, d]
            its input; it returns [batch, pos, n] or [batch, pos, n, d] (or [n] / [n, d]: the same
            at every token). The identity is checked like any other, on the probe and every batch.
        norms: key -> pattern(s) of post-norms (a post-LN model, ``post_ln``): modules whose input is
            the stream (the last norm's output, or the embeddings' sum) plus the writes since, and whose
            output is the stream from then on: a LayerNorm, or a linear map into the stream's width
            (ELECTRA's projection). Every term is carried through each one exactly, its bias a source
            labelled like a write (``{i}.ln1``, ``embed.ln``); the reads then read the stream itself
            (their mixing the accumulated 1/sigma), and ``static=`` may give only the embeddings'
            scales, at the first norm or read after them.

    A pattern is a string or a list of strings, wherever one is taken. A path ending in ``:in`` or
    ``:out`` names that value of the module where its role takes the other (``embed="layers.0:in"``,
    ``reads={"readout": "layers.3:out"}``); the key ``ple`` (kind embed) names per-layer embeddings
    added inside the layers, and the modules that read the stream for them.
    """

    embed: Patterns | Mapping[str, str]
    writes: Mapping[str, Patterns]
    reads: Mapping[str, Patterns]
    head: tuple[str, str] | None = None
    ctx: int | None = None
    vocab: int | None = None
    label: str | None = None
    scheme: str = "custom"
    forward: Callable[[Any, Tensor], Any] | None = field(default=None, compare=False)
    weights: Mapping[str, Callable[..., Tensor]] = field(default_factory=dict, compare=False)
    static: Mapping[str, Sequence[float]] = field(default_factory=dict)
    norms: Mapping[str, Patterns] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """The spec as JSON-ready data (recorded in the trace's ``config`` attr)."""
        out = {
            "embed": dict(self.embed) if isinstance(self.embed, Mapping) else patterns("embed", self.embed),
            "writes": {k: patterns(k, v) for k, v in _mapping("writes", self.writes).items()},
            "reads": {k: patterns(k, v) for k, v in _mapping("reads", self.reads).items()},
        }
        if self.norms:
            out["norms"] = {k: patterns(k, v) for k, v in _mapping("norms", self.norms).items()}
        if self.static:
            out["static"] = {k: [float(x) for x in v] for k, v in _mapping("static", self.static).items()}
        return out


def patterns(key: str, value: Any) -> list[str]:
    """One pattern or a list of them, as a list of strings; DepthscopeError for anything else."""
    found = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not found or not all(isinstance(p, str) and p for p in found):
        raise DepthscopeError(
            f"ModelSpec: {key!r} names {value!r:.80}: give a module path or a list of them ('blocks.*.attn')"
        )
    return found


def _mapping(what: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise DepthscopeError(
            f"ModelSpec: {what}= must map keys to module paths ({{'attn': 'blocks.*.attn'}}), "
            f"got {value!r:.80}"
        )
    return value


@dataclass(frozen=True)
class _Site:
    """One named module: its path, the key it was named by, its layer index (None: none in its path),
    and which of its values is meant: its input ``"in"`` or output ``"out"``.
    """

    path: str
    key: str
    index: int | None
    where: str

    @property
    def tap(self) -> str:
        return f"{self.path}:{self.where}"


def _expand(model: Any, key: str, names: list[str], where: str, paths: list[str]) -> list[_Site]:
    """The modules among ``paths`` (the model's) each pattern names (``*``: a layer index; without one,
    the first number of the path is), each meaning its value ``where`` unless the pattern says which
    (``"layers.0:in"``); DepthscopeError if one names none.
    """
    sites = []
    for named in names:
        pattern, colon, said = named.partition(":")
        if colon and said not in ("in", "out"):
            raise DepthscopeError(
                f"ModelSpec: {key!r} names {named!r}: after ':' comes 'in' (the module's input) or 'out'"
            )
        rx = re.compile("^" + re.escape(pattern).replace(r"\*", r"(\d+)") + "$")
        found = [(p, rx.match(p)) for p in paths]
        found = [(p, int(m.group(1)) if m.groups() else _index(p)) for p, m in found if m]
        if not found:
            near = [p for p in paths if p.split(".")[-1] == pattern.split(".")[-1]][:3]
            hint = f" (modules with that name: {', '.join(near)})" if near else ""
            raise DepthscopeError(
                f"ModelSpec: {key!r}: no module of {type(model).__name__} is {pattern!r}{hint}"
            )
        sites += [_Site(p, key, i, said or where) for p, i in found]
    return sites


def _index(path: str) -> int | None:
    return next((int(part) for part in path.split(".") if part.isdigit()), None)


def _kind(key: str) -> Kind:
    if key == PLE:
        return EMBED
    kind = key.split(".")[0]
    if kind not in KEY_KINDS:
        raise DepthscopeError(
            f"ModelSpec: {key!r} is not a kind of write or read (kinds: {', '.join(KEY_KINDS)}, or {PLE}: a "
            "per-layer embedding; a read may add a view: 'attn.q')"
        )
    return kind  # type: ignore[return-value]


def _probe(
    model: Any,
    paths: list[str],
    vocab: int,
    ctx: int,
    forward: Callable[..., Any],
    probe=None,
    chunk: int = 0,
) -> Probe:
    """One probe forward with the named modules' calls recorded (``structure.Probe``), on ids of a
    model's shorter context where it has one, or of one ``chunk`` of positions where the model runs
    modules once per chunk (or the ``probe`` a family made of every module); each named module must
    run once.
    """
    positions = chunk or min(PROBE_SHAPE[1], ctx)
    try:
        probe = probe or Probe(model, vocab, forward, (PROBE_SHAPE[0], positions), paths)
    except Refused as err:
        raise DepthscopeError(f"ModelSpec: {err}") from None
    path, n = next(((p, probe.count.get(p, 0)) for p in paths if probe.count.get(p, 0) != 1), (None, 1))
    if path is not None:
        raise DepthscopeError(
            f"ModelSpec: {path} {'does not run' if n == 0 else f'runs {n} times'} in one forward; "
            "name modules that run once each"
        )
    return probe


def _value(probe: Probe, path: str, where: str) -> tuple[Tensor, str, torch.dtype]:
    """A module's recorded input or output as [batch or 1, pos, d] float64, its layout and dtype."""
    call = probe.first[path]
    raw = call.raw_in if where == "in" else call.raw_out
    what = "input" if where == "in" else "output"
    if not isinstance(raw, Tensor):
        got = "nothing" if raw is None else f"a {raw}"
        raise DepthscopeError(f"ModelSpec: {path}'s {what} is {got}, not a floating-point tensor")
    layout = stream_layout(tuple(raw.shape), *probe.shape)
    if layout is None:
        b, p = probe.shape
        raise DepthscopeError(
            f"ModelSpec: {path}'s {what} has shape {list(raw.shape)} in a forward on ids [{b}, {p}]: not "
            f"the stream [batch, pos, d_model] (nor [pos, d], [batch*pos, d] or [pos, batch, d])"
        )
    return to_stream(raw, layout, probe.shape).double(), layout, raw.dtype


# --- weights from activations ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Weights:
    how: str  # "unit", "static", "token", "declared"
    static: tuple[float, ...] | None = None


def _found(label: str, site: _Site, labels: list[str], values: list[Tensor], target: Tensor, dtype, tol):
    """Unit, static or per-token weights of one consumer, kept by the evidence; refused otherwise."""
    stack = torch.stack([torch.broadcast_to(v, target.shape) for v in values])
    choice = fit.choose(stack, target, dtype, tol, labels)
    if choice.why is None:
        return _Weights(choice.how, choice.static)
    more = (
        f": name the modules that write what it reads, or give per-feature weights: "
        f"ModelSpec(weights={{key: fn}}) ({DOCS})"
        if "not a scalar combination" in choice.why
        else ""
    )
    raise DepthscopeError(f"ModelSpec: consumer {label} ({site.path}) {choice.why}{more}")


def _weights(spec: ModelSpec, label, site, names, values, h, dtype, tol, find) -> tuple[_Weights, int]:
    """A consumer's weights over the ``values`` of the sources before it, and how many it reads:
    given static ones (``static=``: maybe fewer), declared per-feature ones (``weights=``), found
    (``find``) or else unit.
    """
    if label in spec.static:
        found = _given_static(label, spec.static[label], len(values))
        return found, len(found.static) if found.static else len(spec.static[label])
    given = spec.weights.get(site.key)
    if given is not None:
        return _declared(label, site, given, values, h, tol), len(values)
    if not find:
        return _Weights("unit"), len(values)
    return _found(label, site, names, values, h, dtype, tol), len(values)


def _given_static(label: str, weights: Any, n: int) -> _Weights:
    """A consumer's static weights as the spec gives them (``static=``): numbers over its first
    len(weights) <= n sources; unit weights where all are 1 (then checked by ``verify``, as found ones).
    """
    try:
        w = tuple(float(x) for x in weights)
    except (TypeError, ValueError):
        w = ()
    if not 0 < len(w) <= n or not all(math.isfinite(x) for x in w):
        raise DepthscopeError(
            f"ModelSpec: static= gives {label} {weights!r:.80}: give 1 to {n} finite numbers, its weights "
            f"over the first sources written before it"
        )
    return _Weights("given", None if all(x == 1.0 for x in w) else w)


def _declared_fn(fn: Callable[..., Tensor], index: int | None) -> Callable[[Tensor, Tensor], Tensor]:
    """The user's weights function of one consumer, its output broadcast to [batch, pos, n(, d)]."""

    def weights(sources: Tensor, h: Tensor) -> Tensor:
        w = torch.as_tensor(fn(index, sources, h)).to(h.device)
        if w.ndim in (1, 2) and w.shape[0] == sources.shape[0]:  # the same at every token
            w = w.expand(*h.shape[:2], *w.shape)
        return w

    return weights


def _declared(label: str, site: _Site, fn: Callable[..., Tensor], values: list[Tensor], target: Tensor, tol):
    """Check the user's weights of one consumer on the probe: they must rebuild its input."""
    full = torch.stack([torch.broadcast_to(v, target.shape) for v in values])
    try:
        w = _declared_fn(fn, site.index)(full, target).double()
    except Exception as err:  # the user's function failed: one line naming it
        raise DepthscopeError(
            f"ModelSpec: the weights of {label} failed ({type(err).__name__}: {first_line(err)})"
        ) from None
    n = len(values)
    if w.shape[:3] != (*target.shape[:2], n) or w.ndim not in (3, 4):
        raise DepthscopeError(
            f"ModelSpec: the weights of {label} have shape {tuple(w.shape)}; want [batch, pos, {n}] or "
            f"[batch, pos, {n}, d_model]"
        )
    rebuilt = (
        torch.einsum("bpn,nbpd->bpd", w, full) if w.ndim == 3 else torch.einsum("bpnd,nbpd->bpd", w, full)
    )
    left = float((target - rebuilt).norm() / target.norm().clamp_min(1e-300))
    if not left <= tol:
        raise DepthscopeError(
            f"ModelSpec: the weights given for {label} ({site.path}) do not rebuild its input from the "
            f"{n} sources before it (relative error {left:.2g})"
        )
    return _Weights("declared")


# --- the adapter ---------------------------------------------------------------------------------


def _vocab_ctx(model: Any, spec: ModelSpec, embeds: list[_Site], ctx_hint: int | None) -> tuple[int, int]:
    config = getattr(model, "config", None)
    vocab = spec.vocab
    if vocab is None:
        first = model.get_submodule(embeds[0].path)
        vocab = getattr(first, "num_embeddings", None) or getattr(config, "vocab_size", None)
    ctx = spec.ctx
    if ctx is None:
        for source in (config, model):
            ctx = next(
                (getattr(source, a) for a in CONTEXT_ATTRS if type(getattr(source, a, None)) is int), None
            )
            if ctx:
                break
    if ctx is None and len(embeds) > 1:  # a learned position embedding: its number of positions
        ctx = getattr(model.get_submodule(embeds[1].path), "num_embeddings", None)
    if ctx is None:
        ctx = ctx_hint  # the token ids the capture was given say how long a window is
    if not isinstance(vocab, int) or vocab < 2:
        raise DepthscopeError("ModelSpec: cannot tell the vocabulary size; give ModelSpec(vocab=...)")
    if not isinstance(ctx, int) or ctx < 1:
        raise DepthscopeError(
            "ModelSpec: cannot tell the context length (no config or position embedding says it); give "
            "ModelSpec(ctx=...) or token ids [batch, pos]"
        )
    return vocab, ctx


def _head(model: Any, spec: ModelSpec, readout: _Site | None) -> Head | None:
    if spec.head is not None:
        try:
            norm, unembed = spec.head
            return head_of(model.get_submodule(norm), model.get_submodule(unembed))
        except (AttributeError, TypeError, ValueError) as err:
            raise DepthscopeError(
                f"ModelSpec: head={spec.head!r:.80} names no (norm, unembedding) ({err})"
            ) from None
    if readout is None:
        return None
    norm = model.get_submodule(readout.path)
    unembed = getattr(model, "lm_head", None)
    if unembed is None or getattr(unembed, "weight", None) is None:
        return None
    if getattr(norm, "weight", None) is None and not isinstance(norm, torch.nn.LayerNorm | torch.nn.RMSNorm):
        return None
    return head_of(norm, unembed)


def _logits(output: Any) -> Tensor:
    """The logits in a model's output: a tensor, the first of a tuple (nanoGPT's (logits, loss)), a
    ``logits`` key or attribute; DepthscopeError for anything else.
    """
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        output = output[0]
    elif isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
        output = output["logits"]
    elif not isinstance(output, Tensor) and isinstance(getattr(output, "logits", None), Tensor):
        output = output.logits
    if not isinstance(output, Tensor) or output.ndim != 3:
        raise DepthscopeError(
            f"ModelSpec: the model's output ({type(output).__name__}) holds no logits [batch, pos, vocab]: "
            "give ModelSpec(forward=lambda model, ids: ...) returning them"
        )
    return output


def _sites(model: Any, spec: ModelSpec) -> tuple[list[_Site], list[_Site], list[_Site], list[_Site]]:
    """The embeddings, writes, reads and norms the spec names, each checked."""
    if not isinstance(spec, ModelSpec):
        raise DepthscopeError(f"spec must be a ModelSpec, got a {type(spec).__name__}")
    writes_map = _mapping("writes", spec.writes)
    if not isinstance(spec.static, Mapping) or not all(isinstance(k, str) for k in spec.static):
        raise DepthscopeError(
            "ModelSpec: static= maps consumer labels to weights ({'0.mlp': [1.0]}), "
            f"not {spec.static!r:.60}"
        )
    if not spec.embed or not writes_map:
        raise DepthscopeError("ModelSpec: name at least one embedding (embed=) and one write (writes=)")
    paths = [p for p, _ in model.named_modules()]  # listed once: every pattern is matched against them

    def named(what: str, where: str) -> list[_Site]:
        given = _mapping(what, getattr(spec, what)).items()
        return [s for k, v in given for s in _expand(model, k, patterns(k, v), where, paths)]

    embeds = _embeds(model, spec.embed, paths)
    writes, reads, norms = named("writes", "out"), named("reads", "in"), named("norms", "in")
    for s in writes + [r for r in reads if r.key != READOUT]:
        _kind(s.key)
    return embeds, writes, reads, norms


def _embeds(model: Any, embed: Any, paths: list[str]) -> list[_Site]:
    """The embedding sites, each keyed by its label where ``embed`` maps labels to modules (the first
    ``embed``, each naming one module), else by ``embed``.
    """
    if not isinstance(embed, Mapping):
        return _expand(model, EMBED, patterns(EMBED, embed), "out", paths)
    labels = list(_mapping("embed", embed))
    if labels[:1] != [EMBED] or not all(isinstance(v, str) for v in embed.values()):
        raise DepthscopeError(
            f"ModelSpec: embed= maps labels to one module each, the first labelled 'embed' "
            f"({{'embed': 'wte', 'pos_embed': 'wpe'}}), got {dict(embed)!r:.80}"
        )
    sites = [site for lab in labels for site in _expand(model, lab, [embed[lab]], "out", paths)]
    if len(sites) != len(labels):
        raise DepthscopeError("ModelSpec: each label of embed= names one module (no '*')")
    return sites


def build_spec(
    model: Any, spec: ModelSpec, ctx: int | None = None, *, find: bool = True, probe: Probe | None = None
) -> Adapter:
    """The adapter of ``model`` as ``spec`` names it, its weights found on a probe forward; ``ctx``
    is the window length when neither the spec nor the model says it (the ids a capture is given).
    ``find=False``: the weights not given (``static=``, ``weights=``) are unit, not found (a family
    whose plan says them: ``huggingface``, which passes the ``probe`` it found the plan on); checked on
    the probe all the same: ``structure.Refused`` names the first consumer that is not the sum it is
    read as.
    """
    if isinstance(spec, ModelSpec) and spec.norms:  # a post-LN model: its terms carried through the norms
        return _carried(model, spec, ctx, probe)
    embeds, writes, reads, _ = _sites(model, spec)
    forward = spec.forward or call_model
    vocab, ctx = _vocab_ctx(model, spec, embeds, ctx)
    paths = list(dict.fromkeys(s.path for s in embeds + writes + reads))
    probe = _probe(model, paths, vocab, ctx, forward, probe)
    # when a value exists: an input as its module starts, an output once it has returned
    when = {s.tap: probe.when(s.tap) for s in embeds + writes + reads}
    writes.sort(key=lambda s: when[s.tap])
    reads.sort(key=lambda s: (s.key == READOUT, when[s.tap]))

    sources = _sources(embeds, writes)
    recorded = [_value(probe, site.path, site.where) for _, site in sources]
    values = [v for v, _, _ in recorded]
    dtype = recorded[0][2]
    seen = {r.tap: _value(probe, r.path, r.where) for r in reads}  # each read's input [b, pos, d], layout
    _check_widths([site.path for _, site in sources], values, [(r.path, seen[r.tap][0]) for r in reads])
    tol = PROBE_TOLERANCE.get(dtype, FLOAT_TOLERANCE)
    layouts = {site.tap: layout for (_, site), (_, layout, _) in zip(sources, recorded)}

    consumers, per_token, labels, found_as, inputs, targets = [], {}, set(), {}, {}, {}
    for r in reads:
        label = READOUT if r.key == READOUT else (f"{r.index}.{r.key}" if r.index is not None else r.key)
        if label in labels:
            raise DepthscopeError(f"ModelSpec: two reads are both {label}; name one module per layer and key")
        labels.add(label)
        before = [j for j, (_, s) in enumerate(sources) if j < len(embeds) or when[s.tap] < when[r.tap]]
        n = len(before)
        if before != list(range(n)):
            raise DepthscopeError(f"ModelSpec: consumer {label} reads a source written after a later one")
        h, layout, _ = seen[r.tap]
        layouts[r.tap], targets[label] = layout, (r.path, h)
        depth = 1 + n - len(embeds)  # the writes before it, per-layer embeddings too (their depths count)
        given = spec.weights.get(r.key)
        names = [s.label for s, _ in sources[:n]]
        found, n = _weights(spec, label, r, names, values[:n], h, dtype, tol, find)
        kind = READOUT if r.key == READOUT else _kind(r.key)
        weights = f"{label}.w" if found.how in ("token", "declared") else None
        consumers.append(ConsumerSpec(label, f"{label}.in", kind, depth, n, weights, found.static))
        found_as[label] = found.how
        inputs[label] = r.tap
        if weights is not None:
            per_token[label] = (n, _declared_fn(given, r.index) if given is not None else None)
    unknown = sorted(set(spec.static) - labels)
    if unknown:
        listed = ", ".join(c.label for c in consumers)
        raise DepthscopeError(f"ModelSpec: static= names {', '.join(unknown)}: no such consumer ({listed})")
    try:  # the check every reading passes (the weights found rebuild each input; given ones may not)
        verify(consumers, values, targets, tol)
    except Refused as err:
        raise Refused(f"ModelSpec: consumer {err}") from None
    readout = next((r for r in reads if r.key == READOUT), None)
    attrs = {
        "scheme": spec.scheme,
        "variant": spec.scheme,
        "label": spec.label or type(model).__name__,
        "family": NAME,
        "config": json.dumps(spec.describe(), sort_keys=True),
        "weights_found": json.dumps({c.label: found_as[c.label] for c in consumers}, sort_keys=True),
    }
    taps = {s.label: site.tap for s, site in sources}
    shape: list[tuple[int, int]] = [PROBE_SHAPE]  # (batch, pos) of the forward in flight

    def run(m: Any, ids: Tensor) -> Any:
        shape[0] = (int(ids.shape[0]), int(ids.shape[1]))
        return forward(m, ids)

    hooks = _Hooks(taps, inputs, per_token, layouts, shape, dtype)
    not_views = _not_views(reads, writes)
    if not_views:
        attrs["not_views"] = not_views
    return Adapter(
        family=NAME,
        sources=[s for s, _ in sources],
        consumers=consumers,
        attrs=attrs,
        ctx=ctx,
        vocab=vocab,
        attach=hooks.attach,
        forward=run,
        encode=byte_encoder(vocab, attrs["label"]),  # (capture(tokenizer=...) gives one)
        head=_head(model, spec, readout),
        logits=_logits,
        views=not not_views,
    )


def _carried(model: Any, spec: ModelSpec, ctx: int | None, probe: Probe | None) -> Adapter:
    """A spec with norms (a post-LN model): its sites named, probed and ordered as any spec's, the
    terms carried through its norms (``carry.adapter``, which checks them on the probe).
    """
    if spec.weights or spec.head is not None:
        raise DepthscopeError(
            "ModelSpec: with norms= every term is carried through the norms, not weighted: weights= and "
            "head= do not apply (give neither)"
        )
    embeds, writes, reads, norms = _sites(model, spec)
    forward = spec.forward or call_model
    vocab, ctx = _vocab_ctx(model, spec, embeds, ctx)
    paths = list(dict.fromkeys(s.path for s in embeds + writes + norms + reads))
    chunk = carry.chunk_of(model)  # a chunked feed-forward runs its modules once on one chunk
    probe = _probe(model, paths, vocab, ctx, forward, probe, chunk)
    roles = [(EMBED, s) for s in embeds] + [("write", s) for s in writes]
    roles += [("norm", s) for s in norms] + [("read", s) for s in reads]
    roles.sort(key=lambda rs: probe.when(rs[1].tap))  # in the order the forward reaches them
    values = {s.tap: _value(probe, s.path, s.where) for _, s in roles}
    named = [(source.label, site) for source, site in _sources(embeds, [])]
    output = lambda path: _value(probe, path, "out")[0]  # noqa: E731
    return carry.adapter(model, spec, roles, values, named, output, vocab, ctx, chunk)


def _sources(embeds: list[_Site], writes: list[_Site]) -> list[tuple[SourceSpec, _Site]]:
    """The sources in order, labelled: the embeddings, then the writes as their modules return."""
    sources = []
    for k, s in enumerate(embeds):
        label = s.key if s.key != EMBED else (EMBED if k == 0 else f"{EMBED}.{s.path.split('.')[-1]}")
        sources.append((SourceSpec(label, label, EMBED, 0), s))
    for d, s in enumerate(writes, start=1):
        label = f"{s.index}.{s.key}" if s.index is not None else s.key
        if any(label == t.label for t, _ in sources):
            raise DepthscopeError(
                f"ModelSpec: two writes are both {label}; name one module per layer and kind"
            )
        sources.append((SourceSpec(label, label, _kind(s.key), d), s))
    return sources


def _not_views(reads: list[_Site], writes: list[_Site]) -> str:
    """Why replacing one consumer's input would change more than what that consumer reads (an
    ablation of one cell would then remove a term from others too), or "" where it would not: a
    module read under several keys, a read module whose input its own writes carry on into the
    stream (a whole block: it holds writes, or is a block write itself).
    """
    paths = [r.path for r in reads]
    shared = next((p for p in paths if paths.count(p) > 1), None)
    if shared is not None:
        return f"{shared} is read under several keys"
    for r in reads:
        for w in writes:
            if r.where == "in" and (w.path.startswith(r.path + ".") or (w.path == r.path and w.key == BLOCK)):
                return f"{r.path}'s input is read, and the block carries it on into the stream"
    return ""


def _check_widths(paths: list[str], values: list[Tensor], reads: list[tuple[str, Tensor]]) -> None:
    """Every source and every read of one width, the first embedding's: else refused, naming one."""
    width = values[0].shape[-1]
    named = list(zip(paths, values, ["writes"] * len(paths)))
    named += [(path, v, "reads") for path, v in reads]
    for path, v, what in named:
        if v.shape[-1] != width:
            whose = "output is added to" if what == "writes" else "input is"
            raise DepthscopeError(
                f"ModelSpec: {path} {what} a width of {v.shape[-1]}, the stream's is {width} (its first "
                f"embedding's): name the module whose {whose} the stream"
            )


class _Hooks:
    """Module hooks of a spec's adapter: each source's output and each consumer's input to the
    engine, in the layout the probe found; for a consumer with per-token weights, its weights solved
    and checked per token (``fit.Prefix``) from float64 copies of the sources of this forward, made as
    each source is written (an in-place update of a module's output afterwards does not change them).
    The consumers' sources are prefixes of one list, so one ``fit.Prefix`` holds every system.
    """

    def __init__(self, taps, inputs, per_token, layouts, shape, dtype):
        self.taps, self.inputs, self.per_token, self.layouts = taps, inputs, per_token, layouts
        self.shape, self.dtype = shape, dtype
        self.kept = max((n for n, _ in per_token.values()), default=0)  # sources the solves need

    @contextlib.contextmanager
    def attach(self, model: Any, callbacks: list[tuple[str, Callback]]):
        """The hooks, for the duration of a ``with`` block (the copies of the sources with them)."""
        send = router(callbacks)
        slot = {label: j for j, label in enumerate(list(self.taps)[: self.kept])}
        held: dict[str, fit.Prefix] = {}

        def source(label: str):
            def hook(t: Tensor) -> Tensor | None:
                if label in slot:
                    prefix = self._prefix(held, t)
                    prefix.v[slot[label]] = t  # a copy ([1, pos, d] broadcast over the batch)
                    prefix.rewritten(slot[label])
                return send(label, t)

            return hook

        def consumer(label: str):
            def hook(h: Tensor) -> Tensor | None:
                if label in self.per_token:
                    send(f"{label}.w", self._weights(label, held["p"], h))
                return send(f"{label}.in", h)  # an ablation's replacement, if any

            return hook

        hooks = [(tap, source(label)) for label, tap in self.taps.items()]
        hooks += [(tap, consumer(label)) for label, tap in self.inputs.items()]
        with module_attach(model, hooks, layouts=self.layouts, tokens=lambda: self.shape[0]):
            try:
                yield
            finally:
                held.clear()

    def _prefix(self, held: dict[str, fit.Prefix], t: Tensor) -> fit.Prefix:
        """The systems over this forward's sources, their copies [kept, batch, pos, d] in float64."""
        b, p = self.shape[0]
        want = (self.kept, b, p, t.shape[-1])
        dtype = torch.float32 if t.device.type == "mps" else torch.float64
        have = held.get("p")
        if have is None or tuple(have.v.shape) != want or have.v.device != t.device:
            held["p"] = have = fit.Prefix(torch.empty(want, dtype=dtype, device=t.device))
        return have

    def _weights(self, label: str, prefix: fit.Prefix, h: Tensor) -> Tensor:
        """Consumer ``label``'s weights in this forward: declared, or solved and checked per token."""
        n, declared = self.per_token[label]
        if declared is not None:
            return declared(prefix.v[:n].to(h.dtype), h)
        w, why = prefix.solve(n, h, self.dtype)
        if why is not None:
            raise DepthscopeError(f"ModelSpec: consumer {label}: {why}")
        return w


def with_forward(spec: ModelSpec, forward: Callable[[Tensor], Any] | None) -> ModelSpec:
    """``spec`` running the model as ``forward(ids)`` (capture's ``forward=``) when it names no forward."""
    if forward is None or spec.forward is not None:
        return spec
    return dataclasses.replace(spec, forward=lambda _model, ids: forward(ids))


__all__ = ["ModelSpec", "build_spec", "patterns", "with_forward"]
