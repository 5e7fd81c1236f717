"""Training tokens/s of every scheme variant relative to `standard`, measured side by side.

All variants are built at the same size and timed in interleaved rounds (one step of each per
round), so load drift on a shared machine hits every variant alike; the table reports the median
step time and its ratio to standard (higher is better; 1.0 = as fast as standard).

    .venv/bin/python benchmarks/train_throughput.py [--rounds 12] [--layers 8] [--d-model 128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from depthscope.schemes import DepthModel, ModelConfig, variants

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
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (args.batch, args.ctx + 1), generator=g)
    runs = {}
    for label, scheme, options in variants():
        torch.manual_seed(0)
        cfg = ModelConfig(
            scheme=scheme,
            options=options,
            n_layers=args.layers,
            d_model=args.d_model,
            n_heads=4,
            ctx=args.ctx,
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
    n_tok = args.batch * args.ctx
    print(
        f"{args.layers} blocks, d_model {args.d_model}, ctx {args.ctx}, batch {args.batch}, {args.threads} "
        f"thread(s), median of {args.rounds} interleaved rounds"
    )
    print("| variant | parameters | ms/step | tokens/s | vs standard | target |")
    print("|---|---|---|---|---|---|")
    for label, ts in times.items():
        med = statistics.median(ts)
        target = TARGETS.get(label)
        mark = (
            "" if target is None else (f">= {target} ok" if base / med >= target else f">= {target} MISSED")
        )
        params = sum(p.numel() for p in runs[label][0].parameters())
        print(f"| {label} | {params:,} | {med * 1e3:.1f} | {n_tok / med:,.0f} | {base / med:.2f} | {mark} |")


if __name__ == "__main__":
    main()
