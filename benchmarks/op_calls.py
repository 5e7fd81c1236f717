"""Operator calls per batch of a capture, against a plain forward: what a GPU pays for in kernel
launches, counted on a CPU.

On a GPU every operator call is a kernel launch of a few microseconds of host time, so a capture
whose fold makes many small calls keeps the device waiting (``benchmarks/gpu.py`` measured it on an
H200). The count does not need a GPU: each variant of depthscope's own schemes is run at width 256
under a ``TorchDispatchMode`` that counts the aten operator calls that launch a kernel (not views,
not allocations left unfilled), for a plain forward and for a capture, the capture twice: with the
CPU's cache-sized token chunks and with an accelerator's (one chunk per batch at this size;
``probes.folds.chunk_bytes``). A count per batch is the difference between a run of three batches
and a run of one, halved, so what a capture does once (its set-up, its last checks) is not in it;
the forward runs batch by batch as a capture does. The counts are exact and the same on every run
of one tree.

    python benchmarks/op_calls.py                 # every variant, writes docs/data/op_calls.json
    python benchmarks/op_calls.py --variant dca   # one (repeatable)
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from capture_overhead import build, tokens_for  # noqa: E402  (benchmarks/, beside this file)
from record import write as record_write  # noqa: E402

# operators that run no kernel besides views: an allocation left unfilled, a reshape of a copy
NO_KERNEL = {
    "aten.empty",
    "aten.empty_like",
    "aten.empty_strided",
    "aten.new_empty",
    "aten.new_empty_strided",
    "aten._unsafe_view",
    "aten._reshape_alias",
    "aten.lift_fresh",
}


class Count(TorchDispatchMode):
    """Counts the aten operator calls made inside it that would launch a kernel on a GPU: every call
    but views and the operators in ``NO_KERNEL``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if not func.is_view and str(func.overloadpacket) not in NO_KERNEL:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def calls(run, toks: torch.Tensor, batch: int) -> float:
    """Operator calls per batch of ``run(tokens)``: (three batches - one batch) / 2, after one run
    that is not counted (a first run makes calls the later ones do not: caches, lazy set-up)."""
    run(toks[:batch])
    counts = []
    for n in (1, 3):
        with Count() as c:
            run(toks[: n * batch])
        counts.append(c.calls)
    return (counts[1] - counts[0]) / 2


def row(label: str, args) -> dict:
    from depthscope.probes import accumulate, capture

    model = build(label, args)
    toks = tokens_for(3 * args.batch * args.ctx, args.ctx)
    chunk = accumulate.chunk_bytes

    def forward(t):
        with torch.no_grad():
            for b in t.split(args.batch):
                model(b)

    def cap(t):
        capture(model, t, batch_size=args.batch, progress=False)

    out = {"variant": label, "forward_calls": calls(forward, toks, args.batch)}
    out["capture_calls_cpu"] = calls(cap, toks, args.batch)
    accumulate.chunk_bytes = lambda device: 1 << 40  # one chunk per batch, as on an accelerator here
    try:
        out["capture_calls_accelerator"] = calls(cap, toks, args.batch)
    finally:
        accumulate.chunk_bytes = chunk
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--variant", action="append", default=[], help="variant label (repeatable; default: all)")
    ap.add_argument("--json", default=None, help="the record (default docs/data/op_calls.json)")
    args = ap.parse_args()
    from depthscope.schemes import variants

    torch.set_num_threads(1)
    labels = args.variant or [label for label, _, _ in variants()]
    rows = []
    for label in labels:
        r = row(
            label,
            types.SimpleNamespace(layers=args.layers, d_model=args.d_model, ctx=args.ctx, batch=args.batch),
        )
        print(
            f"{label}: forward {r['forward_calls']:.0f}, capture {r['capture_calls_cpu']:.0f} (CPU chunks), "
            f"{r['capture_calls_accelerator']:.0f} (one chunk) operator calls per batch",
            flush=True,
        )
        rows.append(r)
    settings = {"layers": args.layers, "d_model": args.d_model, "ctx": args.ctx, "batch": args.batch}
    path = record_write("op_calls", settings, rows, Path(args.json) if args.json else None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
