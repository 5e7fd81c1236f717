"""Cost of capturing a trace, relative to a plain forward pass over the same tokens.

For each scheme variant (8 blocks, d_model 256, ctx 128 by default):

* time ratio: capture / plain forward, measured in the same process with the two interleaved
  chunk by chunk (so machine load hits both alike), over --tokens tokens; the median of --repeat
  such runs (each run's seconds kept in the record);
* memory ratio: peak RSS growth of a capture / of a plain forward (each in a fresh subprocess,
  peak reset with /proc/self/clear_refs before the work starts);
* flatness: capture peak at 8x the tokens / at 1x (1x = --tokens / 8), which is 1.0 when memory
  does not grow with the number of tokens.

And on a standard (GPT-2 style TransformerBridge) model: depthscope's capture versus
TransformerLens ``run_with_cache`` + ``decompose_resid`` computing the same contribution shares.

``--baseline DIR`` (a checkout of another depthscope version, e.g. ``git worktree add /tmp/before
<commit>``) adds a column: this version's capture time over that version's, each measured in its
own fresh process, alternating three times per variant (median).

    .venv/bin/python benchmarks/capture_overhead.py [--tokens 65536] [--variant standard --variant attnres]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import interleaved  # noqa: E402  (benchmarks/record.py, beside this file)
from record import write as record_write  # noqa: E402

TARGET_TIME = {"static": 1.3, "dynamic": 1.3}  # issue 18: every scheme at width 256 within 1.3x


def is_static(label: str) -> bool:
    """Whether a variant's weights are input-independent (declared by its scheme)."""
    from depthscope.schemes import get_scheme, variants
    from depthscope.schemes.base import build_options

    for lab, scheme, options in variants():
        if lab == label:
            cls = get_scheme(scheme)
            return cls.is_static(build_options(cls, options))
    raise SystemExit(f"unknown variant {label}")


def dwa_count(model) -> str:
    """For DenseFormer variants: how many DWA modules the model has (a real average, not a pass-through)."""
    mixers = [b.attn_mix for b in getattr(model, "blocks", [])] + [getattr(model, "readout_mix", None)]
    n = sum(1 for m in mixers if getattr(m, "states", None))
    return f" ({n} DWA)" if model.cfg.scheme == "denseformer" else ""


def rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


def build(label: str, args) -> torch.nn.Module:
    from depthscope.schemes import DepthModel, ModelConfig, variants

    torch.manual_seed(0)
    for lab, scheme, options in variants():
        if lab == label:
            cfg = ModelConfig(
                scheme=scheme,
                options=options,
                n_layers=args.layers,
                d_model=args.d_model,
                n_heads=4,
                ctx=args.ctx,
            )
            return DepthModel(cfg).eval()
    raise SystemExit(f"unknown variant {label}")


def build_bridge(args):
    from transformer_lens import TransformerBridge, TransformerBridgeConfig

    cfg = TransformerBridgeConfig(
        d_model=args.d_model,
        d_head=args.d_model // 4,
        n_heads=4,
        n_layers=args.layers,
        n_ctx=args.ctx,
        d_vocab=256,
        d_mlp=4 * args.d_model,
        act_fn="gelu",
        seed=0,
    )
    return TransformerBridge.boot_native(cfg)


