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
   seconds. The sources x consumers of the trace and its largest ``residual_error`` (over chunks)
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
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ZOO = Path(__file__).resolve().parents[1] / "depthscope" / "zoo"
HEADS, HEAD_DIM = 4, 16


# --- small models, one per family ---------------------------------------------------------------


def zoo(name: str) -> Callable:
    def build(args):
        import depthscope

        model = depthscope.load(ZOO / f"{name}.safetensors")
        c = model.cfg
        return model, f"zoo {name}.safetensors: {c.n_layers} blocks, d {c.d_model}, ctx {c.ctx}"

    return build


def hf_llama(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=4 * args.d_model,
        num_hidden_layers=args.layers,
        num_attention_heads=args.d_model // HEAD_DIM,
        num_key_value_heads=2,
        max_position_embeddings=args.ctx,
    )
    return LlamaForCausalLM(cfg), f"LlamaForCausalLM random: {args.layers} layers, d {args.d_model}, GQA 2 kv"


def bert(args):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=4 * args.d_model,
        num_hidden_layers=args.layers,
        num_attention_heads=args.d_model // HEAD_DIM,
        max_position_embeddings=args.ctx,
    )
    return BertModel(cfg), f"BertModel random (post-LN): {args.layers} layers, d {args.d_model}"


def bridge(args):
    from transformer_lens import TransformerBridge, TransformerBridgeConfig

    cfg = TransformerBridgeConfig(
        d_model=args.d_model,
        d_head=HEAD_DIM,
        n_heads=args.d_model // HEAD_DIM,
        n_layers=args.layers,
        n_ctx=args.ctx,
        d_vocab=args.vocab,
        d_mlp=4 * args.d_model,
        act_fn="gelu",
        seed=0,
    )
    return TransformerBridge.boot_native(
        cfg
    ), f"boot_native GPT-2 style: {args.layers} layers, d {args.d_model}"


