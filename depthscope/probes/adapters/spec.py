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

and depthscope finds every consumer's weights over the sources written before it from the
activations themselves, on one probe forward of random token ids (batch 2 x 8 positions), trying
in turn:

1. unit weights: the input is the plain sum of the sources (a standard residual);
2. static scalars: one least-squares fit over every token of the probe (DenseFormer's DWA, a
   scaled residual);
3. per-token scalars: a least-squares fit per token, recomputed on every batch of the capture from
   the sources and the input (AttnRes, hyper-connections and mHC unrolled into the delta basis,
   MUDDFormer's dynamic dense weights).

The first that rebuilds the input within the probe's tolerance (relative 1e-5 in float32) is kept;
a consumer that none rebuilds (per-feature weights, a read that is not a combination of the
named writes) is refused in one line naming it and the residual left. The capture engine then
checks the identity on every batch, as for every family, so a fit that held on the probe and
fails on real text is refused there.

Sources may be increments (a sublayer's output) or whole states (a block's output, which
DenseFormer averages): the engine only needs each input to be a combination of them. A source of
shape [pos, d_model] (``wpe(arange(T))``, shared over the batch) is a source like any other.

Choices where the papers are silent (written down here and in the README): the per-token fit is
the minimum-norm least-squares solution; where the sources available to a consumer are linearly
dependent on some token, its weights there are not determined by the activations, and the
consumer is refused rather than given one of many answers. Labels: ``embed`` for the first
embedding, ``embed.NAME`` for the others (NAME the module's last path part); ``{i}.{key}`` for a
write or read of layer ``i`` under the key it is named by (``0.attn``, ``3.attn.q``); ``readout``.
A key's kind is its first dotted part (``attn``, ``mlp``, ``swa``, ``ssm`` or ``block``).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters.base import (
    Adapter,
    Callback,
    ConsumerSpec,
    Head,
    SourceSpec,
    evaluating,
    head_of,
    input_device,
    module_attach,
    router,
)
from depthscope.probes.adapters.structure import FLOAT_TOLERANCE, PROBE_SHAPE, PROBE_TOLERANCE, error
from depthscope.trace.labels import BLOCK, EMBED, READOUT, SUBLAYER_KINDS, Kind

NAME = "spec"  # the adapter's family attr (this module is no family: it defines no FAMILY)
KEY_KINDS: tuple[Kind, ...] = (*SUBLAYER_KINDS, BLOCK)
DEPENDENT = 1e-6  # smallest singular value over largest below this: the sources are dependent
CONTEXT_ATTRS = ("block_size", "max_position_embeddings", "n_positions", "max_seq_len", "n_ctx", "ctx")
DOCS = "README.md#reading-your-own-model"


@dataclass(frozen=True)
class ModelSpec:
    """Where a model writes and where it reads, in module paths (``*``: the layer index).

    Args:
        embed: modules whose outputs are the sources before the first layer (token embedding
            first; a position embedding of shape [pos, d_model] is shared over the batch).
        writes: kind -> pattern(s) of modules whose outputs are sources (``"blocks.*.attn"``);
            kinds: attn, mlp, swa, ssm, or block (a whole block's output, a state).
        reads: key -> pattern(s) of modules whose INPUT is a consumer; ``readout`` names the
            module reading the final stream (the final norm). A key is a kind or a kind with a
            view (``"attn.q"``, ``"attn.k"``, ``"attn.v"`` for separate query, key, value inputs).
        head: (final norm, unembedding) paths for logits (default: the read-out module and
            ``lm_head`` where both exist).
        ctx, vocab: the context length and vocabulary (default: read from the model's config or
            embeddings).
        label, scheme: the trace's label and scheme attrs (default: the model's class name,
            ``"custom"``).
        forward: how to call the model on token ids [batch, pos] (default ``model(ids)``).
        weights: read key -> ``fn(index, sources, h)`` giving a consumer's weights where the
            activations cannot (per-feature weights, as DCA's GRN has): ``index`` the layer index
            (``*``), ``sources`` [n, batch, pos, d] the sources available, ``h`` [batch, pos, d]
            its input; it returns [batch, pos, n] or [batch, pos, n, d] (or [n] / [n, d]: the same
            at every token). The identity is checked like any other, on the probe and every batch.
    """

    embed: Sequence[str]
    writes: Mapping[str, str | Sequence[str]]
    reads: Mapping[str, str | Sequence[str]]
    head: tuple[str, str] | None = None
    ctx: int | None = None
    vocab: int | None = None
    label: str | None = None
    scheme: str = "custom"
    forward: Callable[[Any, Tensor], Any] | None = field(default=None, compare=False)
    weights: Mapping[str, Callable[..., Tensor]] = field(default_factory=dict, compare=False)

    def describe(self) -> dict[str, Any]:
        """The spec as JSON-ready data (recorded in the trace's ``config`` attr)."""
        return {
            "embed": list(self.embed),
            "writes": {k: _patterns(v) for k, v in self.writes.items()},
            "reads": {k: _patterns(v) for k, v in self.reads.items()},
        }


def _patterns(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


@dataclass(frozen=True)
class _Site:
    """One named module: its path, the key it was named by, its layer index (None: no ``*``)."""

    path: str
    key: str
    index: int | None


def _expand(model: Any, key: str, patterns: list[str]) -> list[_Site]:
    """The modules each pattern names (``*``: a layer index); DepthscopeError if one names none."""
    paths = [p for p, _ in model.named_modules()]
    sites = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise DepthscopeError(f"ModelSpec: {key!r} names {pattern!r}, not a module path")
        rx = re.compile("^" + re.escape(pattern).replace(r"\*", r"(\d+)") + "$")
        found = [(p, rx.match(p)) for p in paths]
        found = [(p, int(m.group(1)) if m.groups() else None) for p, m in found if m]
        if not found:
            near = [p for p in paths if p.split(".")[-1] == pattern.split(".")[-1]][:3]
            hint = f" (modules with that name: {', '.join(near)})" if near else ""
            raise DepthscopeError(
                f"ModelSpec: {key!r}: no module of {type(model).__name__} is {pattern!r}{hint}"
            )
        sites += [_Site(p, key, i) for p, i in found]
    return sites


def _kind(key: str) -> Kind:
    kind = key.split(".")[0]
    if kind not in KEY_KINDS:
        raise DepthscopeError(
            f"ModelSpec: {key!r} is not a kind of write or read (kinds: {', '.join(KEY_KINDS)}; "
            "a read may add a view: 'attn.q')"
        )
    return kind  # type: ignore[return-value]


def _as_stream(t: Any) -> Tensor | None:
    """A module's first input or output as [batch or 1, pos, d]: tuples give their first element,
    [pos, d] is shared over the batch; anything else is None.
    """
    if isinstance(t, (tuple, list)) and t:
        t = t[0]
    if not isinstance(t, Tensor) or not t.is_floating_point():
        return None
    if t.ndim == 2:
        return t.unsqueeze(0)
    return t if t.ndim == 3 else None


class _Record:
    """One probe forward with the named modules' first inputs and outputs recorded in call order."""

    def __init__(self, model: Any, sites: list[_Site], vocab: int, forward: Callable[[Any, Tensor], Any]):
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(min(5, vocab - 1), vocab, PROBE_SHAPE, generator=g)
        self.start: dict[str, int] = {}  # when each module's call started, and ended
        self.end: dict[str, int] = {}
        self.count: dict[str, int] = {}
        self.input: dict[str, Tensor | None] = {}
        self.output: dict[str, Tensor | None] = {}
        clock = [0]
        handles = []

        def pre(path: str):
            def hook(module, args, kwargs):
                self.count[path] = self.count.get(path, 0) + 1
                self.start.setdefault(path, clock[0])
                clock[0] += 1
                first = args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))
                self.input.setdefault(path, _copy(_as_stream(first)))

            return hook

        def post(path: str):
            def hook(module, args, out):
                self.end.setdefault(path, clock[0])
                clock[0] += 1
                self.output.setdefault(path, _copy(_as_stream(out)))

            return hook

        try:
            for path in dict.fromkeys(s.path for s in sites):
                module = model.get_submodule(path)
                handles.append(module.register_forward_pre_hook(pre(path), with_kwargs=True))
                handles.append(module.register_forward_hook(post(path)))
            with evaluating(model), torch.no_grad():
                forward(model, self.tokens.to(input_device(model)))
        except DepthscopeError:
            raise
        except Exception as err:  # the model's own code failed on a plain batch of ids
            line = (str(err).splitlines() or [""])[0][:160]
            raise DepthscopeError(
                f"ModelSpec: the probe forward failed ({type(err).__name__}: {line})"
            ) from None
        finally:
            for h in handles:
                h.remove()
        for path in dict.fromkeys(s.path for s in sites):
            n = self.count.get(path, 0)
            if n != 1:
                raise DepthscopeError(
                    f"ModelSpec: {path} {'does not run' if n == 0 else f'runs {n} times'} in one forward; "
                    "name modules that run once each"
                )

    def value(self, path: str, where: str) -> Tensor:
        got = (self.input if where == "in" else self.output)[path]
        if got is None:
            what = "input" if where == "in" else "output"
            raise DepthscopeError(f"ModelSpec: {path}'s {what} is not a [batch, pos, d_model] tensor")
        return got


