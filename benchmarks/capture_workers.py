"""Data-parallel capture: `depthscope capture --workers N` against one process, end to end.

Each run is a fresh `depthscope capture` process (start-up, model loading in every worker and the
merge included: what a user waits for), on the same model, corpus and windows; the settings
alternate run by run (1, N, 1, N ...) so that machine load hits both alike, and the median of
--repeats runs is reported. One process uses every core for its threads; N workers share them
(cores // N threads each). A third setting, one process held to cores // N threads
(OMP_NUM_THREADS), gives the scaling of the data split itself: what N ranks on N devices of their
own would gain. The traces are compared too: the largest relative difference over every variable
and where it is, against one process (the model's float32 arithmetic depends on the thread count,
so it is not 0) and against the one process held to the workers' threads.

The record (every run's seconds, per case) goes to ``docs/data/capture_workers.json``
(``benchmarks/record.py``); ``make docs`` renders the table in ``docs/results.md`` from it. The
default cases: SmolLM2-135M on 8192 tokens in windows of 256, the zoo's AttnRes on 65,536.

    .venv/bin/python benchmarks/capture_workers.py [--case MODEL TOKENS 'OPTIONS' ...] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write as record_write  # noqa: E402

ZOO = Path(__file__).resolve().parents[1] / "depthscope" / "zoo"
CASES = [("smollm2", 8192, "--ctx 256"), (str(ZOO / "attnres.safetensors"), 65536, "")]


def run(model: str, out: Path, tokens: int, workers: int, extra: list[str], threads: int = 0) -> float:
    cmd = [sys.executable, "-m", "depthscope", "capture", model, "--out", str(out), "--tokens", str(tokens)]
    cmd += ["--workers", str(workers), "--quiet", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def max_relative_difference(a: Path, b: Path) -> tuple[float, str]:
    """The largest difference of two traces over every variable, relative to the variable's largest
    magnitude, and the variable it is in."""
    from depthscope.trace import load_trace

    x, y = load_trace(a), load_trace(b)
    worst = (0.0, "")
    for name in x.data_vars:
        u, v = x[name].values, y[name].values
        scale = np.nanmax(np.abs(u)) if np.isfinite(u).any() else 0.0
        if scale > 0:
            worst = max(worst, (float(np.nanmax(np.abs(u - v)) / scale), str(name)))
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", nargs=3, action="append", metavar=("MODEL", "TOKENS", "OPTIONS"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="the record (default docs/data/capture_workers.json)")
    args = p.parse_args()
    cases = [(m, int(t), o) for m, t, o in args.case] if args.case else CASES
    rows = [measure(model, tokens, extra.split(), args) for model, tokens, extra in cases]
    settings = {"workers": args.workers, "repeats": args.repeats, "cases": [list(c) for c in cases]}
    print(f"wrote {record_write('capture_workers', settings, rows, Path(args.json) if args.json else None)}")


def measure(model: str, tokens: int, extra: list[str], args) -> dict:
    """One case: 1 process, 1 process held to cores // workers threads, and the workers, alternated."""
    share = max(1, (os.cpu_count() or 1) // args.workers)
    settings = {"one": (1, 0), "one_held": (1, share), "workers": (args.workers, 0)}
    times: dict[str, list[float]] = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as d:
        outs = {k: Path(d) / f"{k}.nc" for k in settings}
        for _ in range(args.repeats):
            for k, (n, threads) in settings.items():
                times[k].append(run(model, outs[k], tokens, n, extra, threads))
        diff, where = max_relative_difference(outs["one"], outs["workers"])
        same, same_where = max_relative_difference(outs["one_held"], outs["workers"])  # equal threads
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {
        "model": Path(model).stem,
        "tokens": tokens,
        "options": " ".join(extra),
        "held_threads": share,
        **{f"seconds_{k}": v for k, v in med.items()},
        "speedup_vs_one": med["one"] / med["workers"],
        "speedup_vs_one_held": med["one_held"] / med["workers"],
        "max_relative_difference": diff,
        "max_difference_in": where,
        "equal_threads_difference": same,  # one process held to the workers' threads against them
        "equal_threads_difference_in": same_where,
        "runs": times,
    }
    print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    return row


if __name__ == "__main__":
    main()
