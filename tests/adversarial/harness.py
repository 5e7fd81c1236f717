"""The adversarial harness: a model written the way research code is written, read by depthscope, and
judged against an oracle that knows nothing of depthscope.

A case's model records, during its own forward and from its own parameters, what it really mixes
(``Recorder``): each source's value as it was written (``self.source(label, t)``) and, for each
consumer, its input together with the weights the model used over the sources named so far
(``self.consumer(label, h, names, weights)``: weights [n], [batch, pos, n] or [batch, pos, n, d]).
The oracle rebuilds every input from those terms in float64 (and checks that the model's own
weights rebuild it: a broken oracle fails loudly, never judges), then computes each source's
contribution share the way the trace defines it (<c_s, R> / |R|^2 summed over tokens, R = sum_s c_s)
and each weight's token mean.

``judge(case)`` captures the model once (one batch holding every window, so a model that mixes
tokens across the batch sees the same batch as the oracle) and returns one of

* EXACT: the trace's consumers and sources are the oracle's and every share and weight agrees
  within the tolerance of the model's precision (``TOLERANCES``);
* REFUSED: depthscope raised its own error with a one-line message;
* WRONG: a trace that disagrees with the oracle (the worst outcome);
* CRASH: any other exception (a traceback a user would see).

A case says what it expects: ``exact``, or ``refused`` with a pattern the one line must match.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from depthscope import DepthscopeError, ModelSpec
from depthscope.probes import capture

# (share, weight) tolerances by the model's compute dtype. float32: the weights are found from values
# rounded to 1e-7 relative through well-conditioned systems (depthscope refuses ill-conditioned ones),
# so 1e-5 holds with margin; half precision rounds every write to 2^-8 (bfloat16) or 2^-11 (float16).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-8, 1e-8),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 5e-3),
    torch.bfloat16: (3e-3, 1e-2),
}

Verdict = Literal["exact", "refused", "wrong", "crash"]


class Recorder(nn.Module):
    """A mixin for case models: what the model really wrote and read, recorded during its forward
    while ``recording`` is on (the oracle's forward; off while depthscope captures).
    """

    recording = False

    def start_record(self) -> None:
        self.recording = True
        self.sources_seen: dict[str, Tensor] = {}
        self.consumers_seen: dict[str, tuple[Tensor, list[str], Tensor]] = {}

    def source(self, label: str, t: Tensor) -> Tensor:
        """Record source ``label``'s value (``t`` [batch, pos, d] or [pos, d]) as written now."""
        if self.recording:
            assert label not in self.sources_seen, f"source {label} written twice"
            self.sources_seen[label] = t.detach().to(torch.float64, copy=True)
        return t

    def consumer(self, label: str, h: Tensor, names: list[str], weights: Tensor | float | list) -> Tensor:
        """Record consumer ``label``: its input ``h`` and the weights the model mixed ``names`` with."""
        if self.recording:
            assert label not in self.consumers_seen, f"consumer {label} read twice"
            w = torch.as_tensor(weights, dtype=torch.float64)
            if w.ndim == 0:
                w = w.expand(len(names))
            self.consumers_seen[label] = (h.detach().to(torch.float64, copy=True), list(names), w.detach())
        return h


@dataclass
class Case:
    """One model and what depthscope should make of it (see the module docstring)."""

    name: str
    group: str  # the kind of research shape (for the counts by class)
    build: Callable[[], nn.Module]  # a fresh model in eval mode, seeded
    spec: ModelSpec | Callable[[nn.Module], ModelSpec] | None  # None: depthscope discovers it
    expect: Literal["exact", "refused"] = "exact"
    match: str = ""  # a regex the refusal's line must contain (expect="refused")
    vocab: int = 64
    shape: tuple[int, int] = (4, 16)  # [windows, pos] captured, in one batch
    forward: Callable[[nn.Module, Tensor], Any] | None = None  # how to call it (default model(ids))
    options: dict[str, Any] = field(default_factory=dict)  # more capture options


@dataclass
class Outcome:
    verdict: Verdict
    detail: str = ""
    trace: Any = None


def tokens_of(case: Case, seed: int = 1) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, case.vocab, case.shape, generator=g)