def _copy(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().to("cpu", torch.float64, copy=True)


# --- weights from activations ---------------------------------------------------------------------


def token_weights(sources: Tensor, target: Tensor) -> tuple[Tensor, float]:
    """Per-token least squares: weights [batch, pos, n] with target ~ sum_n w_n sources_n, and the
    smallest ratio of singular values over tokens (below ``DEPENDENT``: the sources are dependent).

    ``sources`` [n, batch, pos, d], ``target`` [batch, pos, d]; in float64.
    """
    a = sources.double().permute(1, 2, 3, 0)  # [batch, pos, d, n]
    s = torch.linalg.svdvals(a)
    ratio = float((s[..., -1] / s[..., 0].clamp_min(1e-300)).min()) if s.numel() else 1.0
    w = torch.linalg.lstsq(a, target.double().unsqueeze(-1), driver="gelsd").solution[..., 0]
    return w, ratio


@dataclass(frozen=True)
class _Weights:
    how: str  # "unit", "static", "token"
    static: tuple[float, ...] | None = None


def _weights_of(label: str, path: str, sources: list[Tensor], target: Tensor, tol: float) -> _Weights:
    """Unit, static or per-token weights that rebuild ``target`` from ``sources``; refused otherwise."""
    shape = target.shape
    full = [torch.broadcast_to(s, shape) for s in sources]
    if error(target, sum(full)) <= tol:
        return _Weights("unit")
    a = torch.stack([s.flatten() for s in full], 1)
    c = torch.linalg.lstsq(a, target.flatten()[:, None], driver="gelsd").solution[:, 0]
    if error(target, (a @ c).reshape(shape)) <= tol:
        return _Weights("static", tuple(float(x) for x in c))
    w, ratio = token_weights(torch.stack(full), target)
    left = error(target, torch.einsum("bpn,nbpd->bpd", w, torch.stack(full)))
    if left <= tol:
        if ratio < DEPENDENT:
            raise DepthscopeError(
                f"ModelSpec: consumer {label} ({path}): the {len(sources)} sources before it are linearly "
                "dependent on some token, so its per-token weights are not determined by the activations"
            )
        return _Weights("token")
    raise DepthscopeError(
        f"ModelSpec: consumer {label} ({path}) reads something that is not a scalar combination of the "
        f"{len(sources)} sources written before it (relative error {left:.2g} with per-token weights): name "
        "the modules that write what it reads, or give per-feature weights: "
        f"ModelSpec(weights={{key: fn}}) ({DOCS})"
    )


def _declared_fn(fn: Callable[..., Tensor], index: int | None) -> Callable[[Tensor, Tensor], Tensor]:
    """The user's weights function of one consumer, its output broadcast to [batch, pos, n(, d)]."""

    def weights(sources: Tensor, h: Tensor) -> Tensor:
        w = torch.as_tensor(fn(index, sources, h)).to(h.device)
        if w.ndim in (1, 2) and w.shape[0] == sources.shape[0]:  # the same at every token
            w = w.expand(*h.shape[:2], *w.shape)
        return w

    return weights


def _declared(
    label: str, site: _Site, fn: Callable[..., Tensor], sources: list[Tensor], target: Tensor, tol: float
):
    """Check the user's weights of one consumer on the probe: they must rebuild its input."""
    full = torch.stack([torch.broadcast_to(s, target.shape) for s in sources])
    try:
        w = _declared_fn(fn, site.index)(full, target).double()
    except Exception as err:  # the user's function failed: one line naming it
        raise DepthscopeError(
            f"ModelSpec: the weights of {label} failed ({type(err).__name__}: {err})"
        ) from None
    n = len(sources)
    if w.shape[:3] != (*target.shape[:2], n) or w.ndim not in (3, 4):
        raise DepthscopeError(
            f"ModelSpec: the weights of {label} have shape {tuple(w.shape)}; want [batch, pos, {n}] or "
            f"[batch, pos, {n}, d_model]"
        )
    rebuilt = (
        torch.einsum("bpn,nbpd->bpd", w, full) if w.ndim == 3 else torch.einsum("bpnd,nbpd->bpd", w, full)
    )
    left = error(target, rebuilt)
    if not left <= tol:
        raise DepthscopeError(
            f"ModelSpec: the weights given for {label} ({site.path}) do not rebuild its input from the "
            f"{n} sources before it (relative error {left:.2g})"
        )
    return _Weights("declared")


# --- the adapter ---------------------------------------------------------------------------------


def _vocab_ctx(model: Any, spec: ModelSpec, embeds: list[_Site]) -> tuple[int, int]:
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
    if not isinstance(vocab, int) or vocab < 2:
        raise DepthscopeError("ModelSpec: cannot tell the vocabulary size; give ModelSpec(vocab=...)")
    if not isinstance(ctx, int) or ctx < 1:
        raise DepthscopeError("ModelSpec: cannot tell the context length; give ModelSpec(ctx=...)")
    return vocab, ctx


def _head(model: Any, spec: ModelSpec, readout: _Site | None) -> Head | None:
    if spec.head is not None:
        return head_of(model.get_submodule(spec.head[0]), model.get_submodule(spec.head[1]))
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
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]  # nanoGPT's (logits, loss)
    return output.logits


