"""What a capture is asked to do, in one frozen object: ``CaptureSettings`` (and its ``Partial``).

The CLI builds one from its options, the pipelines hold one (``CaptureJob``, ``ReportSettings``),
the engine's ``Run`` takes one, and the resume fingerprint of a partial state is derived from it;
``capture(model, data, **options)`` builds one from keyword arguments. Every value is checked once,
here, with the one-line errors a user sees.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from depthscope.errors import DepthscopeError
from depthscope.probes.load import Placement

Ablate = Literal["sources", "cells"]
ABLATE: tuple[str, ...] = get_args(Ablate)
BIG = 2**62  # the most any count may be: torch and numpy count in int64


@dataclass(frozen=True)
class Partial:
    """Where a capture keeps its partial state (``probes.partial``) and how.

    ``save_every`` batches (per rank) write it atomically (0: never); ``resume`` continues from it
    when it exists (refused if it was made with another model, corpus, seed or settings).
    """

    path: Path | None = None
    save_every: int = 0
    resume: bool = False

    def __post_init__(self) -> None:
        if self.path is not None:
            object.__setattr__(self, "path", Path(self.path))
        _count("save_every", self.save_every, low=0)

    @property
    def active(self) -> bool:
        """Whether the capture saves or resumes a partial state (DepthscopeError if it has no path)."""
        if (self.save_every or self.resume) and self.path is None:
            raise DepthscopeError("saving or resuming a partial capture needs its path (partial=)")
        return bool(self.save_every or self.resume)


@dataclass(frozen=True)
class CaptureSettings:
    """Everything a capture computes and how (the model and the data aside).

    Args:
        n_tokens: tokens analysed (windows of ``ctx``, at seeded offsets of the corpus).
        batch_size: windows per forward pass.
        seed: seed of the window offsets.
        ctx: window length (at most the model's context; default the model's context, at most
            ``capture.DEFAULT_WINDOW`` = 1024 tokens).
        skip_positions: leave the first K positions of every window out of every statistic
            (attention sinks); they still run through the model. Default: the family's (1 for
            pretrained causal LMs, whose first position holds an attention sink; 0 otherwise).
        rank: also stream each source's covariance over tokens (d x d per source) and store its
            spectrum as ``source_spectrum`` (source, component) for ``depthscope.analysis.rank``.
        logits: also direct logit attribution per source, checked to add up to the logits
            (``probes.causal``); needs the model's LM head.
        lens: also the logit lens over consumers: every consumer's input decoded by the final norm
            and unembedding, one LM-head product per consumer (61 for SmolLM2: about 12 forwards'
            worth), so it is asked for on its own.
        ablate: ``"sources"`` (remove each source from every later consumer's input) or
            ``"cells"`` (from one consumer at a time): the increase in loss, one forward per
            source or cell; ``ablate_mean`` replaces the term by its token mean instead;
            ``ablate_tokens`` limits the ablations to the first batches holding that many tokens
            (default: every batch), the rest of the trace still covering ``n_tokens``.
        placement: device, dtype or device map a pipeline loads the model with (a live model
            given to ``capture`` runs where it is).
        partial: where and how often to keep the partial state, and whether to resume from it.
    """

    n_tokens: int = 16384
    batch_size: int = 16
    seed: int = 0
    ctx: int | None = None
    skip_positions: int | None = None
    rank: bool = False
    logits: bool = False
    lens: bool = False
    ablate: Ablate | None = None
    ablate_mean: bool = False
    ablate_tokens: int | None = None
    placement: Placement = field(default_factory=Placement)
    partial: Partial = field(default_factory=Partial)

    def __post_init__(self) -> None:
        _count("n_tokens", self.n_tokens, low=1)
        _count("batch size", self.batch_size, low=1)
        _count("seed", self.seed, low=0, high=2**63 - 1)
        if self.ctx is not None:
            _count("window length (--ctx)", self.ctx, low=1)
        if self.skip_positions is not None:
            _count("skip_positions", self.skip_positions, low=0)
        if self.ablate is not None and self.ablate not in ABLATE:
            raise DepthscopeError(f"ablate must be one of {', '.join(ABLATE)}, got {self.ablate!r}")
        if self.ablate_tokens is not None:
            _count("ablate_tokens", self.ablate_tokens, low=1)
        for name in ("rank", "logits", "lens", "ablate_mean"):
            if not isinstance(getattr(self, name), bool):
                raise DepthscopeError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def causal(self) -> bool:
        """Whether the capture needs the model's LM head (logit attribution, lens or ablation)."""
        return self.logits or self.lens or self.ablate is not None

    def replace(self, **changes: Any) -> CaptureSettings:
        """A copy with ``changes`` (checked like the original)."""
        return dataclasses.replace(self, **changes)

    def fingerprint(self, **resolved: Any) -> dict[str, Any]:
        """What a partial state must have been made with to be resumed: every setting that changes
        the sums (not where they are kept, nor where the model runs), with the values the capture
        resolved (``skip_positions``, the window length, the rank and world size) in ``resolved``.
        The corpus, seed, window length and token count are also covered by the windows' digest.
        """
        out = dataclasses.asdict(self)
        for key in ("placement", "partial"):
            out.pop(key)
        return {**out, **resolved}


def check_window(window: int, context: int) -> None:
    """Refuse a window (``--ctx``) longer than the model's context."""
    if not 1 <= window <= context:
        raise DepthscopeError(
            f"window length (--ctx) must be between 1 and the model's context {context}, got {window}"
        )


def _count(name: str, value: Any, *, low: int, high: int = BIG) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DepthscopeError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        bound = f">= {low}" if high == BIG else f"between {low} and {high}"
        raise DepthscopeError(f"{name} must be {bound}, got {value}")
