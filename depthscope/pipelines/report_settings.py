"""The report's settings, and the choices every part of the report shares (which model a
trajectory shows, ranks where a trace holds spectra): imported by ``pipelines.report`` (which builds
the report) and ``pipelines.report_data`` (what the page shows) alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import xarray as xr

from depthscope.analysis.rank import add_ranks
from depthscope.corpus import short_name
from depthscope.probes.settings import CaptureSettings
from depthscope.trace import STACK, select_model, split_models

REPORT_CAPTURE = CaptureSettings(n_tokens=8192, ablate_tokens=512)  # the report's capture defaults


@dataclass(frozen=True)
class ReportSettings:
    """How traces are captured (``capture``) and summarised.

    Every checkpoint is captured with ``capture`` and ``rank=True``; ``logits`` and ``ablate``
    choose the causal views per model. "auto" turns them on for depthscope's own models (vocabulary
    256, 17 sources: cheap; cell ablations of ``capture.ablate_tokens`` tokens, 153 forwards per
    window on the zoo) and off for others (a logit lens over 61 inputs of a 49k vocabulary is ~13
    forwards of SmolLM2).
    """

    capture: CaptureSettings = field(default_factory=lambda: REPORT_CAPTURE)
    k: int = 2  # recent sources counted by the pattern score
    corpus: str | None = None  # None = the Python standard library
    energy: float = 0.99  # energy fraction of the numerical rank
    trajectory: bool = False  # treat every checkpoint given as one run
    logits: Literal["auto", "on", "off"] = "auto"
    ablate: Literal["auto", "off", "sources", "cells"] = "auto"
    trust_remote_code: bool = False  # load Hugging Face models' own modeling code (auto_map)
    spec_file: Path | None = None  # read every model as this spec file says (``probes.specfile``)
    tokenizer: str | None = None  # --tokenizer: how text becomes every model's ids (default: each model's)

    def for_model(self, own: bool) -> CaptureSettings:
        """The capture settings of one model (``own``: one of depthscope's own)."""
        logits = self.logits == "on" or (self.logits == "auto" and own)
        ablate = {"auto": "cells" if own else None, "off": None}.get(self.ablate, self.ablate)
        return self.capture.replace(
            rank=True, logits=logits or ablate is not None, lens=logits, ablate=ablate
        )

    def table(self, traces: list[xr.Dataset], trajectories: list[xr.Dataset] = ()) -> dict[str, Any]:
        """The report page's "Settings": what the shown traces were captured with (from their
        attrs; ``used``), then the report's own choices (k, energy) and the trajectories shown.
        """
        from depthscope.figures.report import trajectory_runs

        runs = trajectory_runs(list(trajectories))
        shown = [(str(t.attrs.get("label", "")), t) for t in traces]
        shown += [(run.heading, m) for tr, run in zip(trajectories, runs) for m in split_models(tr)]
        listed = f"{len(runs)}: " + "; ".join(r.heading for r in runs) if runs else "none"
        given = " (--trajectory: the checkpoints given are one run)" if self.trajectory else ""
        return {**used(shown), "k": self.k, "energy": self.energy, "trajectories": listed + given}


# (row of the Settings table, how one trace says it): what a trace was captured with
TRACE_SETTINGS: tuple[tuple[str, Callable[[xr.Dataset], Any]], ...] = (
    ("tokens", lambda t: t.attrs.get("tokens")),
    ("ctx", lambda t: t.attrs.get("ctx")),
    ("skip_positions", lambda t: t.attrs.get("skip_positions")),
    ("seed", lambda t: t.attrs.get("seed")),
    ("corpus", lambda t: short_name(str(t.attrs["corpus"])) if t.attrs.get("corpus") else None),
    ("dtype", lambda t: t.attrs.get("dtype")),
    ("logits", lambda t: "on" if "logit_attribution" in t else "off"),
    ("lens", lambda t: "on" if "lens_loss" in t else "off"),
    ("ablate", lambda t: t.attrs.get("ablation") or "off"),
    ("ablate_tokens", lambda t: t.attrs.get("ablation_tokens", "-")),
)


def _plain(value: Any) -> Any:
    """An attr as the table shows it: numpy scalars as Python ones, a missing or empty value as "-"."""
    if value is None or (isinstance(value, str) and not value):
        return "-"
    return value.item() if hasattr(value, "item") else value


def used(shown: list[tuple[str, xr.Dataset]]) -> dict[str, Any]:
    """Each of ``TRACE_SETTINGS`` over the (name, trace) pairs shown: one value where all agree,
    else ``value: names; value: names`` (a run's steps named once, by the run).
    """
    table = {}
    for row, read in TRACE_SETTINGS:
        by_value: dict[Any, list[str]] = {}
        for name, t in shown:
            names = by_value.setdefault(_plain(read(t)), [])
            if name not in names:
                names.append(name)
        if len(by_value) == 1:
            table[row] = next(iter(by_value))
        else:
            table[row] = "; ".join(f"{v}: {', '.join(names)}" for v, names in by_value.items())
    return table


def last_step(trajectory: xr.Dataset) -> xr.Dataset:
    """The model at a trajectory's largest step (a trace of its own, as ``split_models`` gives)."""
    steps = [int(v) for v in trajectory["step"].values]
    return select_model(trajectory, str(trajectory[STACK].values[steps.index(max(steps))]))


def _ranked(trace: xr.Dataset, energy: float) -> xr.Dataset:
    """A trace with its effective ranks, where it holds the spectra to compute them."""
    return add_ranks(trace, energy) if "source_spectrum" in trace else trace