def build_spec(model: Any, spec: ModelSpec) -> Adapter:
    """The adapter of ``model`` as ``spec`` names it, its weights found on a probe forward."""
    if not isinstance(spec, ModelSpec):
        raise DepthscopeError(f"spec must be a ModelSpec, got a {type(spec).__name__}")
    if not spec.embed or not spec.writes:
        raise DepthscopeError("ModelSpec: name at least one embedding (embed=) and one write (writes=)")
    embeds = [s for p in spec.embed for s in _expand(model, "embed", [p])]
    writes = [s for k, v in spec.writes.items() for s in _expand(model, k, _patterns(v))]
    reads = [s for k, v in spec.reads.items() for s in _expand(model, k, _patterns(v))]
    for s in writes + [r for r in reads if r.key != READOUT]:
        _kind(s.key)
    forward = spec.forward or (lambda m, t: m(t))
    vocab, ctx = _vocab_ctx(model, spec, embeds)
    record = _Record(model, embeds + writes + reads, vocab, forward)
    writes.sort(key=lambda s: record.end[s.path])  # a source exists once its module has returned
    reads.sort(key=lambda s: (s.key == READOUT, record.start[s.path]))

    sources, values, used = [], [], set()
    for k, s in enumerate(embeds):
        label = EMBED if k == 0 else f"{EMBED}.{s.path.split('.')[-1]}"
        sources.append((SourceSpec(label, label, EMBED, 0), s))
    for d, s in enumerate(writes, start=1):
        label = f"{s.index}.{s.key}" if s.index is not None else s.key
        if label in used:
            raise DepthscopeError(
                f"ModelSpec: two writes are both {label}; name one module per layer and kind"
            )
        used.add(label)
        sources.append((SourceSpec(label, label, _kind(s.key), d), s))
    values = [record.value(s.path, "out") for _, s in sources]
    tol = PROBE_TOLERANCE.get(model_dtype(model), FLOAT_TOLERANCE)

    consumers, per_token, labels, found_as = [], {}, set(), {}
    for r in reads:
        label = READOUT if r.key == READOUT else (f"{r.index}.{r.key}" if r.index is not None else r.key)
        if label in labels:
            raise DepthscopeError(f"ModelSpec: two reads are both {label}; name one module per layer and key")
        labels.add(label)
        before = [
            j
            for j, (_, s) in enumerate(sources)
            if j < len(embeds) or record.end[s.path] < record.start[r.path]
        ]
        n = len(before)
        if before != list(range(n)):
            raise DepthscopeError(f"ModelSpec: consumer {label} reads a source written after a later one")
        given = spec.weights.get(r.key)
        if given is not None:
            found = _declared(label, r, given, values[:n], record.value(r.path, "in"), tol)
        else:
            found = _weights_of(label, r.path, values[:n], record.value(r.path, "in"), tol)
        kind = READOUT if r.key == READOUT else _kind(r.key)
        depth = 1 + sum(1 for s, _ in sources[:n] if s.kind != EMBED)
        weights = f"{label}.w" if found.how in ("token", "declared") else None
        consumers.append(ConsumerSpec(label, f"{label}.in", kind, depth, n, weights, found.static))
        found_as[label] = found.how
        if weights is not None:
            per_token[label] = (n, _declared_fn(given, r.index) if given is not None else None)
    readout = next((r for r in reads if r.key == READOUT), None)
    attrs = {
        "scheme": spec.scheme,
        "variant": spec.scheme,
        "label": spec.label or type(model).__name__,
        "family": NAME,
        "config": json.dumps(spec.describe(), sort_keys=True),
        "weights_found": json.dumps({c.label: found_as[c.label] for c in consumers}, sort_keys=True),
    }
    taps = {s.label: f"{site.path}:out" for s, site in sources}
    inputs = {c.label: f"{r.path}:in" for c, r in zip(consumers, reads)}
    return Adapter(
        family=NAME,
        sources=[s for s, _ in sources],
        consumers=consumers,
        attrs=attrs,
        ctx=ctx,
        vocab=vocab,
        attach=lambda m, cbs: _attach(m, cbs, taps, inputs, per_token),
        forward=forward,
        head=_head(model, spec, readout),
        logits=_logits,
    )


