"""Training tokens/s of every scheme variant relative to `standard`, measured side by side.

All variants are built at the same size and timed in interleaved rounds (one step of each per
round), so load drift on a shared machine hits every variant alike; the table reports the median
step time and its ratio to standard (higher is better; 1.0 = as fast as standard).

The record (every step time, per width) goes to ``docs/data/train_throughput.json``
(``benchmarks/record.py``); ``make docs`` renders the table in ``docs/results.md`` from it.

    .venv/bin/python benchmarks/train_throughput.py [--rounds 12] [--layers 8] [--d-model 128 --d-model 256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from depthscope.schemes import DepthModel, ModelConfig, variants

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write as record_write  # noqa: E402

TARGETS = {
    "denseformer": 0.85,
    "denseformer-2x2": 0.85,
    "attnres-block4": 0.85,
    "attnres": 0.7,
    "dca": 0.5,
    "dca-k2": 0.5,
    "hc": 0.6,
    "hc-static": 0.6,
    "mhc": 0.6,
    "ddl": 0.7,
    "shortswa": 0.6,
    "shortswa-seq": 0.6,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, action="append", help="widths (default 128 and 256)")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="the record (default docs/data/train_throughput.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    widths = args.d_model or [128, 256]
    rows = [row for d in widths for row in measure(args, d)]
    settings = {k: getattr(args, k) for k in ("rounds", "warmup", "layers", "ctx", "batch", "threads")}
    path = record_write(
        "train_throughput", {**settings, "widths": widths}, rows, args.json and Path(args.json)
    )
    print(f"wrote {path}")


def measure(args, d_model: int) -> list[dict]:
    """Every variant's training steps at one width, timed in interleaved rounds."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (args.batch, args.ctx + 1), generator=g)
    runs = {}
    for label, scheme, options in variants():
        torch.manual_seed(0)
        cfg = ModelConfig(
            scheme=scheme, options=options, n_layers=args.layers, d_model=d_model, n_heads=4, ctx=args.ctx
        )
        model = DepthModel(cfg).train()
        runs[label] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))

    def step(model, opt):
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for model, opt in runs.values():
        for _ in range(args.warmup):
            step(model, opt)
    times = {k: [] for k in runs}
    for _ in range(args.rounds):
        for label, (model, opt) in runs.items():
            t = time.perf_counter()
            step(model, opt)
            times[label].append(time.perf_counter() - t)
    base = statistics.median(times["standard"])
    rows = []
    for label, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                "variant": label,
                "d_model": d_model,
                "params": sum(p.numel() for p in runs[label][0].parameters()),
                "step_seconds": ts,
                "median_seconds": med,
                "vs_standard": base / med,
                "target": TARGETS.get(label),
            }
        )
        print(f"| {label} | d {d_model} | {med * 1e3:.1f} ms | {base / med:.2f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
