"""The survey's questions with error bars: estimators over the runs of a several-seed collection.

Inputs are the manifest entries of ``depthscope zoo build --collection seeds`` (one per run:
``{variant}.seed{k}``, with ``val_curve`` [[step, loss], ...], ``val_loss``, ``params``,
``step_seconds`` and ``config``) and each run's final trace. Everything here is a pure function of
those; ``depthscope.pipelines.claims`` reads them from disk.

* **Steps to equal loss** (DCA, arXiv 2502.06785: "the same perplexity up to 3x faster"): the
  first step at which a run's validation loss reaches the final validation loss of the standard
  residual of the same seed, linearly interpolated between the two measured points that bracket
  it (the curve is measured every ``eval_every`` steps); the ratio is the standard run's steps over
  that step (2 = the standard's final loss in half the steps). A run that never reaches it has no
  ratio (NaN: it needs more steps than the run has, the ratio is below 1).
* **Gains** are seed-paired: ``loss(standard, seed k) - loss(variant, seed k)`` (> 0: the variant
  is better), so the seed's shared data order cancels.
* **Costs** against the standard model of the same size: extra parameters, forward FLOPs per
  token and seconds per training step (measured by ``depthscope.pipelines.claims``), as fractions
  above the standard's, and the gain per +1% of each.
* **Verdicts** for n seeds with mean m and standard error se = sd / sqrt(n): ``inconclusive`` where
  |m| <= 2 se (the seeds do not decide; the verdict adds how many seeds would, at the spread seen:
  the n with 2 sd / sqrt(n) < |m|); else a claimed direction ``holds`` where m has the claimed sign
  and every seed agrees, ``holds weakly`` where m has it by the test but some seed disagrees, and
  ``contradicted`` (``contradicted weakly``) where the opposite sign holds. A claimed factor (3x) is
  judged by the factor: ``holds`` where the ratio's mean reaches it by the same test and every seed
  reached the target at all, ``short of the claim`` where the mean is below the factor by the test
  (a seed that never reaches the target counts as short), ``inconclusive`` between. One seed is
  never a verdict (``one seed``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

BASELINE = "standard"
MIN_EXTRA = 0.005  # the smallest extra cost (a fraction) a gain is divided by
SEED_SEP = ".seed"


def variant(entry: Mapping[str, Any]) -> str:
    """The variant a run belongs to (its name without ``.seed{k}``)."""
    return str(entry["name"]).rsplit(SEED_SEP, 1)[0]


def by_variant(entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, Mapping[str, Any]]]:
    """Runs grouped by variant, then by seed, in manifest order."""
    out: dict[str, dict[int, Mapping[str, Any]]] = {}
    for e in entries:
        out.setdefault(variant(e), {})[int(e["seed"])] = e
    return out


def steps_to_loss(curve: Sequence[Sequence[float]], target: float) -> float:
    """The first step at which ``curve`` ([[step, loss], ...], ascending steps) reaches ``target``,
    linearly interpolated between the bracketing measurements; the first measured step if the
    first point already reaches it (an upper bound: nothing before it was measured); NaN if never.
    """
    if not math.isfinite(target):
        return float("nan")
    prev = None
    for step, loss in curve:
        if not math.isfinite(loss):
            return float("nan")
        if loss <= target:
            if prev is None:
                return float(step)
            (s0, l0) = prev
            return float(s0 + (step - s0) * (l0 - target) / (l0 - loss))
        prev = (step, loss)
    return float("nan")


def speedups(
    runs: Mapping[str, Mapping[int, Mapping[str, Any]]], baseline: str = BASELINE
) -> dict[str, list[float]]:
    """Per variant, per seed shared with the baseline: the baseline's steps over the steps the
    variant needs to reach the baseline's final validation loss (NaN where it never does).
    """
    base = runs[baseline]
    out = {}
    for name, seeds in runs.items():
        vals = []
        for seed, e in seeds.items():
            if seed not in base or "val_curve" not in e:
                continue
            steps = steps_to_loss(e["val_curve"], float(base[seed]["val_loss"]))
            vals.append(float(base[seed]["steps"]) / steps if steps > 0 else float("nan"))
        out[name] = vals
    return out


def paired(
    runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
    value: Callable[[Mapping[str, Any]], float],
    a: str,
    b: str,
) -> list[float]:
    """``value(a's run) - value(b's run)`` for every seed both have."""
    return [value(runs[a][s]) - value(runs[b][s]) for s in runs[a] if s in runs.get(b, {})]


def gains(
    runs: Mapping[str, Mapping[int, Mapping[str, Any]]], baseline: str = BASELINE
) -> dict[str, list[float]]:
    """Seed-paired validation-loss gains over the baseline (> 0: lower loss than the baseline)."""
    loss = lambda e: float(e["val_loss"])  # noqa: E731
    return {name: paired(runs, loss, baseline, name) for name in runs}


def stats(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample sd and n of the finite values (and how many were not finite)."""
    x = np.asarray(values, dtype=np.float64)
    ok = x[np.isfinite(x)]
    n = len(ok)
    return {
        "mean": float(ok.mean()) if n else float("nan"),
        "sd": float(ok.std(ddof=1)) if n > 1 else float("nan"),
        "n": n,
        "missing": int(len(x) - n),
    }


