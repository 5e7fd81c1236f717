"""Capture: a model + tokens -> a trace (xarray.Dataset), streaming over batches.

Hooks are attached through TransformerLens's ``hooks()`` context manager, whose ``finally`` removes
every handle. Per batch the probe keeps one buffer of source outputs [batch, pos, source, d_model]
and folds each consumer into float64 sums as soon as its input and weights have been seen, so
memory does not grow with the number of tokens analysed.
"""

from __future__ import annotations

from typing import Any

import torch
import xarray as xr
from torch import Tensor

from depthscope.corpus import Corpus, eval_windows, load_corpus
from depthscope.errors import CorpusError, DepthscopeError, TraceError
from depthscope.probes.trace import Accumulator, Layout
from depthscope.progress import bar
from depthscope.schemes import DepthModel, consumers, sources
from depthscope.schemes.base import variant_label

TOLERANCE = 1e-4  # residual_error above this (float32) means the decomposition is not exact
FLUSH = 4  # scalar-weight consumers folded together: cache reuse of the sources vs inputs held


def layout(cfg) -> Layout:
    """Trace axes of a depthscope model."""
    cons, srcs = consumers(cfg), sources(cfg)
    return Layout(
        layer=[c.label for c in cons],
        layer_depth=[c.site.depth for c in cons],
        layer_kind=[c.site.kind for c in cons],
        layer_sources=[c.site.n_sources for c in cons],
        source=[s.label for s in srcs],
        source_depth=[s.depth for s in srcs],
        source_kind=[s.kind for s in srcs],
    )


def token_windows(data: Any, ctx: int, n_tokens: int, seed: int) -> tuple[Tensor, str]:
    """Windows [n, pos] to analyse, and a description of where they came from.

    ``data`` is a LongTensor of token ids ([n, pos] or flat), a Corpus, a path, or None (the
    default corpus). Corpus windows come from its validation split at seeded offsets.
    """
    if isinstance(data, Tensor):
        if data.dtype not in (torch.int64, torch.int32, torch.uint8):
            raise DepthscopeError(f"token tensor must hold integers, got {data.dtype}")
        tokens = data.long()
        if tokens.ndim == 1:
            if len(tokens) < ctx:
                raise CorpusError(f"{len(tokens)} tokens are fewer than one context window ({ctx})")
            tokens = tokens[: len(tokens) // ctx * ctx].view(-1, ctx)
        if tokens.ndim != 2 or tokens.shape[1] > ctx:
            raise DepthscopeError(f"tokens must be [batch, pos] with pos <= {ctx}, got {tuple(tokens.shape)}")
        return tokens, f"{tokens.numel()} given tokens"
    if n_tokens < ctx:
        raise CorpusError(f"asked for {n_tokens} tokens, fewer than one context window ({ctx})")
    corpus = data if isinstance(data, Corpus) else load_corpus(data)
    corpus.require(ctx, "one context window")
    return eval_windows(corpus.val, n_tokens, ctx, seed), corpus.name


def capture(
    model: Any,
    data: Any = None,
    *,
    n_tokens: int = 16384,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = False,
    checkpoint: str = "",
    rank: bool = False,
) -> xr.Dataset:
    """Capture a trace of ``model`` on ``data`` (tokens, a corpus or a path; None = default corpus).

    ``rank=True`` also streams each source's covariance over tokens (d x d per source, whatever the
    number of tokens) and stores its spectrum as ``source_spectrum`` (source, component), from
    which ``depthscope.analysis.rank`` computes effective and collective ranks.

    Works for every built-in scheme and for TransformerLens ``TransformerBridge`` models (standard
    additive residual streams, checked before trusting hook names). Raises DepthscopeError for a
    too-short corpus and TraceError for a model whose inputs cannot be rebuilt from its sources.
    """
    from depthscope.probes.bridge import capture_bridge, is_bridge

    if is_bridge(model):
        return capture_bridge(
            model, data, n_tokens=n_tokens, batch_size=batch_size, seed=seed, progress=progress, checkpoint=checkpoint, rank=rank
        )
    if not isinstance(model, DepthModel):
        raise DepthscopeError(f"cannot capture a {type(model).__name__}: expected a depthscope model or a TransformerBridge")
    cfg = model.cfg
    windows, corpus_name = token_windows(data, cfg.ctx, n_tokens, seed)
    acc = Accumulator(layout(cfg), covariance=rank)
    hooks = _ModelHooks(model, acc)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), model.hooks(fwd_hooks=hooks.fwd_hooks), bar("capture", len(windows), enabled=progress) as pb:
            for chunk in windows.split(batch_size):
                hooks.new_batch()
                model(chunk)
                hooks.end_batch()
                acc.add_tokens(chunk.numel())
                pb.advance(len(chunk))
    finally:
        model.train(was_training)
    from depthscope import __version__

    ds = acc.dataset(
        {
            "scheme": cfg.scheme,
            "label": variant_label(cfg),
            "config": cfg.to_json(),
            "checkpoint": str(checkpoint),
            "corpus": corpus_name,
            "seed": seed,
            "depthscope_version": __version__,
        }
    )
    for name, (dims, array, coords) in model.scheme.static_native(model).items():
        ds[name] = xr.DataArray(array, dims=dims, coords=coords)
        ds[name].attrs.update(long_name=f"{name} (native, static)", units="1")
    check_additive(ds, TOLERANCE)
    return ds


