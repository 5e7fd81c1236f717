"""The capture engine: any model with an adapter + tokens -> a trace (xarray.Dataset).

One loop for every model family (``probes/adapters``): the model is put in eval mode and run
under no_grad (both restored after), the adapter's taps are attached for the duration and removed
in a ``finally``, and per batch the engine keeps one buffer of source outputs
[batch, pos, source, d_model], folds each consumer into float64 sums as soon as its input (and
weights) have been seen, so memory does not grow with the number of tokens analysed.

Checks, for every batch of every family: every source's tap fired (a source that does not fire
is an error, never uninitialised memory), every consumer was folded, and every input is rebuilt
from its sources within ``TOLERANCE`` (relative, on that batch's tokens); the final trace is
checked again. A model that fails is refused with one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from depthscope._version import __version__
from depthscope.corpus import token_windows
from depthscope.errors import DepthscopeError, TraceError, first_line
from depthscope.probes.accumulate import Accumulator
from depthscope.probes.adapters import Adapter, resolve
from depthscope.probes.adapters.base import evaluating, input_device
from depthscope.probes.adapters.bridge import encoder
from depthscope.probes.adapters.spec import NAME as SPEC
from depthscope.probes.adapters.spec import ModelSpec, build_spec, with_forward
from depthscope.probes.causal import TARGETS, Ablation, LogitProbe, require_head
from depthscope.probes.load import source_attrs
from depthscope.probes.partial import (
    check_state,
    load_partial,
    model_fingerprint,
    save_partial,
    windows_fingerprint,
)
from depthscope.probes.settings import CaptureSettings, Partial, check_window
from depthscope.probes.shard import all_gather, shard
from depthscope.probes.terms import Factored, Split, Terms, Windows, block_terms
from depthscope.probes.workspace import Workspace
from depthscope.progress import bar
from depthscope.resources import steady_heap
from depthscope.trace import CAUSAL_VARIABLE_ATTRS as CAUSAL_ATTRS
from depthscope.trace.labels import READOUT

TOLERANCE = 1e-4  # residual_error above this (float32) means the decomposition is not exact
# half precision: measured on SmolLM2 (docs/results.md, "Running at scale"), with a margin
LOW_PRECISION = {torch.bfloat16: 5e-2, torch.float16: 1e-2}
# Default window length: the model's context, at most this. Long-context models (SmolLM2: 8192)
# would otherwise cost minutes and gigabytes per window on a CPU, and shares depend on the window
# length, so a fixed, stated default keeps traces of different models comparable.
DEFAULT_WINDOW = 1024


def capture(
    model: Any,
    data: Any = None,
    settings: CaptureSettings | None = None,
    *,
    progress: bool = True,
    checkpoint: str = "",
    adapter: str | Adapter | None = None,
    tokenizer: Any = None,
    forward: Callable[[Tensor], Any] | None = None,
    spec: ModelSpec | None = None,
    **options: Any,
) -> xr.Dataset:
    """Capture a trace of ``model`` on ``data`` (token ids, a corpus or a path; None = default corpus).

    Args:
        model: any model an adapter knows (a depthscope model, a TransformerBridge, ...), or an
            nnsight wrapper of one (``NNsight``, ``LanguageModel``: its module is captured).
        progress: a progress bar on stderr (``False`` silences it).
        settings: what to compute (``CaptureSettings``); or give its fields as keyword
            ``options`` (``n_tokens=8192, rank=True``). ``partial`` may be a path, with
            ``save_every`` and ``resume`` beside it.
        checkpoint: where the model came from (recorded in the trace).
        adapter: an adapter family name (or an Adapter) instead of detection.
        tokenizer: a Hugging Face tokenizer for reading a corpus (default: the model's own, if
            it carries one as ``model.tokenizer``).
        forward: how to run the model on a batch of token ids [batch, pos], for models called
            another way than ``model(tokens)``.
        spec: a ``ModelSpec`` naming where a model no family knows writes and reads (its
            consumers' weights are found from the activations: ``probes.adapters.spec``).

    In a torch.distributed process group (torchrun), each rank captures its share of the batches
    and every rank returns the merged trace (``probes.shard``); the trace records ``world_size``.

    Raises:
        DepthscopeError for bad input (too-short corpus, unknown model, bad settings) and
        TraceError for a model whose inputs cannot be rebuilt from its sources.
    """
    settings = _settings(settings, options)
    model, tokenizer = unwrap(model, tokenizer)
    if spec is not None and adapter is not None:
        raise DepthscopeError("give an adapter or a spec, not both")
    ad = _adapter(model, spec if spec is not None else adapter, tokenizer, forward, data)
    if settings.causal:  # before the slow work: a model without an LM head is refused at once
        require_head(ad, "--logits" if settings.logits else "--lens" if settings.lens else "--ablate")
    windows, corpus_name, skip = _windows(ad, data, settings)
    me, world = shard()
    chunks = windows.split(settings.batch_size)
    mine = list(range(me, len(chunks), world))
    run = Run(ad, settings, skip, windows.shape[1])
    record = None
    if settings.partial.active:
        record = {
            "model": model_fingerprint(model, ad.attrs),
            "windows": windows_fingerprint(windows, corpus_name),
            "settings": settings.fingerprint(skip_positions=skip, world_size=world, shard=me),
        }
    done = _resume(run, settings.partial, record, mine, chunks)
    failure = _batches(model, run, chunks, mine, done, record, progress and me == 0)
    run = _gather(run, failure, world)

    return run.dataset(
        {
            **ad.attrs,
            **source_attrs(model),  # where depthscope.load found it: a hub id and commit, custom code run
            "checkpoint": str(checkpoint),
            "corpus": corpus_name,
            "tokenization": _tokenization(ad, data),
            "seed": settings.seed,
            "ctx": int(windows.shape[1]),
            "skip_positions": int(skip),
            "depthscope_version": __version__,
            "world_size": world,
        }
    )


def _tokenization(ad: Adapter, data: Any) -> str:
    """How the analysed ids were made: given, the corpus's bytes, or a named tokenizer's."""
    if isinstance(data, Tensor):
        return "token ids given"
    if ad.encode is None:
        return "bytes (the text's bytes are the ids: a byte-level model)"
    return str(getattr(ad.encode, "tokenization", "a tokenizer"))


def unwrap(model: Any, tokenizer: Any = None) -> tuple[Any, Any]:
    """The module to capture and the tokenizer to read text with: an nnsight wrapper (``NNsight``,
    ``LanguageModel``: an ``Envoy``) gives its underlying module, its weights loaded first if it was
    built lazily, and its tokenizer unless one is given. Anything else is returned as it is. Found
    by the wrapper's class, so nnsight is never imported here.
    """
    if not any(c.__module__.split(".")[0] == "nnsight" for c in type(model).__mro__):
        return model, tokenizer
    own = vars(model)
    if own.get("dispatched") is False:  # a meta-device skeleton: nnsight's own first trace loads it
        model.dispatch()
    module = own.get("_module", own.get("_model"))  # the wrapped module (0.8: _module)
    if not isinstance(module, torch.nn.Module):
        raise DepthscopeError(f"cannot capture this {type(model).__name__}: it wraps no torch module")
    if tokenizer is None and getattr(module, "tokenizer", None) is None:
        tokenizer = own.get("tokenizer")
    return module, tokenizer


def _settings(settings: CaptureSettings | None, options: dict[str, Any]) -> CaptureSettings:
    """``settings``, or the CaptureSettings that keyword options describe (not both)."""
    if settings is not None:
        if options:
            raise DepthscopeError(f"give capture settings or options, not both ({', '.join(options)})")
        return settings
    partial = options.pop("partial", None)
    save_every, resume = options.pop("save_every", 0), options.pop("resume", False)
    if not isinstance(partial, Partial):
        partial = Partial(partial, save_every, resume)
    known = {f.name for f in dataclasses.fields(CaptureSettings)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise DepthscopeError(f"unknown capture option(s): {', '.join(unknown)} (known: {', '.join(known)})")
    return CaptureSettings(**options, partial=partial)


def _adapter(
    model: Any, adapter: str | Adapter | ModelSpec | None, tokenizer: Any, forward: Any, data: Any = None
) -> Adapter:
    """The model's adapter, with the tokenizer or forward the caller gives (a copy: never mutated).
    A spec (given or discovered) runs its probe with ``forward`` too, and takes its window length
    from token ids [batch, pos] where the model does not say it.
    """
    ctx = int(data.shape[1]) if isinstance(data, Tensor) and data.ndim == 2 else None
    if isinstance(adapter, ModelSpec):
        ad = build_spec(model, with_forward(adapter, forward), ctx=ctx)
    else:
        ad = resolve(model, adapter, ctx=ctx, forward=forward)
        if forward is not None and ad.family != SPEC:
            ad = dataclasses.replace(ad, forward=lambda _model, tokens: forward(tokens))
    if tokenizer is not None:
        ad = dataclasses.replace(ad, encode=encoder(tokenizer))
    return ad


def _windows(ad: Adapter, data: Any, settings: CaptureSettings) -> tuple[Tensor, str, int]:
    """The token windows [n, window] of ``data``, the corpus's name and the positions skipped."""
    window = min(ad.ctx, DEFAULT_WINDOW) if settings.ctx is None else settings.ctx
    check_window(window, ad.ctx)
    windows, corpus_name = token_windows(
        data, window, settings.n_tokens, settings.seed, encode=ad.encode, vocab=ad.vocab
    )
    skip = ad.skip_positions if settings.skip_positions is None else settings.skip_positions
    if not 0 <= skip < windows.shape[1]:
        raise DepthscopeError(
            f"skip_positions must be between 0 and {windows.shape[1] - 1} (window of {windows.shape[1]}), "
            f"got {skip}"
        )
    return windows, corpus_name, int(skip)


def _resume(run: Run, partial: Partial, record: dict | None, batches: list[int], chunks: tuple) -> int:
    """Merge the partial state into ``run`` if resuming from one; the batches it had done (of this
    rank's ``batches``), checked against the state's own token count.
    """
    if record is None or not partial.resume or not partial.path.is_file():
        return 0
    state, meta = load_partial(partial.path, record)
    check_state(partial.path, state, run.state())
    done = meta.get("batches_done")
    if type(done) is not int or not 0 < done < len(batches):
        raise DepthscopeError(
            f"{partial.path}: this partial capture's batch count {done!r:.20} is not this run's"
        )
    tokens = sum(len(chunks[b]) for b in batches[:done]) * (run.window - run.skip)
    held = int(state["acc.tokens"])
    if held != tokens:
        raise DepthscopeError(
            f"{partial.path}: this partial capture holds {held} tokens, its {done} batches hold {tokens}; "
            "delete it"
        )
    run.merge(state)
    return done


def _batches(
    model: Any, run: Run, chunks: tuple, mine: list[int], done: int, record: dict | None, progress: bool
) -> Exception | None:
    """Run this rank's batches from ``done`` on (saving the partial state as asked); the error that
    stopped them, if any (a failing rank tells the others before raising, so none waits forever).
    """
    partial, size, mode = run.settings.partial, run.settings.batch_size, run.settings.ablate
    ablating = f" + ablate {mode} ({len(run.ablation.units)} per batch)" if run.ablation else ""
    device = input_device(model)
    try:
        with (
            evaluating(model),
            torch.no_grad(),
            steady_heap(),
            bar("capture" + ablating, sum(len(chunks[b]) for b in mine), enabled=progress) as pb,
        ):
            pb.advance(sum(len(chunks[b]) for b in mine[:done]))
            for b in mine[done:]:
                run.batch(model, chunks[b].to(device), b, b * size)
                done += 1
                pb.advance(len(chunks[b]))
                if partial.save_every and done % partial.save_every == 0 and done < len(mine):
                    meta = {"batches_done": done, "windows_done": sum(len(chunks[b]) for b in mine[:done])}
                    save_partial(partial.path, run.state(), {**record, **meta})
    except Exception as err:
        return err
    return None


def _gather(run: Run, failure: Exception | None, world: int) -> Run:
    """This rank's run alone, or every rank's merged in rank order (a reproducible float64 sum)."""
    if world == 1:
        if failure is not None:
            raise failure
        return run
    gathered = all_gather((None if failure is None else _describe(failure), None if failure else run.state()))
    if failure is not None:
        raise failure
    first = next((msg for msg, _ in gathered if msg is not None), None)
    if first is not None:
        raise DepthscopeError(f"another rank failed: {first}")
    merged = Run(run.ad, run.settings, run.skip, run.window)
    for _, state in gathered:
        merged.merge(state)
    return merged


def _describe(err: Exception) -> str:
    return str(err) if isinstance(err, DepthscopeError) else f"{type(err).__name__}: {err}"


class Run:
    """One capture's accumulators (trace sums, logit probe, ablations) and its per-batch work.

    ``skip`` and ``window`` are what the capture resolved (positions skipped, window length).
    """

    def __init__(self, ad: Adapter, settings: CaptureSettings, skip: int, window: int):
        self.ad, self.settings, self.skip, self.window = ad, settings, skip, window
        # ablated batches: the first ones, by their global index, so sharding does not change them
        tokens = settings.ablate_tokens
        self.ablate_windows = None if tokens is None else math.ceil(tokens / window)  # None: all
        # a model whose consumers all hand their terms (post-LN) needs no copy of the source outputs
        values = not all(c.terms for c in ad.consumers)
        self.workspace = Workspace()  # the buffers kept from batch to batch, lent to the adapter
        self.acc = Accumulator(ad.layout(), covariance=settings.rank, values=values, workspace=self.workspace)
        self.probe = LogitProbe(ad, skip, lens=settings.lens) if settings.causal else None
        ablate = settings.ablate
        self.ablation = Ablation(ad, skip, ablate, settings.ablate_mean) if ablate else None
        self.taps = Taps(ad, self.acc, skip, self.probe)
        self.callbacks = self.taps.callbacks()
        # without logits, the forward stops at the unembedding once the batch is complete: the
        # read-out's input is the last thing a trace reads, and the unembedding would cost about a
        # fifth of a small LM's forward (SmolLM2) for nothing
        unembed = getattr(ad.head, "unembed", None)
        self.stop_at = unembed if self.probe is None and isinstance(unembed, torch.nn.Module) else None

    def batch(self, model: Any, chunk: Tensor, b: int, first: int = 0) -> None:
        """Batch ``b``: windows ``first``, ``first + 1``, ... of the capture."""
        ad = self.ad
        self.acc.half_batch = b % 2 == 0  # by the batch's global index: shards and resumes keep it
        self.taps.new_batch(chunk)
        output = None
        with _model_failure(b, chunk):
            with ad.attached(model, self.callbacks, self.workspace), self._stopping():
                try:
                    output = ad.forward(model, chunk)
                except _Stop:  # the batch is complete: the rest of the forward (the logits) is not needed
                    pass
        self.taps.end_batch(b)
        if self.probe is not None:
            self.probe.end_batch(ad.logits(output))
        if self.ablation is not None:
            n = len(chunk) if self.ablate_windows is None else min(len(chunk), self.ablate_windows - first)
            if n > 0:  # the first windows of the capture, by global index: sharding does not move them
                with _model_failure(b, chunk):
                    self.ablation.run(model, chunk[:n])
        self.acc.add_tokens(chunk.shape[0] * (chunk.shape[1] - self.skip))

    @contextlib.contextmanager
    def _stopping(self) -> Iterator[None]:
        """While active, the unembedding stops the forward if the batch is already complete."""
        if self.stop_at is None:
            yield
            return

        def stop(module, args) -> None:
            if self.taps.complete():
                raise _Stop

        handle = self.stop_at.register_forward_pre_hook(stop)
        try:
            yield
        finally:
            handle.remove()

    def parts(self) -> dict[str, Any]:
        """The run's accumulators by name (None where a view is not asked for)."""
        return {"acc": self.acc, "probe": self.probe, "ablation": self.ablation}

    def state(self) -> dict[str, np.ndarray]:
        """Every accumulator's state, keys prefixed by the accumulator (``acc.``, ``probe.`` ...)."""
        out = {"dtype": np.array(str(self.taps.dtype or ""))}
        for name, part in self.parts().items():
            if part is not None:
                out.update({f"{name}.{k}": v for k, v in part.state().items()})
        return out

    def merge(self, state: dict[str, np.ndarray]) -> None:
        """Add a state (of the windows after this run's) into this run's accumulators."""
        for name, part in self.parts().items():
            if part is not None:
                part.merge({k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")})
        if str(state["dtype"]):
            self.taps.dtype = self.taps.dtype or getattr(torch, str(state["dtype"]).removeprefix("torch."))

    def dataset(self, attrs: dict) -> xr.Dataset:
        """The trace of everything run so far, checked (the rebuild and the logit attribution)."""
        ad, probe, ablation = self.ad, self.probe, self.ablation
        tol = tolerance(self.taps.dtype)
        ds = self.acc.dataset({**attrs, "dtype": str(self.taps.dtype or "").removeprefix("torch.")})
        extra = probe.variables(tol) if probe is not None else {}
        if ablation is not None:
            extra.update(ablation.variables(len(ad.consumers), len(ad.sources)))
            ds.attrs.update(
                ablation=self.settings.ablate,
                ablation_mean=int(self.settings.ablate_mean),
                ablation_tokens=int(ablation.tokens),
            )
        if probe is not None:
            ds.attrs.update(loss=probe.loss / max(probe.tokens, 1), logit_tokens=int(probe.tokens))
        for name, (dims, array) in extra.items():
            ds[name] = (dims, array)
            ds[name].attrs.update(long_name=CAUSAL_ATTRS[name][0], units=CAUSAL_ATTRS[name][1])
        if "logit_attribution" in ds:
            ds = ds.assign_coords(target=np.array(TARGETS, dtype=object))
        for name, (dims, array, coords) in ad.static_native().items():
            ds[name] = xr.DataArray(array, dims=dims, coords=coords)
            ds[name].attrs.update(long_name=f"{name} (native, static)", units="1")
        check_additive(ds, tol, ad.hint)
        return ds


def tolerance(dtype: torch.dtype | None) -> float:
    """The rebuild tolerance for a model computing in ``dtype``: ``TOLERANCE`` for float32 and
    float64; for half precision, where every residual addition rounds to 8 (bfloat16) or 11
    (float16) bits, ``LOW_PRECISION[dtype]``.
    """
    return LOW_PRECISION.get(dtype, TOLERANCE)


@contextlib.contextmanager
def _model_failure(b: int, chunk: Tensor) -> Iterator[None]:
    """The model's own exception in a batch's forward as one line (depthscope's own errors, and
    Ctrl-C, pass as they are): a cache sized for another batch, a shape the code did not expect.
    """
    try:
        yield
    except DepthscopeError:
        raise
    except Exception as err:
        raise DepthscopeError(
            f"the model's forward failed on batch {b} (token ids {list(chunk.shape)}): "
            f"{type(err).__name__}: {first_line(err)} (a cache or buffer sized for a smaller batch? lower "
            "--batch-size, or size it in the spec file's setup())"
        ) from None


class _Stop(Exception):
    """Raised by the last tap of a batch when nothing after the read-out's input is needed."""


class Taps:
    """The engine's callbacks, batch by batch: the source buffer, consumer folding and checks.

    Every tensor arrives [batch, pos, ...] and goes to the accumulator flattened to [T, ...] (the
    skipped positions cut, half precision in float32). When the capture needs no logits, the tap
    that completes a batch (every source, consumer and native quantity seen) stops the forward
    there (``_Stop``): the read-out's input is the last thing a trace reads, and the unembedding
    after it would cost a fifth of a small LM's forward for nothing.
    """

    def __init__(self, adapter: Adapter, acc: Accumulator, skip: int, probe: LogitProbe | None = None):
        self.ad, self.acc, self.skip, self.probe = adapter, acc, skip, probe
        self.n_sources = len(adapter.sources)
        self.fired = np.zeros(self.n_sources, dtype=bool)
        self.pending: dict[int, dict[str, Any]] = {}
        self.natives: set[int] = set()
        self.row = {c.label: i for i, c in enumerate(adapter.consumers)}
        # natives holding the parts of a source's write, by source index; and this batch's parts
        self.splits = {
            [s.label for s in adapter.sources].index(n.parts_of): (
                n.name,
                n.dims,
                self.row[n.layer],
                n.project,
            )
            for n in adapter.native
            if n.parts_of is not None
        }
        self.parts: dict[int, Tensor] = {}
        self.split_error: dict[int, float] = {}
        self.static = {
            i: torch.tensor(c.static, dtype=torch.float64)
            for i, c in enumerate(adapter.consumers)
            if c.static
        }
        self.dtype: torch.dtype | None = None  # the model's compute dtype, from its first source
        self.shape: tuple[int, int] | None = None  # (batch, pos) after the skipped positions

    def callbacks(self) -> list[tuple[str, Any]]:
        """(tap, callback) for every source, consumer input, weights and native quantity."""
        out = [(s.tap, self._on_source(j)) for j, s in enumerate(self.ad.sources)]
        for i, c in enumerate(self.ad.consumers):
            out.append((c.tap, self._on_consumer(i, "h")))
            if c.weights is not None:
                out.append((c.weights, self._on_consumer(i, "w")))
        out += [
            (
                n.tap,
                self._on_parts(k, n.parts_of)
                if n.parts_of
                else self._on_native(k, n.name, n.dims, self.row[n.layer]),
            )
            for k, n in enumerate(self.ad.native)
        ]
        return out

    def new_batch(self, chunk: Tensor | None = None) -> None:
        """Start a batch of windows ``chunk`` [batch, pos]."""
        self.pending, self.natives = {}, set()
        self.parts, self.split_error = {}, {}
        self.fired[:] = False
        # (batch, pos) of the analysed tokens, from the windows themselves: whichever source fires first
        # (a position embedding [1, pos, d] called before the token embedding) is checked against it
        self.shape = None if chunk is None else (int(chunk.shape[0]), int(chunk.shape[1]) - self.skip)
        self.folded = 0
        self.acc.start_batch()
        if self.probe is not None:
            self.probe.new_batch(chunk)

    def end_batch(self, b: int) -> None:
        """Check this batch: every source fired, every consumer folded, every input rebuilt, every
        statistic finite (NaN or inf fails, never passes).
        """
        err, finite, folded = self.acc.end_batch()
        if not self.fired.all():
            j = int(np.flatnonzero(~self.fired)[0])
            s = self.ad.sources[j]
            raise TraceError(
                f"source {s.label} ({s.tap}) did not fire in batch {b}: the model never wrote it"
            )
        missing = [i for i in range(len(self.ad.consumers)) if i not in folded]
        if missing:
            c = self.ad.consumers[missing[0]]
            raise TraceError(f"consumer {c.label} ({c.tap}) was not seen in batch {b}")
        tol = tolerance(self.dtype)
        if not np.all(err <= tol):
            worst = int(np.nanargmax(np.where(np.isnan(err), np.inf, err)))
            raise TraceError(
                f"{self.ad.family} model is not additive: its input at {self.ad.consumers[worst].label} is "
                "not the sum "
                f"of the captured sources (relative error {err[worst]:.3g} in batch {b}, tolerance "
                f"{tol:g}){self.ad.hint}"
            )
        for j, e in self.split_error.items():
            if not e <= tol:
                raise TraceError(
                    f"the parts of {self.ad.sources[j].label}'s write do not add up to it (relative error "
                    f"{e:.3g} in batch {b}, tolerance {tol:g}){self.ad.hint}"
                )
        if not finite:
            raise TraceError(
                f"{self.ad.family} model gives non-finite values (NaN or inf) in batch {b}: its weights or "
                "inputs overflow, so no statistic of it would mean anything"
            )

    def _cut(self, t: Tensor) -> Tensor:
        return t[:, self.skip :] if self.skip else t

    def _flat(self, t: Tensor) -> Tensor:
        return t.flatten(0, 1)

    def _on_source(self, j: int):
        def hook(t: Tensor) -> None:
            t = self._cut(t)
            self.dtype = self.dtype or t.dtype
            if t.dtype in LOW_PRECISION:  # sums of half-precision terms are formed in float32
                t = t.float()
            if self.shape is None:
                self.shape = (t.shape[0], t.shape[1])
            if t.shape[0] == 1 and self.shape[0] > 1:  # shared over the batch (GPT-2's position embedding)
                t = t.expand(self.shape[0], *t.shape[1:])
            started = self.fired.any() and self.acc.V is not None
            want = (*self.shape, self.acc.V.shape[-1] if started else t.shape[-1])
            if t.ndim != 3 or tuple(t.shape) != want or (started and t.device != self.acc.V.device):
                label = self.ad.sources[j].label
                raise TraceError(f"source {label} has shape {tuple(t.shape)}, the batch's sources {want}")
            self.acc.source(j, self._flat(t))
            self.fired[j] = True
            if j in self.splits:
                self._split(j, t)

        return hook

    def _on_consumer(self, i: int, key: str):
        spec = self.ad.consumers[i]

        def hook(t) -> None:
            got = self.pending.setdefault(i, {})
            if key == "h":
                self.acc.positions(i, t)
            if key == "w" and isinstance(t, (Terms, Split, Factored)):  # its own cut, without a copy
                got[key] = t.cut(self.skip)
            elif key == "w" and self.skip and isinstance(t, Tensor) and t.ndim == 4:  # whole per feature
                got[key] = Windows.of(t, self.skip)  # cut chunk by chunk in the fold, without a copy
            else:
                got[key] = self._cut(t)
            if key == "h" and self.probe is not None and self.probe.lens_on:
                self.probe.lens(i, got["h"])
            if "h" in got and ("w" in got or spec.weights is None):
                del self.pending[i]
                self._fold(i, spec, got)

        return hook

    def _fold(self, i: int, spec, got: dict[str, Any]) -> None:
        n = spec.n_sources
        if not self.fired[:n].all():
            j = int(np.flatnonzero(~self.fired[:n])[0])
            source = self.ad.sources[j].label
            raise TraceError(f"consumer {spec.label} reads source {source}, which has not fired before it")
        V = self.acc.V  # noqa: N806
        h = got["h"].to(V.device, V.dtype) if got["h"].dtype in LOW_PRECISION else got["h"].to(V.device)
        w = got.get("w")
        if spec.terms:  # kept [n, batch, pos, d]: the skipped positions cut without a copy
            terms = w.to(V.device, V.dtype)
            if self.probe is not None and spec.kind == READOUT:
                self._readout(spec, h, "terms", terms.full().flatten(1, 2))
            self.acc.consumer(i, self._flat(h), terms)
        elif isinstance(w, (Split, Factored, Windows)):  # per-feature weights never flattened whole
            w = w.to(V.device, V.dtype)
            w = w if isinstance(w, Windows) else w.flat()
            if self.probe is not None and spec.kind == READOUT:
                self._readout(spec, h, "feature", w.full())
            self.acc.consumer(i, self._flat(h), w)
        elif w is not None:  # weights unrolled in float64, or on another device, meet the sources
            w = self._flat(w.to(V.device, V.dtype))
            if w.ndim == 4:  # block weights: the read-out's attribution takes their terms
                if self.probe is not None and spec.kind == READOUT:
                    self._readout(spec, h, "terms", block_terms(w, V[: spec.n_sources]))
            else:
                self._readout(spec, h, "token" if w.ndim == 2 else "feature", w)
            self.acc.consumer(i, self._flat(h), w)
        elif i in self.static:
            self.static[i] = w = self.static[i].to(V.device)  # made on the host: moved once
            self._readout(spec, h, "static", w)
            self.acc.consumer(i, self._flat(h), w)
        else:
            self._readout(spec, h, "unit", None)
            self.acc.consumer(i, self._flat(h))
        self.folded += 1

    def _readout(self, spec, h: Tensor, kind: str, w: Tensor | None) -> None:
        if self.probe is not None and spec.kind == READOUT:
            self.probe.readout(h, kind, w, self.acc.V[: spec.n_sources])

    def _on_native(self, k: int, name: str, dims: tuple[str, ...], i: int):
        def hook(t: Tensor) -> None:
            self.acc.native_mean(name, dims, i, self._cut(t))
            self.natives.add(k)

        return hook

    def _on_parts(self, k: int, label: str):
        j = [s.label for s in self.ad.sources].index(label)

        def hook(t: Tensor) -> None:
            if self.fired[j]:
                raise TraceError(f"the parts of {label}'s write arrived after the write itself")
            self.parts[j] = self._cut(t)
            self.natives.add(k)

        return hook

    def _split(self, j: int, write: Tensor) -> None:
        """Check that the parts of source j's write add up to it (NaN parts: blocks not read) and keep,
        per part, the token sum of <part, write> beside that of |write|^2 (the dots in the write's
        dtype, float32 at least, their sums over tokens in float64). Parts before a linear map W
        (``project``) are checked as W (sum of parts) and dotted with W^T write: one product each,
        not one per part.
        """
        name, dims, i, weight = self.splits[j]
        parts = self.parts.pop(j, None)
        if parts is None:
            raise TraceError(f"the parts of {self.ad.sources[j].label}'s write did not arrive before it")
        parts = parts.to(write.dtype)  # the products in the write's dtype, the sums in float64
        # a block the layer does not read is NaN throughout, and so is its dot; a NaN inside a part
        # that is read leaves either the write NaN or the parts short of it: the check fails on both
        read = (~parts[:1, :1, :, 0].flatten(0, 1).isnan().all(0)).nonzero().flatten().tolist()  # first token
        total = parts[:, :, read[0]].clone() if read else parts.new_zeros(*parts.shape[:2], parts.shape[-1])
        for k in read[1:]:  # in place, one pass each
            total += parts[:, :, k]
        against = write
        if weight is not None:
            w = weight.detach().to(write.dtype)
            total, against = total @ w.T, write @ w
        # the difference in the write's dtype: exact where the two agree to within a factor of 2
        # (Sterbenz), the only case where its rounding could matter; its norm summed in float64
        miss = torch.linalg.vector_norm(total.sub_(write), dtype=torch.float64)
        size = torch.linalg.vector_norm(write, dtype=torch.float64)
        self.split_error[j] = 0.0 if miss == 0 else float(miss / size)
        dots = against.new_full(parts.shape[:3], math.nan)
        for k in read:
            dots[:, :, k] = torch.linalg.vecdot(parts[:, :, k], against)
        self.acc.native_mean(name, dims, i, dots.double())
        self.acc.native_mean(f"{name}_total", (), i, torch.linalg.vecdot(write, write).double())

    def complete(self) -> bool:
        """Whether this batch has seen every source, consumer and native quantity."""
        return (
            self.folded == len(self.ad.consumers)
            and bool(self.fired.all())
            and len(self.natives) == len(self.ad.native)
        )


def check_additive(trace: xr.Dataset, tol: float = TOLERANCE, hint: str = "") -> None:
    """Refuse a trace whose inputs were not rebuilt from their sources within ``tol``."""
    err = trace["residual_error"]
    worst = int(err.fillna(np.inf).argmax("layer"))
    if not float(err.max()) <= tol or bool(err.isnull().any()):
        raise TraceError(
            f"inputs are not the sum of the captured sources: rebuilding {trace.layer.values[worst]} "
            f"leaves a relative error of {float(err[worst]):.3g} (tolerance {tol:g}){hint}"
        )