def fmt(s: Mapping[str, float], digits: int = 3) -> str:
    """``mean ± sd (n)``, or ``mean (1 seed)``."""
    if s["n"] == 0:
        return "-"
    miss = f", {s['missing']} never" if s.get("missing") else ""
    if s["n"] == 1:
        return f"{s['mean']:.{digits}f} (1 seed{miss})"
    return f"{s['mean']:.{digits}f} ± {s['sd']:.{digits}f} (n={s['n']}{miss})"


def verdict(values: Sequence[float], *, null: float = 0.0, claimed: float | None = None) -> str:
    """The verdict on a claim that ``values`` (one per seed) exceed ``null``, or, for a factor,
    reach ``claimed`` (NaN: a seed that never reached the target): see the module docstring.
    """
    x = np.asarray(values, dtype=np.float64)
    never = int((~np.isfinite(x)).sum())
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return "not measured"
    if len(x) == 1:
        return "one seed"
    if claimed is not None:
        m, se = x.mean(), x.std(ddof=1) / math.sqrt(len(x))
        if m + 2 * se < claimed:
            return "short of the claim"
        if m - 2 * se >= claimed and not never:
            return "holds"
        return _inconclusive(x - claimed)
    d = x - null
    m, se = d.mean(), d.std(ddof=1) / math.sqrt(len(d))
    if not abs(m) > 2 * se:
        return _inconclusive(d)
    agree = bool(np.all(d > 0) or np.all(d < 0))
    if m > 0:
        return "holds" if agree else "holds weakly"
    return "contradicted" if agree else "contradicted weakly"


def _inconclusive(d: np.ndarray) -> str:
    """``inconclusive``, with the number of seeds that would decide at the spread seen: the least n
    with 2 sd / sqrt(n) < |mean| (none where the mean is 0).
    """
    m, sd = abs(float(d.mean())), float(d.std(ddof=1))
    if m == 0:
        return "inconclusive (no difference at all)"
    need = max(len(d) + 1, math.floor((2 * sd / m) ** 2 * (1 + 1e-12)) + 1)  # (n > that, strictly)
    return f"inconclusive (about {need} seeds would decide at this spread)"


def costs(
    runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
    flops: Mapping[str, float],
    baseline: str = BASELINE,
) -> dict[str, dict[str, Any]]:
    """Per variant: its parameters, FLOPs per token and seconds per step as fractions above the
    baseline's (+0.05 = 5% more), the seed-paired gain, and the gain per +1% of each cost.
    """
    base = runs[baseline]
    b_params = np.mean([e["params"] for e in base.values()])
    b_time = np.mean([e.get("step_seconds") or np.nan for e in base.values()])
    out = {}
    g = gains(runs, baseline)
    for name, seeds in runs.items():
        params = np.mean([e["params"] for e in seeds.values()]) / b_params - 1
        fl = flops[name] / flops[baseline] - 1
        time = np.mean([e.get("step_seconds") or np.nan for e in seeds.values()]) / b_time - 1
        gain = stats(g[name])
        per = {
            # below +0.5% a cost is too small to divide by (DenseFormer's 44 weights): no ratio
            key: gain["mean"] / (100 * extra) if extra >= MIN_EXTRA else float("nan")
            for key, extra in (("params", params), ("flops", fl), ("time", time))
        }
        out[name] = {
            "extra_params": float(params),
            "extra_flops": float(fl),
            "extra_time": float(time),
            "gain": gain,
            "gain_per_percent": per,
        }
    return out