class _ModelHooks:
    """Forward hooks that feed one Accumulator from a DepthModel, batch by batch."""

    def __init__(self, model: DepthModel, acc: Accumulator):
        cfg = model.cfg
        self.acc = acc
        self.srcs = sources(cfg)
        self.cons = consumers(cfg)
        self.values: Tensor | None = None
        self.norms: Tensor | None = None
        self.pending: dict[int, dict[str, Tensor]] = {}
        self.deferred: list[tuple[int, Tensor, Tensor]] = []
        self.fresh = True
        self.fwd_hooks = []
        for j, s in enumerate(self.srcs):
            self.fwd_hooks.append((s.hook, self._on_source(j)))
        for i, c in enumerate(self.cons):
            self.fwd_hooks.append((c.hook_in, self._on_consumer(i, "h")))
            self.fwd_hooks.append((c.hook_weights, self._on_consumer(i, "w")))
        row = {label: i for i, label in enumerate(acc.layout.layer)}
        for nh in model.scheme.native_hooks(cfg):
            self.fwd_hooks.append((nh.hook, self._on_native(nh.name, nh.dims, row[nh.layer])))

    def new_batch(self) -> None:
        self.pending, self.fresh, self.deferred = {}, True, []

    def end_batch(self) -> None:
        """Fold the waiting consumers with per-token scalar weights (their sources are all known)."""
        self.acc.consumers(self.deferred, self.values, self.norms)
        self.deferred = []

    def _on_source(self, j: int):
        def hook(t: Tensor, hook) -> None:
            if self.fresh:  # first source of a batch: (re)use one buffer of all source outputs
                self.fresh = False
                shape = (*t.shape[:-1], len(self.srcs), t.shape[-1])
                if self.values is None or self.values.shape != shape or self.values.dtype != t.dtype:
                    self.values = t.new_empty(shape)
                    self.norms = t.new_empty(shape[:-1])
            self.values[:, :, j] = t
            self.norms[:, :, j] = self.acc.source(j, t)

        return hook

    def _on_consumer(self, i: int, key: str):
        def hook(t: Tensor, hook) -> None:
            got = self.pending.setdefault(i, {})
            got[key] = t
            if len(got) == 2:  # input and weights both seen
                del self.pending[i]
                if got["w"].ndim == 3:  # scalar weights: fold a few together, cache-friendly
                    self.deferred.append((i, got["h"], got["w"]))
                    if len(self.deferred) >= FLUSH:
                        self.end_batch()
                else:  # per-feature weights are large: fold now and let them go
                    self.acc.consumer(i, got["h"], got["w"], self.values, self.norms)

        return hook

    def _on_native(self, name: str, dims: tuple[str, ...], i: int):
        def hook(t: Tensor, hook) -> None:
            self.acc.native_mean(name, dims, i, t)

        return hook


def check_additive(trace: xr.Dataset, tol: float) -> None:
    """Refuse a trace whose inputs were not rebuilt from their sources within ``tol``."""
    err = trace["residual_error"]
    worst = err.argmax("layer").item()
    if not float(err.max()) <= tol:
        raise TraceError(
            f"inputs are not the sum of the captured sources: rebuilding {trace.layer.values[worst]} "
            f"leaves a relative error of {float(err[worst]):.3g} (tolerance {tol:g})"
        )