def model_dtype(model: Any) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (float32 if it has none)."""
    try:
        return next(p.dtype for p in model.parameters() if p.is_floating_point())
    except StopIteration:
        return torch.float32


@contextlib.contextmanager
def _attach(
    model: Any,
    callbacks: list[tuple[str, Callback]],
    taps: dict[str, str],
    inputs: dict[str, str],
    per_token: dict[str, tuple[int, Callable[[Tensor, Tensor], Tensor] | None]],
):
    """Module hooks: each source's output and each consumer's input to the engine; for a consumer
    with per-token weights, its weights solved from the sources of this forward and its input.
    """
    send = router(callbacks)
    order = list(taps)
    seen: dict[str, Tensor] = {}

    def source(label: str):
        def hook(t: Tensor) -> Tensor | None:
            t = t.unsqueeze(0) if t.ndim == 2 else t  # [pos, d]: shared over the batch
            seen[label] = t
            return send(label, t)

        return hook

    def consumer(label: str):
        def hook(h: Tensor) -> Tensor | None:
            if label in per_token:  # from what this forward wrote and what the module receives
                n, declared = per_token[label]
                stack = torch.stack([torch.broadcast_to(seen[s], h.shape) for s in order[:n]])
                send(f"{label}.w", declared(stack, h) if declared else token_weights(stack, h)[0])
            return send(f"{label}.in", h)  # an ablation's replacement, if any

        return hook

    hooks = [(tap, source(label)) for label, tap in taps.items()]
    hooks += [(tap, consumer(label)) for label, tap in inputs.items()]
    with module_attach(model, hooks):
        try:
            yield
        finally:
            seen.clear()


# --- discovery: the spec of a plain module shaped like a pre-norm decoder -----------------------


def _is_norm(module: Any) -> bool:
    return "norm" in type(module).__name__.lower()


def _called_children(model: Any, block: Any, embeds: list[str]) -> list[tuple[str, Any]]:
    """The first block's children in the order a forward calls them (registration order where the
    forward fails or calls none): a block may register its norms first and call them in turn.
    """
    children = list(block.named_children())
    vocab = getattr(model.get_submodule(embeds[0]), "num_embeddings", None) if embeds else None
    if not isinstance(vocab, int) or vocab < 2:
        return children
    order: list[str] = []
    handles = [c.register_forward_pre_hook(lambda m, a, n=n: order.append(n)) for n, c in children]
    try:
        with evaluating(model), torch.no_grad():
            model(torch.randint(0, vocab, (1, 8), generator=torch.Generator().manual_seed(0)))
    except Exception:  # noqa: BLE001 - a model that needs more than ids: registration order
        return children
    finally:
        for h in handles:
            h.remove()
    first = list(dict.fromkeys(order))
    by_name = dict(children)
    return [(n, by_name[n]) for n in first] or children


def guess_spec(model: Any) -> ModelSpec | None:
    """The spec of a plain ``nn.Module`` shaped like a pre-norm decoder (nanoGPT), or None.

    Embeddings: the ``nn.Embedding`` modules outside the blocks, in registration order (a token
    embedding, then a learned position embedding). Blocks: the longest ``nn.ModuleList`` of one
    class. In a block, in the order a forward calls its children, each norm is a read and the next
    child that is not a norm its write, of the kind its attribute name says (``attn``, ``mlp``).
    The read-out: the last norm outside the blocks. ``build_spec`` then checks the guess like any
    spec, so a wrong guess is refused.
    """
    from depthscope.probes.adapters.structure import path_word

    if not isinstance(model, torch.nn.Module):
        return None
    lists = [
        (path, m)
        for path, m in model.named_modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1
    ]
    if not lists:
        return None
    blocks, layer_list = max(lists, key=lambda pm: len(pm[1]))
    inside = lambda p: p == blocks or p.startswith(blocks + ".")  # noqa: E731
    embeds = [p for p, m in model.named_modules() if isinstance(m, torch.nn.Embedding) and not inside(p)]
    norms = [p for p, m in model.named_modules() if _is_norm(m) and not inside(p) and p]
    children = _called_children(model, layer_list[0], embeds)
    writes, reads = {}, {}
    for k, (name, child) in enumerate(children):
        if not _is_norm(child):
            continue
        nxt = next(((n, c) for n, c in children[k + 1 :] if not _is_norm(c)), None)
        kind = path_word(nxt[0]) if nxt else None
        if kind is None or kind in writes:
            return None
        writes[kind] = f"{blocks}.*.{nxt[0]}"
        reads[kind] = f"{blocks}.*.{name}"
    if not embeds or not writes or not norms:
        return None
    return ModelSpec(
        embed=embeds, writes=writes, reads={**reads, READOUT: norms[-1]}, label=type(model).__name__
    )
