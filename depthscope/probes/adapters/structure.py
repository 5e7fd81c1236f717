"""How a decoder's layers write to its residual stream, found and checked on one probe forward.

The ``Probe`` is the one probe forward behind every way a model is read (layouts, discovery,
post-LN discovery, a ModelSpec and its suggestion): random token ids [2, 8], every call of the
modules it watches recorded with its first input and output.

A ``Plan`` says, in module paths, what the Hugging Face adapter reads: the embedding sources and
their static scales; for every layer the steps of its stream (the modules whose input is the
stream at that point, then the writes added to it together, each with its static scale; a step may
also scale the stream it adds to, gemma4's ``layer_scalar``); and the module that reads the final
stream (the read-out). A plan comes from a row of the layouts table (``huggingface.LAYOUTS``) or
from ``discover``; either way it is written as a ModelSpec (``huggingface.spec_of``) and checked as
every reading is, by ``verify``: each consumer's input on the probe is the sum of the sources before
it with its weights. A model that is not the sum of its writes is refused in one line naming the
first consumer that is not; a tap that runs more than once per forward is refused too.

The engine's rebuild check on every batch of a capture stays the final guard. Legend: batch, pos,
d_model; a value is a recorded tensor [batch, pos, d_model] ([1, pos, d_model] for a position
embedding shared over the batch).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from depthscope.errors import DepthscopeError, first_line
from depthscope.probes.adapters import fit as weights
from depthscope.probes.adapters.base import (
    ConsumerSpec,
    evaluating,
    input_device,
    input_slot,
    token_view,
)
from depthscope.trace.labels import ATTN, EMBED, MLP, SSM, Kind

# relative tolerance of a rebuilt value on the probe: float32 sums of a few terms are good to
# about 1e-7; half precision rounds every addition (the engine allows 1e-2 and 5e-2 there)
PROBE_TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2}
FLOAT_TOLERANCE = 1e-5
PROBE_SHAPE = (2, 8)  # [batch, pos] of the probe's random token ids
MAX_TERMS = 3  # writes added at once (falcon_h1 adds its mamba and attention outputs together)


@dataclass(frozen=True)
class Sublayer:
    """One write to the stream: the module whose input is the stream it reads (its consumer), the
    tap of what it adds (its source), its kind and the static scale it is added with.
    """

    read: str  # module path; the consumer's tap is its input
    write: str  # tap of what is added ("path:out")
    kind: Kind
    scale: float = 1.0
    # how many steps before its own the stream it reads is (longcat_flash's shortcut MoE reads the
    # first half-layer's stream and is added at the end of the layer); 0: its own step's stream
    back: int = 0


@dataclass(frozen=True)
class Step:
    """Sublayers that read one state of the stream and are added together; ``keep`` scales the
    stream they are added to (1: a plain residual).
    """

    subs: tuple[Sublayer, ...]
    keep: float = 1.0


@dataclass(frozen=True)
class Embed:
    """A source before the first layer (the token embedding, a position embedding) and its scale."""

    label: str
    tap: str
    scale: float = 1.0


@dataclass(frozen=True)
class Plan:
    """What the adapter reads of one model (see the module docstring)."""

    layers: str  # path of the list of layers
    embeds: tuple[Embed, ...]
    steps: tuple[tuple[Step, ...], ...]  # per layer that runs
    readout: str  # tap of the final stream: the final norm's input ("path:in"), else the last layer's output
    origin: str  # "layout NAME" or "discovered"
    indices: tuple[int, ...] = ()  # the index of each layer that runs (empty: all of them)

    def index(self) -> tuple[int, ...]:
        """The list index of each entry of ``steps`` (a layer skipped in the forward has none)."""
        return self.indices or tuple(range(len(self.steps)))


class Refused(DepthscopeError):
    """A structural check failed: the model is not read (the message names the check)."""


# --- the probe ---------------------------------------------------------------------------------


@dataclass(eq=False)  # compared by identity: a call is one event
class Call:
    """One call of a module in the probe forward: when it started and returned (ticks of one clock
    over every recorded call's start and return), the module, what it was given and returned, and
    those seen as the stream [batch or 1, pos, ...] (``input``, ``output``: None when not such a
    tensor). ``raw_in``/``raw_out`` are CPU copies of a floating-point first input and output
    (first element of a tuple), else a short name of what they were (None: nothing).
    """

    index: int
    path: str
    module: Any
    raw_in: Any
    on_ids: bool  # its first input is the probe's token ids (an embedding called on them)
    input: Tensor | None = None
    raw_out: Any = None
    output: Tensor | None = None
    end: int = -1


class Probe:
    """One forward of ``model`` on random token ids [batch, pos] (``shape``) with every call of the
    modules at ``paths`` (default: every module) recorded: the one probe behind discovery, layouts,
    post-LN discovery, ModelSpec and its suggestions.

    ``calls`` in the order they started; ``count[path]`` how often each module ran; ``first[path]``
    its first call; ``logits`` the model's output logits. Refused, in one line, if the model's own
    code fails on the ids.
    """

    def __init__(
        self, model: Any, vocab: int, forward=None, shape: tuple[int, int] = PROBE_SHAPE, paths=None
    ):
        g = torch.Generator().manual_seed(0)
        self.shape = shape
        self.tokens = torch.randint(min(5, vocab - 1), vocab, shape, generator=g)
        self.calls: list[Call] = []
        self.count: dict[str, int] = {}
        self.first: dict[str, Call] = {}
        self.modules = {path for path, _ in model.named_modules()}
        self.clock = 0
        named = model.named_modules() if paths is None else ((p, model.get_submodule(p)) for p in paths)
        running: dict[str, list[Call]] = {}  # calls started and not finished, per module (recursion)
        handles = []
        try:
            for path, module in named:
                handles.append(module.register_forward_pre_hook(self._pre(path, running), with_kwargs=True))
                handles.append(module.register_forward_hook(self._post(path, running)))
            with evaluating(model), torch.no_grad():
                out = (forward or (lambda m, t: m(t)))(model, self.tokens.to(input_device(model)))
        except DepthscopeError:
            raise
        except Exception as err:  # the model's own code failed on a plain batch of ids
            raise Refused(f"the probe forward failed ({type(err).__name__}: {first_line(err)})") from None
        finally:
            for h in handles:
                h.remove()
        self.logits = out if isinstance(out, Tensor) else getattr(out, "logits", None)
        self.dtype = next((c.output.dtype for c in self.calls if c.output is not None), torch.float32)

    def _stream(self, t: Any) -> Tensor | None:
        """What a tap would see of a copied value (``base.token_view``), if it is [batch or 1, pos, ...]."""
        t = token_view(t, self.shape)
        if not isinstance(t, Tensor) or t.ndim != 3:
            return None
        b, p = self.shape
        return t if t.shape[1] == p and t.shape[0] in (1, b) else None

    def _tick(self) -> int:
        self.clock += 1
        return self.clock - 1

    def _pre(self, path: str, running: dict):
        def hook(module, args, kwargs):
            x = input_slot(args, kwargs)[1]
            on_ids = isinstance(x, Tensor) and x.shape == self.shape and torch.equal(x.cpu(), self.tokens)
            raw = _copy(x)
            first = x[0] if isinstance(x, (tuple, list)) and x else x  # GPT-1's blocks pass (hidden, ...)
            seen = self._stream(raw if first is x else _copy(first))
            call = Call(self._tick(), path, module, raw, on_ids, seen)
            self.calls.append(call)
            self.count[path] = self.count.get(path, 0) + 1
            self.first.setdefault(path, call)
            running.setdefault(path, []).append(call)

        return hook

    def _post(self, path: str, running: dict):
        def hook(module, args, out):
            call = running[path].pop()
            call.raw_out = _copy(out[0] if isinstance(out, (tuple, list)) and out else out)
            call.output, call.end = self._stream(call.raw_out), self._tick()

        return hook

    def once(self, path: str) -> Call:
        """The single call of ``path``; Refused if it did not run, or ran more than once."""
        n = self.count.get(path, 0)
        if n != 1:
            raise Refused(
                f"{path} does not run in the forward"
                if n == 0
                else f"{path} runs {n} times in one forward, so a hook on it cannot tell the calls apart"
            )
        return self.first[path]

    def when(self, tap: str) -> int:
        """The tick at which a ``"path:in"`` or ``"path:out"`` value exists: an input as its module's
        first call starts, an output once that call has returned.
        """
        path, _, where = tap.rpartition(":")
        call = self.first[path]
        return call.index if where == "in" else call.end

    def tolerance(self) -> float:
        """The relative tolerance of a rebuilt value in the model's compute dtype."""
        return PROBE_TOLERANCE.get(self.dtype, FLOAT_TOLERANCE)


# --- numbers ---------------------------------------------------------------------------------------


def error(value: Tensor, rebuilt: Tensor) -> float:
    """Relative error |value - rebuilt| / |value| in float64 (1 for a zero value rebuilt as nonzero;
    infinite for values of different widths, which are never the same).
    """
    v, r = value.double(), rebuilt.double()
    if v.shape[1:] != r.shape[1:] or (v.shape[0] != r.shape[0] and 1 not in (v.shape[0], r.shape[0])):
        return math.inf
    if v.shape != r.shape:
        v, r = torch.broadcast_tensors(v, r)
    den = float(v.norm())
    num = float((v - r).norm())
    return num / den if den > 0 else (0.0 if num == 0 else 1.0)


def fit(
    target: Tensor, base: Tensor, terms: list[Tensor], tol: float, keep: bool = False
) -> tuple[float, ...] | None:
    """Scales (g, c_1 .. c_k) with target = g base + sum_k c_k terms_k within ``tol`` (relative to the
    target), or None; g is 1 unless ``keep`` lets it be fitted too.

    Least squares in float64 (``fit.static``): scales the values do not determine (dependent terms)
    are no fit (None). Scales within ``tol`` of 1 are 1 exactly (an unscaled residual) unless the
    free scales explain significantly more (``fit.richer``: in half precision a loose ``tol`` must not
    turn a multiplier of 0.97 into 1); one within ``tol`` of 0 means the term is not there (None), as
    does g <= 0 (a value that is some module's output minus the stream is not a state of the stream).
    """
    t = target.double()
    b = torch.broadcast_to(base.double(), t.shape).flatten()
    cols = [torch.broadcast_to(x.double(), t.shape).flatten() for x in terms]
    a = torch.stack(([b] if keep else []) + cols, 1)
    y = t.flatten() - (0 if keep else b)
    solved = weights.static(a.T, y, target.dtype)
    c = solved.w
    if not bool(solved.determined.all()):
        return None
    near = (c - 1).abs() <= tol
    snapped = torch.where(near, torch.ones_like(c), c)
    if bool(near.any()):
        rss_free, rss_snap = float(((y - a @ c) ** 2).sum()), float(((y - a @ snapped) ** 2).sum())
        free = weights.richer(
            rss_snap, rss_free, int(near.sum()), y.numel() - c.numel(), float((y * y).sum())
        )
        c = c if free else snapped
    if not torch.isfinite(c).all() or (c.abs() <= tol).any() or (keep and c[0] <= 0):
        return None  # a term that is not there; a "scaled" stream that subtracts the stream
    rebuilt = (a @ c + (0 if keep else b)).reshape(t.shape)
    scales = tuple(float(x) for x in c)
    return ((1.0,) if not keep else ()) + scales if error(t, rebuilt) <= tol else None


def _copy(t: Any) -> Any:
    """A CPU copy of a floating-point tensor (a later in-place update does not change it); else a
    short name of what it is (None: nothing).
    """
    if isinstance(t, Tensor) and t.is_floating_point():
        return t.detach().to("cpu", copy=True)
    return None if t is None else type(t).__name__


def _encloses(outer: str, path: str) -> bool:
    """Whether module ``outer`` is ``path`` or holds it (``""`` is the model itself)."""
    return outer == "" or path == outer or path.startswith(outer + ".")


# --- the check every reading passes -----------------------------------------------------------


def verify(
    consumers: list[ConsumerSpec], values: list[Tensor], targets: dict[str, tuple[str, Tensor]], tol: float
) -> None:
    """The check every reading passes on its probe forward, however it was found (a layouts row,
    discovery, a ModelSpec): each consumer with unit or static weights reads the sum of the sources
    before it (``values``, in order) with those weights, within ``tol`` of its input (``targets``:
    label -> (module path, value)); Refused naming the first that does not (NaN fails). Per-token
    weights are checked where they are solved.
    """
    for c in consumers:
        if c.weights is not None:
            continue
        w = c.static or (1.0,) * c.n_sources
        rebuilt = sum(x * v for x, v in zip(w, values[: c.n_sources]))
        path, target = targets[c.label]
        err = error(target, rebuilt)
        if not err <= tol:
            weighted = "with its static weights" if c.static is not None else "unweighted"
            raise Refused(
                f"{c.label} ({path}) does not read the stream: its input is not the sum of the {c.n_sources} "
                f"sources before it, {weighted} (relative error {err:.2g})"
            )


def tap_value(probe: Probe, tap: str) -> Tensor:
    """The value a ``"path:in"`` or ``"path:out"`` tap sees in the probe; Refused if none."""
    path, _, where = tap.rpartition(":")
    call = probe.once(path)
    value = call.input if where == "in" else call.output
    if value is None:
        raise Refused(f"{path} has no stream-shaped {'input' if where == 'in' else 'output'}")
    return value


def layer_calls(probe: Probe, path: str) -> list[tuple[int, Call]]:
    """(index, call) of the layers of the list at ``path`` that run (mllama skips its cross-attention
    layers without an image), each reading the previous one's output.
    """
    calls: list[tuple[int, Call]] = []
    for k in itertools.count():
        at = f"{path}.{k}"
        if at not in probe.count:
            if at in probe.modules:
                continue
            break
        call = probe.once(at)
        if call.input is None or call.output is None:
            raise Refused(f"layer {k} ({at}) has no stream-shaped input and output")
        if calls and error(call.input, calls[-1][1].output) > probe.tolerance():
            raise Refused(
                f"layer {k}'s input is not layer {calls[-1][0]}'s output: something acts between layers"
            )
        calls.append((k, call))
    if not calls:
        raise Refused(f"no layer of {path} runs in the forward")
    return calls


def layer_list(model: Any, probe: Probe, every: bool = False) -> tuple[str, list[tuple[int, Call]]]:
    """The path and calls (``layer_calls``) of the longest ModuleList of ``model`` whose layers that run
    (``every``: all of them) each read the previous one's output; Refused if there is none.
    """
    best: tuple[str, list[tuple[int, Call]]] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or f"{path}.0" not in probe.count:
            continue
        with contextlib.suppress(Refused):
            calls = layer_calls(probe, path)
            if (not every or len(calls) == len(module)) and (best is None or len(calls) > len(best[1])):
                best = (path, calls)
    if best is None:
        runs = "run and " if every else ""
        raise Refused(
            f"no list of layers found (no ModuleList whose layers each {runs}read the previous one's output)"
        )
    return best


# --- discovery -------------------------------------------------------------------------------------

# Words in a module's class name (less the model's own prefix: "RecurrentGemmaSdpaAttention" is
# an attention), then in its attribute name, that tell a sublayer's kind. The state-space,
# convolution and linear-attention mixers come first, since their names may also say "attention";
# a per-layer embedding (gemma4's per-layer inputs) is an embedding source, as qwen4_exp's PLE is.
KIND_WORDS: tuple[tuple[Kind, tuple[str, ...]], ...] = (
    (EMBED, ("per_layer",)),
    (
        SSM,
        ("mamba", "ssm", "conv", "deltanet", "delta", "linearattention", "linear_attn", "recurrent", "lru"),
    ),
    (SSM, ("rwkv", "mixer")),
    (ATTN, ("attn", "attention")),
    (MLP, ("mlp", "moe", "expert", "ffn", "feedforward", "feed_forward", "fc2", "dense")),
)


def kind_word(call: Call, family: str = "") -> Kind | None:
    """The kind a module's class name (else its attribute name) says, or None (a norm, a Linear ...).

    ``family`` is the model's class name: the prefix it shares with the module's class is dropped.
    """
    name = type(call.module).__name__
    common = len(os.path.commonprefix([name, family]))
    for text in (name[common:].lower(), call.path.rsplit(".", 1)[-1].lower()):
        if "norm" in text and "per_layer" not in text:
            return None
        for kind, words in KIND_WORDS:
            if any(w in text for w in words):
                return kind
    return None


def path_word(name: str) -> Kind | None:
    """The kind one attribute name on a module's path says, or None."""
    name = name.lower()
    return (
        None
        if "norm" in name
        else next((k for k, words in KIND_WORDS if any(w in name for w in words)), None)
    )


def discover(model: Any, probe: Probe, embedding: str | None) -> Plan:
    """The plan of a decoder found from the probe alone (see ``Discovery``)."""
    return Discovery(model, probe, embedding).plan()


class Discovery:
    """Find a plan from the probe's values, never from names (except to label kinds):

    * the layers: the longest list of modules each of which reads the previous one's output (of
      those that run);
    * the embedding sources: the input embedding (plus another embedding, a position one), else the
      last module before the first layer whose output is the first layer's input (up to a scale),
      else that input itself;
    * in each layer, its direct children in call order (all its modules, where a child adds the
      residual itself: bloom, mpt, pre-LN BERTs): one whose input is the stream so far is a read;
      one whose input is the stream plus some earlier outputs (a fit, with scales) marks that those
      outputs were written; at the end the layer's output must be the stream plus the rest (a fit
      may also scale the stream). Each write is fed by the read its input comes from (followed back
      through equal values), else by the latest read before it;
    * the read-out: the first module after the last layer whose input is the last layer's output
      (if that module runs more than once, the last layer's output itself).
    """

    def __init__(self, model: Any, probe: Probe, embedding: str | None):
        self.model, self.probe, self.embedding = model, probe, embedding
        self.tol = probe.tolerance()
        self.family = type(model).__name__

    def plan(self) -> Plan:
        """The discovered plan; Refused where a step of the discovery finds nothing."""
        path, ran = layer_list(self.model, self.probe)
        layers = [call for _, call in ran]
        outside = [c for c in self.probe.calls if not _encloses(path, c.path) and not _encloses(c.path, path)]
        embeds = self.embeds(layers[0], [c for c in outside if c.index < layers[0].index], path)
        steps = tuple(self.layer(i, call) for i, call in ran)
        after = [c for c in outside if c.index > layers[-1].index and c.input is not None]
        reads = [c for c in after if error(c.input, layers[-1].output) <= self.tol]
        readout = next((f"{c.path}:in" for c in reads if self.probe.count[c.path] == 1), None)
        if readout is None and reads:  # the final norm runs twice (nanochat's also norms the embedding)
            readout = f"{layers[-1].path}:out"
        if readout is None:
            raise Refused("nothing after the last layer reads its output (no final norm or head takes it)")
        return Plan(path, embeds, steps, readout, "discovered", tuple(k for k, _ in ran))

    def embeds(self, first: Call, before: list[Call], layers: str) -> tuple[Embed, ...]:
        """The sources whose (scaled) sum is the first layer's input, from the calls ``before`` it."""
        x0 = first.input
        zero = torch.zeros_like(x0, dtype=torch.float64)
        cands = [
            c
            for c in before
            if c.output is not None and c.output.shape[-1] == x0.shape[-1] and self.probe.count[c.path] == 1
        ]
        cands = [c for c in cands if c.input is None or not torch.equal(c.output, c.input)]  # not dropout
        token = next((c for c in cands if c.path == self.embedding), None)
        if token is not None:
            others = [c for c in cands if c is not token and isinstance(c.module, torch.nn.Embedding)]
            for extra in ([], *([o] for o in others)):
                scales = fit(x0, zero, [token.output] + [o.output for o in extra], self.tol)
                if scales is not None:
                    labels = [EMBED] + ["pos_embed"] * len(extra)
                    taps = [f"{c.path}:out" for c in (token, *extra)]
                    return tuple(Embed(lab, tap, sc) for lab, tap, sc in zip(labels, taps, scales[1:]))
        for c in reversed(cands):  # an embedding norm, a scaled sum of embeddings ...
            scales = fit(x0, zero, [c.output], self.tol)
            if scales is not None:
                return (Embed(EMBED, f"{c.path}:out", scales[1]),)
        return (Embed(EMBED, f"{layers}.0:in"),)  # whatever enters the first layer

    def layer(self, i: int, layer: Call) -> tuple[Step, ...]:
        """The steps of layer ``i``: from its direct children, else from all its modules."""
        prefix = f"{layer.path}."
        inside = [c for c in self.probe.calls if c.path.startswith(prefix)]
        children = [c for c in inside if "." not in c.path[len(prefix) :]]
        try:
            return self.walk(i, layer, children)
        except Refused:
            if len(inside) == len(children):
                raise
            return self.walk(i, layer, inside)

    def walk(self, i: int, layer: Call, calls: list[Call]) -> tuple[Step, ...]:
        """The steps of layer ``i``, walking ``calls`` (its modules) in call order."""
        self.at = layer.path
        stream = layer.input.double()
        reads: list[list[Call]] = [[]]  # the reads of each state of the stream so far
        pending: list[Call] = []
        steps = []
        for call in calls:
            if call.input is not None and call.input.shape == stream.shape:
                if error(call.input, stream) <= self.tol:
                    reads[-1].append(call)
                else:
                    step = self.step(i, call.input, stream, reads, pending, calls)
                    if step is not None:
                        steps.append(step)
                        stream = call.input.double()
                        reads.append([call])
            if self.candidate(call, stream, pending):
                pending.append(call)
        if error(layer.output, stream) > self.tol:
            step = self.step(i, layer.output, stream, reads, pending, calls)
            if step is None:
                raise Refused(
                    f"layer {i} writes to the stream something other than its children's outputs (its output "
                    f"is not its input plus {MAX_TERMS} or fewer of them, scaled)"
                )
            steps.append(step)
        return tuple(steps)

    def candidate(self, call: Call, stream: Tensor, pending: list[Call]) -> bool:
        """Whether a module's output may be a write: stream-shaped, run once, not an identity
        (dropout) and not the value of an earlier candidate (the module that holds it).
        """
        out = call.output
        if out is None or out.shape != stream.shape or self.probe.count[call.path] != 1:
            return False
        if call.input is not None and call.input.shape == out.shape and torch.equal(out, call.input):
            return False  # exactly its input: a dropout, an identity
        return all(error(out, c.output) > self.tol for c in pending)

    def step(self, i, target, stream, reads, pending, calls) -> Step | None:
        """The writes that take the stream to ``target`` (removed from ``pending``), or None: the
        fewest that fit, the latest first; the stream itself scaled only if none fits without.
        """
        # a module whose output is already the stream or the target added the residual itself
        usable = [c for c in pending if min(error(c.output, stream), error(c.output, target)) > self.tol]
        for keep in (False, True):
            for n in range(1, min(MAX_TERMS, len(usable)) + 1):
                for combo in itertools.combinations(reversed(usable), n):
                    scales = fit(target, stream, [c.output for c in combo], self.tol, keep=keep)
                    if scales is None:
                        continue
                    for c in combo:
                        pending.remove(c)
                    order = sorted(zip(combo, scales[1:]), key=lambda cs: cs[0].index)
                    subs = tuple(self.sublayer(i, c, sc, reads, calls) for c, sc in order)
                    return Step(subs, scales[0])
        return None

    def sublayer(
        self, i: int, write: Call, scale: float, reads: list[list[Call]], calls: list[Call]
    ) -> Sublayer:
        """The sublayer of a write: the read its input comes from (of this state of the stream, else
        of an earlier one) and the kind its modules' names say.
        """
        chain = self.chain(write, calls)
        back, read = next(
            ((b, c) for b, state in enumerate(reversed(reads)) for c in reversed(chain) if c in state),
            (0, None),
        )  # the read nearest the stream
        if read is None:  # the branch's input is made outside modules (scaled): the latest read before it
            read = next((c for c in reversed(reads[-1]) if c.index < chain[-1].index), None)
        if read is None:
            raise Refused(f"layer {i}: no module reads the stream before {write.path} writes to it")
        # its kind: the layer's child that holds it, else its branch from the read on (inkling's
        # short convolution of an attention's output writes an attention's output)
        branch = chain[: chain.index(read) + 1] if read in chain else chain
        named = [self.child(write, calls), *reversed(branch)]
        kind = next((k for k in (kind_word(c, self.family) for c in named if c is not None) if k), None)
        # else the names on its path (longcat_flash's "self_attn.0": a list of attentions, not called)
        kind = kind or next((k for k in map(path_word, write.path[len(self.at) + 1 :].split(".")) if k), None)
        if kind is None:
            raise Refused(
                f"layer {i}: cannot tell what kind of sublayer writes {write.path} "
                f"({type(write.module).__name__})"
            )
        return Sublayer(read.path, f"{write.path}:out", kind, scale, back)

    def child(self, call: Call, calls: list[Call]) -> Call | None:
        """The layer's direct child that holds ``call`` (None when it is one): its name says more
        than an inner module's (bloom's ``self_attention.dense`` is an attention's write).
        """
        head = call.path[len(self.at) + 1 :].split(".")[0]
        path = f"{self.at}.{head}"
        return None if path == call.path else next((c for c in calls if c.path == path), None)

    def chain(self, call: Call, calls: list[Call]) -> list[Call]:
        """``call`` and the modules that made its input, back to the first (followed by equal values)."""
        chain = [call]
        while chain[-1].input is not None:
            x = chain[-1].input
            maker = next(
                (
                    c
                    for c in reversed(calls)
                    if c.index < chain[-1].index
                    and c.output is not None
                    and not _encloses(c.path, chain[-1].path)
                    and error(x, c.output) <= self.tol
                ),
                None,
            )
            if maker is None:
                break
            chain.append(maker)
        return chain
