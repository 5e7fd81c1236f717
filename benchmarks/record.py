"""A benchmark's results as data: one JSON file under ``docs/data/`` per benchmark, which the pages
are generated from (``benchmarks/docs.py``, ``make docs``), never typed by hand.

A record holds the machine (CPU model, cores), the versions (Python, torch, depthscope and its git
commit), the command and settings it ran with, when, and the benchmark's rows with their raw
timings. It is written atomically: a run that stops half way leaves the previous record whole.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"


def machine() -> dict[str, Any]:
    """The CPU model, its cores and the cores this process may use."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable, "system": platform.system()}


def versions() -> dict[str, Any]:
    """Python, torch and depthscope (with the commit of this checkout, and whether it was modified; the
    commit named by ``DEPTHSCOPE_COMMIT`` where that is set, for a copy of a tree run elsewhere)."""
    import torch

    import depthscope

    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "depthscope": depthscope.__version__,
    }
    sent = os.environ.get("DEPTHSCOPE_COMMIT")  # a copy of the tree sent elsewhere (a GPU machine's)
    if sent:
        found["commit"] = sent
        return found
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "depthscope"], cwd=ROOT, capture_output=True, text=True
        )
        found["commit"] = commit + ("+modified" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        found["commit"] = None
    return found


def write(name: str, settings: dict[str, Any], rows: list[dict[str, Any]], path: Path | None = None) -> Path:
    """Write ``docs/data/NAME.json`` (or ``path``): machine, versions, command, settings, rows."""
    path = path or DATA / f"{name}.json"
    record = {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).as_posix().split(f"{ROOT.as_posix()}/")[-1], *sys.argv[1:]]),
        "machine": machine(),
        "versions": versions(),
        "settings": settings,
        "rows": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def median_run(measure: Callable[[], dict[str, Any]], repeat: int) -> dict[str, Any]:
    """Run ``measure`` (a row with ``forward_seconds`` and ``capture_seconds``) ``repeat`` times (odd)
    and keep the row of the run whose capture / forward ratio is the median: its ``time_ratio`` is that
    ratio, ``runs`` every run's seconds, ``max_residual_error`` (where rows have one) the largest of all.
    A machine's load moves a single run by up to 15% here; the median of three does not move with one.
    """
    if repeat < 1 or repeat % 2 == 0:
        raise ValueError(f"repeat must be odd and positive (a median that is one run), not {repeat}")
    rows = [measure() for _ in range(repeat)]
    ratio = lambda r: r["capture_seconds"] / r["forward_seconds"]  # noqa: E731
    row = dict(sorted(rows, key=ratio)[repeat // 2])
    row["time_ratio"] = ratio(row)
    row["runs"] = [{k: r[k] for k in ("forward_seconds", "capture_seconds")} for r in rows]
    if all("max_residual_error" in r for r in rows):
        row["max_residual_error"] = max(r["max_residual_error"] for r in rows)
    return row


def interleaved(toks: Any, per: int, first: Callable, second: Callable) -> tuple[float, float, list]:
    """Seconds of ``first`` and of ``second`` over the same chunks of ``per`` windows of ``toks``,
    alternating chunk by chunk so that the machine's load hits both alike (after one warm-up call of
    each on one window); and ``second``'s results.
    """
    first(toks[:1])
    second(toks[:1])
    t_a = t_b = 0.0
    out = []
    for chunk in toks.split(per):
        t = time.perf_counter()
        first(chunk)
        t_a += time.perf_counter() - t
        t = time.perf_counter()
        out.append(second(chunk))
        t_b += time.perf_counter() - t
    return t_a, t_b, out