class HCNet(nn.Module):
    """embedding -> expand_stream -> (attention, MLP) blocks each wrapped by a HyperConnections
    module (``branch=``) -> reduce_stream -> norm -> unembed, as in the adapter's tests."""

    def __init__(self, args, streams: int = 4):
        import hyper_connections
        import torch.nn.functional as F

        super().__init__()
        dim, heads = args.d_model, args.d_model // HEAD_DIM

        class Attention(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(dim)
                self.qkv = nn.Linear(dim, 3 * dim)
                self.out = nn.Linear(dim, dim)

            def forward(self, x):
                q, k, v = self.qkv(self.norm(x)).unflatten(-1, (3, heads, -1)).permute(2, 0, 3, 1, 4)
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                return self.out(y.transpose(1, 2).flatten(-2))

        class FeedForward(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(
                    nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
                )

            def forward(self, x):
                return self.net(x)

        init, self.expand_stream, self.reduce_stream = (
            hyper_connections.get_init_and_expand_reduce_stream_functions(streams, dim=dim)
        )
        self.embed = nn.Embedding(args.vocab, dim)
        self.layers = nn.ModuleList(
            nn.ModuleList(
                [
                    init(branch=Attention(), layer_index=2 * i),
                    init(branch=FeedForward(), layer_index=2 * i + 1),
                ]
            )
            for i in range(args.layers)
        )
        self.norm = nn.RMSNorm(dim)
        self.unembed = nn.Linear(dim, args.vocab, bias=False)

    def forward(self, tokens):
        x = self.expand_stream(self.embed(tokens))
        for attn_hc, ff_hc in self.layers:
            x = ff_hc(attn_hc(x))
        return self.unembed(self.norm(self.reduce_stream(x)))


def hyper_conn(args):
    torch.manual_seed(0)
    return HCNet(args), f"user net, HC (dynamic), 4 streams: {args.layers} blocks, d {args.d_model}"


def dca(args):
    from deep_cross_attention import DCAGPT

    torch.manual_seed(0)
    model = DCAGPT(
        num_tokens=args.vocab,
        dim=args.d_model,
        depth=args.layers,
        past_layers_k=2,
        dim_head=HEAD_DIM,
        heads=args.d_model // HEAD_DIM,
    )
    return model, f"DCAGPT, past_layers_k 2: {args.layers} blocks, d {args.d_model}"


def attn_res(args):
    from attn_res.main import AttnResMode, AttnResTransformer, TransformerConfig

    torch.manual_seed(0)
    cfg = TransformerConfig(
        d_model=args.d_model,
        n_layers=2 * args.layers,  # the package counts sublayers
        n_heads=args.d_model // HEAD_DIM,
        n_kv_heads=2,
        vocab_size=args.vocab,
        max_seq_len=args.ctx,
        attn_res_mode=AttnResMode.FULL,
        n_blocks=1,
    )
    return AttnResTransformer(cfg), f"AttnResTransformer full: {args.layers} blocks, d {args.d_model}"


def x_transformers_hc(args):
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    model = TransformerWrapper(
        num_tokens=args.vocab,
        max_seq_len=args.ctx,
        attn_layers=Decoder(
            dim=args.d_model, depth=args.layers, heads=args.d_model // HEAD_DIM, num_residual_streams=4
        ),
    )
    return model, f"TransformerWrapper, hyper-connections 4 streams: {args.layers} blocks, d {args.d_model}"


def x_transformers_attnres(args):
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    model = TransformerWrapper(
        num_tokens=args.vocab,
        max_seq_len=args.ctx,
        attn_layers=Decoder(
            dim=args.d_model,
            depth=args.layers,
            heads=args.d_model // HEAD_DIM,
            attn_aggregated_residuals=True,
            attn_aggregated_residual_kwargs=dict(lora_rank=16),
        ),
    )
    return model, f"TransformerWrapper, AttentionResidual: {args.layers} blocks, d {args.d_model}"


def cycle(pattern: list[str], n: int) -> list[str]:
    return [pattern[i % len(pattern)] for i in range(n)]


def deepseek_v4(args):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(0)
    n = args.layers
    cfg = DeepseekV4Config(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        moe_intermediate_size=args.d_model,
        num_hidden_layers=n,
        num_attention_heads=args.d_model // HEAD_DIM,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        q_lora_rank=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        max_position_embeddings=args.ctx,
        sliding_window=32,
        o_groups=2,
        o_lora_rank=32,
        index_n_heads=2,
        index_head_dim=HEAD_DIM,
        index_topk=8,
        layer_types=cycle(
            ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"], n
        ),
        mlp_layer_types=["hash_moe"] + ["moe"] * (n - 1),
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    )
    model = DeepseekV4ForCausalLM(cfg)
    return model, f"DeepseekV4ForCausalLM random, mHC, 4 experts (2 active): {n} layers, d {args.d_model}"


def qwen4_exp(args):
    from transformers.models.qwen4_exp import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    torch.manual_seed(0)
    n = args.layers
    types = cycle(["linear_attention", "indexed_attention", "linear_attention"], n)
    linear = [i + 1 for i, t in enumerate(types) if t == "linear_attention"]  # 1-based; PLE needs linear
    cfg = Qwen4ExpTextConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        num_hidden_layers=n,
        num_attention_heads=args.d_model // HEAD_DIM,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        linear_key_head_dim=HEAD_DIM,
        linear_value_head_dim=HEAD_DIM,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        moe_intermediate_size=args.d_model,
        shared_expert_intermediate_size=args.d_model,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=args.ctx,
        hc_count=4,
        hc_lowrank=8,
        layer_types=types,
        ple_layer_ids=linear[::2],
        ple_embed_dim=32,
        ngram_vocab_size_base=101,
        heads_per_ngram=2,
        make_ngram_vocab_size_divisible_by=8,
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=HEAD_DIM,
        indexer_budget=32,
        indexer_compress_ratio=4,
        eos_token_id=1,
    )
    model = Qwen4ExpForCausalLM(cfg)
    return model, f"Qwen4ExpForCausalLM random, 4 streams, PLE, 4 experts: {n} layers, d {args.d_model}"


def beam(args):
    from transformers import BeamConfig, BeamForCausalLM

    torch.manual_seed(0)
    n = args.layers
    cfg = BeamConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=4 * args.d_model,
        num_hidden_layers=n,
        num_attention_heads=args.d_model // HEAD_DIM,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=args.ctx,
        sliding_window=32,
        moe_intermediate_size=args.d_model,
        num_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        mlp_layer_types=cycle(["dense", "sparse"], n),
        layer_types=cycle(["sliding_attention", "full_attention"], n),
    )
    model = BeamForCausalLM(cfg)
    return model, f"BeamForCausalLM random, 4 experts on odd layers: {n} layers, d {args.d_model}"


def has_transformers(name: str) -> bool:
    return importlib.util.find_spec(f"transformers.models.{name}") is not None


