"""Cost of capturing a trace, per model family and per causal option, relative to plain forwards.

1. Capture cost per model family: one small model of every family an adapter reads (depthscope's
   zoo ``standard`` and ``attnres`` checkpoints; a tiny random Hugging Face Llama; a TransformerBridge
   booted natively; and, where the package is installed, small random models of hyper-connections,
   deep-cross-attention, attn-res, x-transformers, and the transformers families deepseek_v4,
   qwen4_exp and beam). Sizes are kept comparable where the family allows (--layers blocks of width
   --d-model, 4 heads of 16; the table states what was built). Each model gets random token ids
   within its vocabulary (ids >= 2, clear of special tokens), windows of min(its context, --ctx),
   --tokens in all. Plain forwards (the adapter's own call of the model, batch --batch, no_grad)
   and ``capture(model, tokens, batch_size=--batch)`` run interleaved chunk by chunk (--chunk tokens
   each) in this one process, so machine load hits both alike; the ratio is capture / forward
   seconds, the median of --repeat such runs (each run's seconds are kept). The sources x
   consumers of the trace and its largest ``residual_error`` (over chunks and runs)
   are reported. A family that fails to build or capture prints its row with the error.

2. Cost of the causal options on the zoo ``attnres`` and ``standard`` checkpoints: ``logits=True``,
   ``ablate="sources"`` and ``ablate="cells"``, each timed interleaved chunk by chunk against a plain
   capture of the same tokens (--causal-tokens; --ablate-tokens for the cells, one forward per
   (consumer, source) cell). "forwards per batch" counts the non-NaN entries of the trace's
   ``ablation_effect`` (source) or ``ablation_effect_cell`` (layer, source): the ablated forwards each
   batch implies on top of the captured one.

Timings are wall-clock with --threads torch threads (default 1); fixed costs of a capture (adapter
resolution, building the dataset) are paid once per chunk, so larger --chunk amortises them more.

    .venv/bin/python benchmarks/capture_families.py [--tokens 8192] [--family attn_res --family beam]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.families

from tests.families import FAMILIES, HEAD_DIM, zoo  # noqa: E402  (one small model per family, shared with the tests)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import interleaved, median_run  # noqa: E402  (benchmarks/record.py, beside this file)
from record import write as record_write  # noqa: E402

# --- measurement -----------------------------------------------------------------------------------


def tokens_for(n_tokens: int, window: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (max(1, n_tokens // window), window), generator=g)


def one_line(err: BaseException) -> str:
    msg = " ".join(f"{type(err).__name__}: {err}".split()).replace("|", "/")
    return msg if len(msg) <= 240 else msg[:237] + "..."


def family_row(name: str, build: Callable, args) -> tuple[str, dict]:
    """(the table's row, the record's row) of one family."""
    from depthscope.probes import capture
    from depthscope.probes.adapters import resolve

    t0 = time.perf_counter()
    try:
        model, what = build(args)
    except Exception as err:  # noqa: BLE001 - a row with the reason, not a crash
        why = f"build failed: {one_line(err)}"
        return f"| {name} | - | {why} | - | - | - | - | - |", {"family": name, "failed": why}
    try:
        model.eval()
        params = sum(p.numel() for p in model.parameters())
        ad = resolve(model)
        window = min(ad.ctx, args.ctx)
        toks = tokens_for(args.tokens, window, ad.vocab)
        per = max(1, args.chunk // window)

        def forward(chunk):
            with torch.no_grad():
                for b in chunk.split(args.batch):
                    ad.forward(model, b)

        def cap(chunk):
            return capture(model, chunk, batch_size=args.batch)

        def measure() -> dict:
            t_fwd, t_cap, traces = interleaved(toks, per, forward, cap)
            tr = traces[-1]
            return {
                "sources": int(tr.sizes["source"]),
                "consumers": int(tr.sizes["layer"]),
                "forward_seconds": t_fwd,
                "capture_seconds": t_cap,
                "max_residual_error": max(float(t["residual_error"].max()) for t in traces),
            }

        row = {"family": name, "model": what, "params": params, "window": window}
        row.update(median_run(measure, args.repeat))
        t_fwd, t_cap, err = row["forward_seconds"], row["capture_seconds"], row["max_residual_error"]
        return (
            f"| {name} | {what}; {params / 1e6:.2f}M params; window {window} | "
            f"{row['sources']} x {row['consumers']} | {t_fwd:.2f} | {t_cap:.2f} | "
            f"**{t_cap / t_fwd:.2f}** | {err:.1e} | {time.perf_counter() - t0:.0f} |"
        ), row
    except Exception as err:  # noqa: BLE001
        why = f"capture failed: {one_line(err)}"
        return f"| {name} | {what} | {why} | - | - | - | - | - |", {
            "family": name,
            "model": what,
            "failed": why,
        }


def causal_rows(name: str, args) -> list[str]:
    from depthscope.probes import capture
    from depthscope.probes.adapters import resolve

    rows = []
    try:
        model, _ = zoo(name)(args)
        model.eval()
        ad = resolve(model)
        ctx, vocab = min(ad.ctx, args.ctx), ad.vocab
    except Exception as err:  # noqa: BLE001
        return [f"| {name} | - | - | load failed: {one_line(err)} | - | - | - |"]
    options = [
        ("logits=True", dict(logits=True), args.causal_tokens, None),
        ('ablate="sources"', dict(ablate="sources"), args.causal_tokens, "ablation_effect"),
        ('ablate="cells"', dict(ablate="cells"), args.ablate_tokens, "ablation_effect_cell"),
    ]
    for label, kw, n_tokens, var in options:
        t0 = time.perf_counter()
        try:
            toks = tokens_for(n_tokens, ctx, vocab)
            per = max(1, args.chunk // ctx)

            def plain(chunk):
                return capture(model, chunk, batch_size=args.batch)

            def with_option(chunk, kw=kw):
                return capture(model, chunk, batch_size=args.batch, **kw)

            t_plain, t_opt, traces = interleaved(toks, per, plain, with_option)
            tr = traces[-1]
            extra = "0 (same forward)" if var is None else str(int(tr[var].notnull().sum()))
            rows.append(
                f"| {name} | {label} | {toks.numel()} | {extra} | {t_plain:.2f} | {t_opt:.2f} | "
                f"**{t_opt / t_plain:.2f}** | {time.perf_counter() - t0:.0f} |"
            )
        except Exception as err:  # noqa: BLE001
            rows.append(f"| {name} | {label} | {n_tokens} | failed: {one_line(err)} | - | - | - | - |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per family (default 8192)")
    ap.add_argument(
        "--causal-tokens",
        type=int,
        default=8192,
        help="tokens for logits=True and ablate='sources' (default 8192)",
    )
    ap.add_argument(
        "--ablate-tokens", type=int, default=1024, help="tokens for ablate='cells' (default 1024)"
    )
    ap.add_argument("--chunk", type=int, default=2048, help="tokens per interleaved chunk (default 2048)")
    ap.add_argument("--layers", type=int, default=8, help="blocks of the random models (default 8)")
    ap.add_argument("--d-model", type=int, default=64, help="width of the random models (default 64)")
    ap.add_argument(
        "--ctx", type=int, default=128, help="window length, at most a model's context (default 128)"
    )
    ap.add_argument("--vocab", type=int, default=256, help="vocabulary of the random models (default 256)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved timing runs per family (median)")
    ap.add_argument(
        "--family",
        action="append",
        default=[],
        help="only families whose name contains this (repeatable; default: all)",
    )
    ap.add_argument("--no-families", action="store_true", help="skip table 1")
    ap.add_argument("--no-causal", action="store_true", help="skip table 2")
    ap.add_argument("--json", default=None, help="the record (default docs/data/capture_families.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import warnings

    warnings.filterwarnings("ignore")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:
        pass

    start = time.perf_counter()
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, chunks of {args.chunk} "
        f"tokens, python {sys.version.split()[0]}"
    )
    if not args.no_families:
        print()
        print(
            f"1. Capture cost per family: {args.tokens} random tokens each; random models {args.layers} "
            f"blocks, d {args.d_model}, {HEAD_DIM}-dim heads, vocab {args.vocab}"
        )
        print()
        print(
            "| family | model | sources x consumers | forward (s) | capture (s) | capture / forward | "
            "max residual_error | wall (s) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        rows = []
        for name, installed, package, build in FAMILIES:
            if args.family and not any(f in name for f in args.family):
                continue
            if not installed():
                print(f"| {name} | - | skipped: {package} not installed | - | - | - | - | - |", flush=True)
                rows.append({"family": name, "failed": f"skipped: {package} not installed"})
                continue
            line, row = family_row(name, build, args)
            print(line, flush=True)
            rows.append(row)
        if args.json or not args.family:  # a subset of the families never replaces the full record
            keep = ("tokens", "chunk", "layers", "d_model", "ctx", "vocab", "batch", "threads", "repeat")
            settings = {k: getattr(args, k) for k in keep}
            path = record_write("capture_families", settings, rows, Path(args.json) if args.json else None)
            print(f"wrote {path}")
    if not args.no_causal:
        print()
        print(
            f"2. Causal options on the zoo checkpoints, against a plain capture of the same tokens "
            f"(logits / sources: {args.causal_tokens} tokens; cells: {args.ablate_tokens} tokens)"
        )
        print()
        print(
            "| checkpoint | option | tokens | ablated forwards per batch | plain capture (s) | "
            "with option (s) | option / plain | wall (s) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name in ("attnres", "standard"):
            for row in causal_rows(name, args):
                print(row, flush=True)
    print()
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