def model_dtype(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def oracle(model: Recorder, tokens: Tensor, forward=None) -> dict[str, dict[str, tuple[float, float]]]:
    """Per consumer, per source: (token-mean weight, contribution share), from the model's own record."""
    model.start_record()
    try:
        with torch.no_grad():
            (forward or (lambda m, t: m(t)))(model, tokens)
    finally:
        model.recording = False
    out = {}
    for label, (h, names, w) in model.consumers_seen.items():
        values = [torch.broadcast_to(model.sources_seen[n], h.shape) for n in names]
        if w.ndim == 1:
            w = w.expand(*h.shape[:2], len(names))
        terms = [(w[..., k, None] if w.ndim == 3 else w[..., k, :]) * v for k, v in enumerate(values)]
        rebuilt = sum(terms)
        err = float((rebuilt - h).norm() / h.norm().clamp_min(1e-300))
        tol = TOLERANCES[model_dtype(model)][0] * 10
        assert err <= tol, f"the oracle's own weights do not rebuild {label} ({err:.2g}): a broken case"
        energy = float((rebuilt * rebuilt).sum())
        mean = w.mean(dim=tuple(i for i in range(w.ndim) if i != 2)) if w.ndim > 1 else w
        out[label] = {
            n: (float(mean[k]), float((t * rebuilt).sum()) / energy)
            for k, (n, t) in enumerate(zip(names, terms))
        }
    return out


def judge(case: Case) -> Outcome:
    """Capture ``case``'s model and judge the trace against the oracle (see the module docstring)."""
    try:
        model = case.build()
        spec = case.spec(model) if callable(case.spec) else case.spec
        tokens = tokens_of(case)
        trace = capture(
            model,
            tokens,
            spec=spec,
            forward=(lambda t, m=model: case.forward(m, t)) if case.forward else None,
            batch_size=case.shape[0],
            skip_positions=0,
            progress=False,
            **case.options,
        )
    except DepthscopeError as err:
        return Outcome("refused", str(err))
    except Exception:  # noqa: BLE001 - what a user would see as a traceback
        return Outcome("crash", traceback.format_exc())
    want = oracle(model, tokens, case.forward)
    share_tol, weight_tol = TOLERANCES[model_dtype(model)]
    layers = [str(x) for x in trace.layer.values]
    if sorted(layers) != sorted(want):
        return Outcome("wrong", f"consumers {layers}, the oracle's {sorted(want)}", trace)
    for layer, row in want.items():
        got = trace.sel(layer=layer)
        available = [str(s) for s, m in zip(trace.source.values, got["mixing"].values) if not np.isnan(m)]
        if sorted(available) != sorted(row):
            return Outcome("wrong", f"{layer} reads {available}, the oracle's {sorted(row)}", trace)
        for source, (weight, share) in row.items():
            m = float(got["mixing"].sel(source=source))
            s = float(got["contribution_share"].sel(source=source))
            if not abs(s - share) <= share_tol:
                return Outcome(
                    "wrong", f"share of {source} in {layer}: {s:.6g}, the oracle's {share:.6g}", trace
                )
            if not abs(m - weight) <= weight_tol * max(1.0, abs(weight)):
                return Outcome(
                    "wrong", f"weight of {source} in {layer}: {m:.6g}, the oracle's {weight:.6g}", trace
                )
    return Outcome("exact", "", trace)


def check(case: Case, outcome: Outcome) -> None:
    """Assert that ``outcome`` is what ``case`` expects (never WRONG or CRASH; a refusal in one line)."""
    assert outcome.verdict not in ("wrong", "crash"), (
        f"{case.name}: {outcome.verdict.upper()}: {outcome.detail}"
    )
    if outcome.verdict == "refused":
        assert "\n" not in outcome.detail, f"{case.name}: a refusal of several lines: {outcome.detail}"
    assert outcome.verdict == case.expect, (
        f"{case.name}: expected {case.expect}, got {outcome.verdict}: {outcome.detail}"
    )
    if case.expect == "refused" and case.match:
        import re

        assert re.search(case.match, outcome.detail), f"{case.name}: refused as {outcome.detail!r}"
