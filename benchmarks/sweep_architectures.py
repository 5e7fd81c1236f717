"""Every model type in transformers' causal-LM mapping, built tiny, saved, loaded and captured as a
user would, each reading checked against the layer-level oracle; writes docs/architectures.md.

For each type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: a tiny random model
(``tests.architectures.tiny_model``: 4 layers of width 64, 4 heads, vocabulary 128, the sizes a
config has shrunk, a few per-type overrides), ``save_pretrained`` to a temporary directory,
``depthscope.load`` of that directory, ``capture`` on 2 windows of 16 random token ids (no positions
skipped), then ``tests.architectures.oracle_errors``: plain forward hooks on the model's layers,
nothing of depthscope, give each layer's write (output minus input); at every layer boundary the
shares of a block's sources must sum to that write's share of the consumer's input, the embedding
sources' to the first layer's input's, and the input RMS must agree. A reading more than
``ORACLE_TOL`` off is WRONG. Outcomes: ``read`` (by which layout, discovery or family), ``refused``
(the one-line reason depthscope gives), ``does not build`` (the tiny config or its forward fails in
transformers itself), ``crash`` (anything depthscope raised that is not its one-line refusal, or a
worker process that died).

Types run in worker processes (--workers at a time, --batch types each), so one that brings down
its process costs only itself.

    .venv/bin/python benchmarks/sweep_architectures.py [--only llama --only mamba] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: tests.architectures
ORACLE_TOL = 1e-4
COMMAND = "python benchmarks/sweep_architectures.py"


def one(model_type: str) -> dict:
    """The outcome of one model type (see the module docstring)."""
    import torch

    from depthscope.errors import DepthscopeError
    from depthscope.probes import capture
    from depthscope.probes.load import load_model
    from tests.architectures import oracle_errors, tiny_model

    row: dict = {"type": model_type}
    try:
        model = tiny_model(model_type)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            row["class"] = type(model).__name__
            del model
            try:
                model = load_model(tmp)
            except DepthscopeError as err:
                return {**row, "status": "refused", "reason": str(err).replace(tmp, "DIR")}
    except Exception as err:  # transformers' own failure on a tiny config: not depthscope's
        return {**row, "status": "does not build", "reason": f"{type(err).__name__}: {_line(err)}"}
    tokens = torch.randint(5, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    try:
        trace = capture(model, tokens, skip_positions=0)
    except DepthscopeError as err:
        return {**row, "status": "refused", "reason": _line(err)}
    except Exception as err:
        where = traceback.extract_tb(err.__traceback__)[-1]
        return {
            **row,
            "status": "crash",
            "reason": f"{type(err).__name__}: {_line(err)} ({Path(where.filename).name}:{where.lineno})",
        }
    kinds = sorted({str(k) for k in trace["source_kind"].values} - {"embed"})
    row.update(
        family=trace.attrs["family"],
        how=str(trace.attrs.get("layout", trace.attrs["family"])),
        sources=int(trace.sizes["source"]),
        consumers=int(trace.sizes["layer"]),
        kinds=",".join(kinds),
        static=int(trace.attrs.get("static_weights", 0)),
        parallel=int(trace.attrs.get("parallel_residual", 0)),
        residual_error=float(trace["residual_error"].max()),
    )
    worst = oracle_errors(trace, model, tokens)
    if worst is None:
        return {**row, "status": "read", "oracle": "n/a (depth mixing or streams)"}
    row["oracle"] = max(worst.values())
    return {**row, "status": "read" if row["oracle"] <= ORACLE_TOL else "WRONG"}


def _line(err: Exception) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0][:300]


def worker(types: list[str]) -> None:
    """Run ``types`` one after another, one JSON line each on stdout."""
    warnings.filterwarnings("ignore")
    from transformers.utils import logging

    logging.set_verbosity_error()
    for t in types:
        print(json.dumps(one(t)), flush=True)


def run_batch(types: list[str], timeout: float) -> list[dict]:
    """Rows of ``types`` from worker processes; a type that kills its worker (or hangs past
    ``timeout`` seconds) is a crash, and the rest of its batch runs in a new worker.
    """
    rows: list[dict] = []
    while types:
        cmd = [sys.executable, __file__, "--worker", *types]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * len(types), cwd=ROOT)
            out, died = done.stdout, done.returncode != 0
        except subprocess.TimeoutExpired as err:
            out, died = (
                (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or ""),
                True,
            )
        got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        rows += got
        types = types[len(got) :]
        if types and died:
            rows.append({"type": types[0], "status": "crash", "reason": "the worker process died or hung"})
            types = types[1:]
    return rows


# --- the page ----------------------------------------------------------------------------------

# a refusal's check, from its one line: (pattern, short name in the counts)
CHECKS = (
    (
        r"something other than its children's outputs",
        "a layer's output is not its input plus its children's writes",
    ),
    (r"no list of layers found", "no list of layers found"),
    (r"runs \d+ times in one forward", "a module runs more than once per forward"),
    (r"is not layer \d+'s output", "something acts between layers"),
    (r"does not read the stream", "a read does not see the stream"),
    (r"nothing after the last layer reads", "nothing reads the last layer's output"),
    (r"first layer's input is not", "the first layer's input is not the embedding"),
    (r"cannot tell what kind", "a write of no known kind"),
    (r"probe forward failed", "the forward fails on plain token ids"),
    (r"no module reads the stream before", "a write with no read"),
    (r"not additive|not the sum of the captured", "the engine's rebuild check"),
)


def check_name(reason: str) -> str:
    """The short name of the check a refusal names."""
    return next((name for pattern, name in CHECKS if re.search(pattern, reason)), reason.split(":")[0][:60])


def counts(rows: list[dict]) -> dict:
    """Counts of every outcome, and of refusals by check."""
    status = Counter(r["status"] for r in rows)
    built = len(rows) - status["does not build"]
    refused = Counter(check_name(r["reason"]) for r in rows if r["status"] == "refused")
    how = Counter(r["how"].split(" ")[0] for r in rows if r["status"] == "read")
    return {
        "types": len(rows),
        "built": built,
        "status": dict(status),
        "refused": dict(refused),
        "how": dict(how),
    }


def page(rows: list[dict], args: argparse.Namespace) -> str:
    """docs/architectures.md: the counts, then one row per model type."""
    import torch
    import transformers

    c = counts(rows)
    s = c["status"]
    date = datetime.date.today().isoformat()
    cmd = COMMAND + "".join(f" --only {t}" for t in args.only)
    lines = [
        "# Which transformers model types depthscope reads",
        "",
        f"Written by `{cmd}` on {date} with transformers {transformers.__version__} and torch "
        f"{torch.__version__}: every model type in `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` built as a tiny "
        "random model (4 layers of width 64; `tests/architectures.py`), saved with `save_pretrained`, "
        "loaded with `depthscope.load` and captured on 2 windows of 16 random token ids. Each reading is "
        "checked against an independent layer-level oracle (plain forward hooks on the layers): at each "
        "layer boundary the shares of a block's sources must sum to the share of that layer's write "
        f"(output minus input) within {ORACLE_TOL:g}.",
        "",
        f"**{c['types']} types, {c['built']} build; {s.get('read', 0)} read exactly, "
        f"{s.get('refused', 0)} refused, {s.get('crash', 0)} crashes, {s.get('WRONG', 0)} wrong.** Read by: "
        + ", ".join(f"{n} {k}" for k, n in sorted(c["how"].items(), key=lambda kv: -kv[1]))
        + " (`layout` = a row of the layouts table in `depthscope/probes/adapters/huggingface.py`, "
        "`discovered` = found from the probe forward, `post-ln layout` / `post-ln structure` = a post-LN "
        "model read through its LayerNorms from a row of `post_ln.LAYOUTS` / from what its modules compute, "
        "others = a family of its own). Refused, by the check "
        "that failed:",
        "",
        *[f"- {name}: {n}" for name, n in sorted(c["refused"].items(), key=lambda kv: -kv[1])],
        "",
        "`oracle` is the largest difference from the layer-level oracle (n/a for families whose stream is "
        "not a running sum of its writes, depth mixing or several streams: their own tests compare them "
        "with the model's computation); `static` marks scaled writes or "
        "embeddings (static weights in `mixing`), `parallel` a step where several sublayers read one stream.",
        "",
        "| model type | class | outcome | read by / reason | sources | kinds | static | parallel "
        "| residual error | oracle |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["type"]):
        if r["status"] in ("read", "WRONG"):
            oracle = r["oracle"] if isinstance(r["oracle"], str) else f"{r['oracle']:.1e}"
            cells = [
                r["how"],
                r["sources"],
                r["kinds"],
                "yes" if r["static"] else "",
                "yes" if r["parallel"] else "",
                f"{r['residual_error']:.1e}",
                oracle,
            ]
        else:
            cells = [r["reason"].replace("|", "/"), "", "", "", "", "", ""]
        lines.append(
            "| " + " | ".join(str(x) for x in [r["type"], r.get("class", ""), r["status"], *cells]) + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse the arguments, run the sweep, write the page and print the counts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="model types to run (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "architectures.md")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=12, help="model types per worker process")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per model type before it is a crash")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = args.only or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    batches = [types[i : i + args.batch] for i in range(0, len(types), args.batch)]
    with ThreadPoolExecutor(args.workers) as pool:
        rows = [r for batch in pool.map(lambda b: run_batch(b, args.timeout), batches) for r in batch]
    for r in sorted(rows, key=lambda r: r["type"]):
        print(f"{r['type']:28s} {r['status']:15s} {r.get('how', r.get('reason', ''))[:150]}")
    print(json.dumps(counts(rows), indent=1))
    if args.out:
        args.out.write_text(page(rows, args))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