def tokens_for(n: int, ctx: int) -> torch.Tensor:
    return torch.randint(0, 256, (max(1, n // ctx), ctx), generator=torch.Generator().manual_seed(0))


def tl_shares(model, toks: torch.Tensor, batch: int) -> torch.Tensor:
    """TransformerLens path: run_with_cache + decompose_resid, shares accumulated over batches."""
    n = model.cfg.n_layers
    rows = [dict(layer=i, mlp_input=m) for i in range(n) for m in (False, True)] + [dict(layer=None)]
    dots, hh = None, torch.zeros(len(rows), dtype=torch.float64)
    for chunk in toks.split(batch):
        _, cache = model.run_with_cache(chunk)
        out = []
        for r, kw in enumerate(rows):
            comps = cache.decompose_resid(incl_embeds=True, **kw)
            h = comps.sum(0)
            d = torch.einsum("cbpd,bpd->c", comps, h).double()
            out.append(torch.nn.functional.pad(d, (0, 2 * n + 2 - len(d))))
            hh[r] += h.double().pow(2).sum()
        dots = torch.stack(out) if dots is None else dots + torch.stack(out)
        del cache
    return dots / hh[:, None]


def worker(mode: str, label: str, n_tokens: int, args) -> dict:
    """One measurement in this (fresh) process: peak RSS growth and seconds."""
    from depthscope.probes import capture

    torch.set_num_threads(args.threads)
    model = build_bridge(args) if label == "bridge" else build(label, args)
    toks = tokens_for(n_tokens, args.ctx)
    with torch.no_grad():  # warm-up outside the measured peak (lazy imports, first allocations)
        model(toks[:1])
        if mode == "capture":
            capture(model, toks[:2], batch_size=2)
        elif mode == "tl":
            tl_shares(model, toks[:2], 2)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = rss_kb("VmRSS")
    t = time.perf_counter()
    with torch.no_grad():
        if mode == "forward":
            for chunk in toks.split(args.batch):
                model(chunk)
        elif mode == "capture":
            capture(model, toks, batch_size=args.batch)
        elif mode == "tl":
            tl_shares(model, toks, args.batch)
    seconds = time.perf_counter() - t
    return {"peak_mb": (rss_kb("VmHWM") - base) / 1024, "seconds": seconds}


def spawn(mode: str, label: str, n_tokens: int, args, tree: str | None = None) -> dict:
    # A fixed mmap threshold makes glibc return freed tensors to the OS, so the peak RSS measures
    # live memory rather than the allocator's retention (the same for every mode).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    if tree:  # another depthscope checkout first on the path
        env["PYTHONPATH"] = tree
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        mode,
        label,
        str(n_tokens),
        "--layers",
        str(args.layers),
        "--d-model",
        str(args.d_model),
        "--ctx",
        str(args.ctx),
        "--batch",
        str(args.batch),
        "--threads",
        str(args.threads),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def interleaved_time(label: str, args) -> tuple[float, float]:
    """Seconds of plain forward and of capture over the same tokens, alternating chunk by chunk."""
    from depthscope.probes import capture

    torch.set_num_threads(args.threads)
    model = build_bridge(args) if label == "bridge" else build(label, args)
    toks = tokens_for(args.tokens, args.ctx)
    per = max(1, 8192 // args.ctx)  # 8k-token chunks, each captured as a whole

    def forward(chunk: torch.Tensor) -> None:
        for b in chunk.split(args.batch):
            model(b)

    with torch.no_grad():
        t_fwd, t_cap, _ = interleaved(toks, per, forward, lambda c: capture(model, c, batch_size=args.batch))
    return t_fwd, t_cap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=3, metavar=("MODE", "VARIANT", "TOKENS"))
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved timing runs per variant (median)")
    ap.add_argument("--variant", action="append", default=[], help="variant label (repeatable; default: all)")
    ap.add_argument("--baseline", default=None, help="a depthscope checkout to compare capture times with")
    ap.add_argument("--no-bridge", action="store_true", help="skip the TransformerLens comparison")
    ap.add_argument(
        "--json", default=None, help="the record to write (default docs/data/capture_overhead.json)"
    )
    args = ap.parse_args()
    if args.worker:
        mode, label, n = args.worker
        print(json.dumps(worker(mode, label, int(n), args)))
        return
    from depthscope.schemes import variants

    labels = args.variant or [lab for lab, _, _ in variants()]
    print(
        f"{args.layers} blocks, d_model {args.d_model}, ctx {args.ctx}, batch {args.batch}, {args.tokens} "
        f"tokens, {args.threads} thread(s)"
    )
    extra = " capture time / baseline's |" if args.baseline else ""
    print(
        "| variant | capture / forward time | capture / forward peak memory | peak at 8x / 1x tokens | "
        f"time target |{extra}"
    )
    print("|---|---|---|---|---|" + ("---|" if args.baseline else ""))
    rows = []
    for label in labels:
        runs = [interleaved_time(label, args) for _ in range(args.repeat)]
        ratio = statistics.median(c / f for f, c in runs)
        fwd = spawn("forward", label, args.tokens, args)
        cap = spawn("capture", label, args.tokens, args)
        small = spawn("capture", label, args.tokens // 8, args)
        target = TARGET_TIME["static" if is_static(label) else "dynamic"]
        ok = "ok" if ratio <= target else "MISSED"
        row = (
            f"| {label}{dwa_count(build(label, args))} | {ratio:.2f} | "
            f"{cap['peak_mb'] / max(fwd['peak_mb'], 1e-9):.2f} "
            f"({cap['peak_mb']:.0f} / {fwd['peak_mb']:.0f} MB) "
            f"| {cap['peak_mb'] / max(small['peak_mb'], 1e-9):.2f} | <= {target} {ok} |"
        )
        record = {
            "variant": label,
            "static": is_static(label),
            "runs": [{"forward_seconds": f, "capture_seconds": c} for f, c in runs],
            "time_ratio": ratio,
            "forward_peak_mb": fwd["peak_mb"],
            "capture_peak_mb": cap["peak_mb"],
            "capture_peak_mb_eighth_tokens": small["peak_mb"],
            "memory_ratio": cap["peak_mb"] / max(fwd["peak_mb"], 1e-9),
            "target": target,
        }
        if args.baseline:
            ours, theirs = [], []
            for _ in range(3):
                theirs.append(spawn("capture", label, args.tokens, args, tree=args.baseline)["seconds"])
                ours.append(spawn("capture", label, args.tokens, args)["seconds"])
            row += f" {statistics.median(ours) / statistics.median(theirs):.2f} |"
            record["baseline_ratio"] = statistics.median(ours) / statistics.median(theirs)
        print(row, flush=True)
        rows.append(record)
    settings = {
        k: getattr(args, k)
        for k in ("tokens", "layers", "d_model", "ctx", "batch", "threads", "repeat", "baseline")
    }
    if args.json or not args.variant:  # a subset of the variants never replaces the full record
        written = record_write("capture_overhead", settings, rows, Path(args.json) if args.json else None)
        print(f"wrote {written}")
    if args.no_bridge:
        return
    ds = spawn("capture", "bridge", args.tokens, args)
    tl = spawn("tl", "bridge", args.tokens, args)
    print()
    print("Standard GPT-2-style TransformerBridge, same tokens, contribution shares of every consumer:")
    print("| path | seconds | peak memory (MB) |")
    print("|---|---|---|")
    print(f"| depthscope capture | {ds['seconds']:.1f} | {ds['peak_mb']:.0f} |")
    print(f"| TransformerLens run_with_cache + decompose_resid | {tl['seconds']:.1f} | {tl['peak_mb']:.0f} |")
    print(
        f"| ratio (TransformerLens / depthscope) | {tl['seconds'] / ds['seconds']:.1f}x | "
        f"{tl['peak_mb'] / max(ds['peak_mb'], 1e-9):.1f}x |"
    )


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
