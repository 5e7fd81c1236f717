"""How the cost of a capture grows with depth and with the number of tokens.

Random Llama configurations of SmolLM2's width (d 576, 9 heads of 64, 3 KV heads, MLP 1536,
vocabulary 49152) at --layers depths (default 12, 24, 48, 96). For each depth, in one process:

* time: ``capture`` against the plain forward (``model(tokens)``) over the same windows, the two
  interleaved batch by batch (--windows windows of --ctx tokens, batch --batch), so machine load
  hits both alike; the ratio is capture seconds / forward seconds;
* memory: peak RSS growth of a capture and of a forward above the loaded model, each in a fresh
  subprocess, at 1x and 4x the windows (flat in the number of tokens when the 4x peak equals the
  1x peak: the sums do not grow with the tokens, only the batch's buffers exist).

The record goes to ``docs/data/capture_depth.json`` (``benchmarks/record.py``); ``make docs``
renders the depth table in ``docs/results.md`` from it.

    .venv/bin/python benchmarks/capture_depth.py [--layers 12 --layers 24] [--windows 4] [--ctx 256]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write as record_write  # noqa: E402


def model_of(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval()


def tokens(windows: int, ctx: int) -> torch.Tensor:
    return torch.randint(2, 49152, (windows, ctx), generator=torch.Generator().manual_seed(0))


def rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


def timed(layers: int, args) -> tuple[float, float]:
    """(forward seconds, capture seconds), interleaved batch by batch."""
    from depthscope.probes import capture

    model = model_of(layers)
    toks = tokens(args.windows, args.ctx)
    with torch.no_grad():
        model(toks[:1, :16])
        capture(model, toks[:1, :16], skip_positions=0)
        t_f = t_c = 0.0
        for chunk in toks.split(args.batch):
            t = time.perf_counter()
            model(chunk)
            t_f += time.perf_counter() - t
            t = time.perf_counter()
            capture(model, chunk, batch_size=args.batch, skip_positions=0)
            t_c += time.perf_counter() - t
    return t_f, t_c


def peak(mode: str, layers: int, windows: int, args) -> float:
    """Peak memory growth (MiB) of ``mode`` over ``windows`` windows, in this fresh process."""
    from depthscope.probes import capture

    model = model_of(layers)
    toks = tokens(windows, args.ctx)
    with torch.no_grad():
        if mode == "forward":
            model(toks[:1, :16])
        else:
            capture(model, toks[:1, :16], skip_positions=0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = rss_kb("VmRSS")
    with torch.no_grad():
        if mode == "forward":
            for chunk in toks.split(args.batch):
                model(chunk)
        else:
            capture(model, toks, batch_size=args.batch, skip_positions=0)
    return (rss_kb("VmHWM") - base) / 1024


def spawn(*argv: str) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    res = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, env=env)
    if res.returncode:
        raise SystemExit(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, action="append")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "LAYERS", "WINDOWS"))
    ap.add_argument("--json", default=None, help="the record (default docs/data/capture_depth.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        kind, layers, windows = args.worker[0], int(args.worker[1]), int(args.worker[2])
        if kind == "time":
            f, c = timed(layers, args)
            print(json.dumps({"forward": f, "capture": c}))
        else:
            print(json.dumps({"peak_mb": peak(kind, layers, windows, args)}))
        return
    common = ["--ctx", str(args.ctx), "--batch", str(args.batch), "--threads", str(args.threads)]
    common += ["--windows", str(args.windows)]
    rows = []
    for layers in args.layers or [12, 24, 48, 96]:
        t = spawn("--worker", "time", str(layers), "0", *common)
        mem = {
            f"{kind}_mb_{k}x": spawn("--worker", kind, str(layers), str(k * args.windows), *common)["peak_mb"]
            for kind in ("capture", "forward")
            for k in (1, 4)
        }
        rows.append(
            {
                "layers": layers,
                "sources": 2 * layers + 1,
                "forward_seconds": t["forward"],
                "capture_seconds": t["capture"],
                "time_ratio": t["capture"] / t["forward"],
                **mem,
                "memory_ratio": mem["capture_mb_1x"] / mem["forward_mb_1x"],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    settings = {k: getattr(args, k) for k in ("windows", "ctx", "batch", "threads")}
    settings["model"] = "random Llama, d 576, 9 heads of 64, 3 KV heads, MLP 1536, vocabulary 49152"
    print(f"wrote {record_write('capture_depth', settings, rows, Path(args.json) if args.json else None)}")


if __name__ == "__main__":
    main()
