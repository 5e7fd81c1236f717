"""Collective rank against width: small standard and DCA models trained at each width, as
``depthscope rank sweep`` trains them (``pipelines.rank.rank_sweep``: the default corpus, 4 blocks,
300 steps, seed 0, ``--tokens`` captured with ``--rank``), and their r* (numerical rank at 0.99 of
the energy, entropy rank, participation ratio), r*/d and validation loss.

The record goes to ``docs/data/rank_sweep.json`` (``benchmarks/record.py``); ``make docs`` renders
the table in ``docs/results.md`` from it. About 10 minutes on 2 cores.

    .venv/bin/python benchmarks/rank_sweep.py [--width 32 --width 64 --width 128] [--tokens 8192]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write as record_write  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from depthscope.pipelines.rank import rank_sweep

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, action="append", help="widths (default 32, 64, 128)")
    ap.add_argument("--scheme", action="append", help="schemes (default standard and dca)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--json", default=None, help="the record (default docs/data/rank_sweep.json)")
    args = ap.parse_args(argv)
    widths, schemes = args.width or [32, 64, 128], tuple(args.scheme or ("standard", "dca"))
    table = rank_sweep(widths, schemes, n_layers=args.layers, steps=args.steps, tokens=args.tokens)
    rows = [
        {
            "scheme": s,
            "width": w,
            "val_loss": float(table["val_loss"].sel(scheme=s, width=w)),
            **{
                f"r_star_{k}": float(table["collective_rank"].sel(scheme=s, width=w, rank_kind=k))
                for k in table["rank_kind"].values
            },
        }
        for s in schemes
        for w in widths
    ]
    settings = {"widths": widths, "schemes": list(schemes), **table.attrs}
    print(f"wrote {record_write('rank_sweep', settings, rows, Path(args.json) if args.json else None)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
