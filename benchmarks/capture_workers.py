"""Data-parallel capture: `depthscope capture --workers N` against one process, end to end.

Each run is a fresh `depthscope capture` process (start-up, model loading in every worker and the
merge included: what a user waits for), on the same model, corpus and windows; the settings
alternate run by run (1, N, 1, N ...) so that machine load hits both alike, and the median of
--repeats runs is reported. One process uses every core for its threads; N workers share them
(cores // N threads each). A third setting, one process held to cores // N threads
(OMP_NUM_THREADS), gives the scaling of the data split itself: what N ranks on N devices of their
own would gain. The traces are compared too: the largest relative difference over every variable
(the model's float32 arithmetic depends on the thread count, so it is not 0).

    .venv/bin/python benchmarks/capture_workers.py [--model PATH] [--tokens 65536] [--workers 2]
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


def run(model: str, out: Path, tokens: int, workers: int, extra: list[str], threads: int = 0) -> float:
    cmd = [sys.executable, "-m", "depthscope", "capture", model, "--out", str(out), "--tokens", str(tokens)]
    cmd += ["--workers", str(workers), "--quiet", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def max_relative_difference(a: Path, b: Path) -> float:
    from depthscope.trace import load_trace

    x, y = load_trace(a), load_trace(b)
    worst = 0.0
    for name in x.data_vars:
        u, v = x[name].values, y[name].values
        scale = np.nanmax(np.abs(u)) if np.isfinite(u).any() else 0.0
        if scale > 0:
            worst = max(worst, float(np.nanmax(np.abs(u - v)) / scale))
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(Path(__file__).parents[1] / "depthscope/zoo/attnres.safetensors"))
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--extra", default="", help="more capture options, e.g. '--ctx 256 --rank'")
    args = p.parse_args()
    extra = args.extra.split()
    share = max(1, (os.cpu_count() or 1) // args.workers)
    settings = {"1": (1, 0), f"1x{share}thread": (1, share), str(args.workers): (args.workers, 0)}
    times: dict[str, list[float]] = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as d:
        outs = {k: Path(d) / f"w{k}.nc" for k in settings}
        for _ in range(args.repeats):
            for k, (n, threads) in settings.items():
                times[k].append(run(args.model, outs[k], args.tokens, n, extra, threads))
        diff = max_relative_difference(outs["1"], outs[str(args.workers)])
    med = {k: statistics.median(v) for k, v in times.items()}
    many = med[str(args.workers)]
    print(
        json.dumps(
            {
                "model": Path(args.model).name,
                "tokens": args.tokens,
                "cores": os.cpu_count(),
                **{f"seconds_{k}": round(v, 2) for k, v in med.items()},
                "speedup_vs_1_process": round(med["1"] / many, 2),
                f"speedup_vs_1_process_{share}_thread": round(med[f"1x{share}thread"] / many, 2),
                "max_relative_difference": diff,
                "runs": {k: [round(t, 2) for t in v] for k, v in times.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