# (family, needs: a check that the package is installed and its name, builder)
FAMILIES: list[tuple[str, Callable[[], bool], str, Callable]] = [
    ("depthscope standard", lambda: True, "-", zoo("standard")),
    ("depthscope attnres", lambda: True, "-", zoo("attnres")),
    ("huggingface (llama)", lambda: has_transformers("llama"), "transformers", hf_llama),
    ("post-ln (bert)", lambda: has_transformers("bert"), "transformers", bert),
    (
        "transformer-lens bridge",
        lambda: importlib.util.find_spec("transformer_lens") is not None,
        "transformer-lens",
        bridge,
    ),
    (
        "hyper_connections",
        lambda: importlib.util.find_spec("hyper_connections") is not None,
        "hyper-connections",
        hyper_conn,
    ),
    (
        "deep_cross_attention",
        lambda: importlib.util.find_spec("deep_cross_attention") is not None,
        "deep-cross-attention",
        dca,
    ),
    ("attn_res", lambda: importlib.util.find_spec("attn_res") is not None, "attn-res", attn_res),
    (
        "x_transformers (hc)",
        lambda: importlib.util.find_spec("x_transformers") is not None,
        "x-transformers",
        x_transformers_hc,
    ),
    (
        "x_transformers (attnres)",
        lambda: importlib.util.find_spec("x_transformers") is not None,
        "x-transformers",
        x_transformers_attnres,
    ),
    ("deepseek_v4", lambda: has_transformers("deepseek_v4"), "transformers", deepseek_v4),
    ("qwen4_exp", lambda: has_transformers("qwen4_exp"), "transformers", qwen4_exp),
    ("beam", lambda: has_transformers("beam"), "transformers", beam),
]


# --- measurement -----------------------------------------------------------------------------------


def tokens_for(n_tokens: int, window: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (max(1, n_tokens // window), window), generator=g)


def interleaved(toks: torch.Tensor, per: int, first: Callable, second: Callable) -> tuple[float, float, list]:
    """Seconds of ``first`` and of ``second`` over the same chunks of ``per`` windows, alternating
    chunk by chunk (after one warm-up call of each on one window); ``second``'s results."""
    first(toks[:1])
    second(toks[:1])
    t_a = t_b = 0.0
    out = []
    for chunk in toks.split(per):
        t = time.perf_counter()
        first(chunk)
        t_a += time.perf_counter() - t
        t = time.perf_counter()
        out.append(second(chunk))
        t_b += time.perf_counter() - t
    return t_a, t_b, out


def one_line(err: BaseException) -> str:
    msg = " ".join(f"{type(err).__name__}: {err}".split()).replace("|", "/")
    return msg if len(msg) <= 240 else msg[:237] + "..."


def family_row(name: str, build: Callable, args) -> str:
    from depthscope.probes import capture
    from depthscope.probes.adapters import resolve

    t0 = time.perf_counter()
    try:
        model, what = build(args)
    except Exception as err:  # noqa: BLE001 - a row with the reason, not a crash
        return f"| {name} | - | build failed: {one_line(err)} | - | - | - | - | - |"
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

        t_fwd, t_cap, traces = interleaved(toks, per, forward, cap)
        tr = traces[-1]
        err = max(float(t["residual_error"].max()) for t in traces)
        return (
            f"| {name} | {what}; {params / 1e6:.2f}M params; window {window} | "
            f"{tr.sizes['source']} x {tr.sizes['layer']} | {t_fwd:.2f} | {t_cap:.2f} | "
            f"**{t_cap / t_fwd:.2f}** | {err:.1e} | {time.perf_counter() - t0:.0f} |"
        )
    except Exception as err:  # noqa: BLE001
        return f"| {name} | {what} | capture failed: {one_line(err)} | - | - | - | - | - |"


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
    ap.add_argument(
        "--family",
        action="append",
        default=[],
        help="only families whose name contains this (repeatable; default: all)",
    )
    ap.add_argument("--no-families", action="store_true", help="skip table 1")
    ap.add_argument("--no-causal", action="store_true", help="skip table 2")
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
        for name, installed, package, build in FAMILIES:
            if args.family and not any(f in name for f in args.family):
                continue
            if not installed():
                print(f"| {name} | - | skipped: {package} not installed | - | - | - | - | - |", flush=True)
                continue
            print(family_row(name, build, args), flush=True)
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
