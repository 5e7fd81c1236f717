"""What ``make demo`` costs: the main job on the bundled default (``depthscope report --out DIR`` with
no inputs: the whole zoo, its trajectories, the deep zoo and the seeds collection), timed as a
user runs it, and the size of the page it writes.

``--runs`` runs, each into a fresh temporary directory (removed after); the record keeps every run's
wall seconds, the page's bytes (``index.html``) and the number and total bytes of the files written.
It goes to ``docs/data/demo_cost.json`` (``benchmarks/record.py``), which ``make docs`` renders.

    .venv/bin/python benchmarks/demo_cost.py [--runs 1]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write as record_write  # noqa: E402


def one_run() -> dict:
    """One ``depthscope report`` of the bundled default into a fresh directory: seconds and sizes."""
    out = Path(tempfile.mkdtemp(prefix="depthscope-demo-"))
    try:
        target = out / "report"
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "depthscope", "report", "--out", str(target)], check=True)
        seconds = time.perf_counter() - t
        files = [p for p in target.rglob("*") if p.is_file()]
        return {
            "seconds": seconds,
            "page_bytes": (target / "index.html").stat().st_size,
            "files": len(files),
            "bytes": sum(p.stat().st_size for p in files),
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for _ in range(args.runs):
        rows.append(one_run())
        print(rows[-1], flush=True)
    print(f"wrote {record_write('demo_cost', {'runs': args.runs}, rows)}")


if __name__ == "__main__":
    main()
