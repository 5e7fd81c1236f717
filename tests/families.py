"""One small model of every family depthscope reads, for the tests and the benchmarks.

Each builder takes the sizes (``args``: d_model, layers, vocab, ctx; heads of 16) and returns
(model, description). ``FAMILIES`` lists (family, installed?, package, builder). Random weights
from ``torch.manual_seed(0)``; the zoo entries load the bundled checkpoints.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

ZOO = Path(__file__).resolve().parents[1] / "depthscope" / "zoo"
HEADS, HEAD_DIM = 4, 16


# --- small models, one per family ---------------------------------------------------------------


def zoo(name: str, at_width: bool = False) -> Callable:
    """The bundled checkpoint ``name``; with ``at_width``, where ``args.d_model`` is not its width, a
    model of the same configuration at that width (d_mlp 4x), random from seed 0: the same reader,
    at the size the other families are measured at (``benchmarks/capture_families.py``).
    """

    def build(args):
        import dataclasses

        import depthscope
        from depthscope.schemes import DepthModel

        model = depthscope.load(ZOO / f"{name}.safetensors")
        c = model.cfg
        if at_width and args.d_model != c.d_model:
            c = dataclasses.replace(c, d_model=args.d_model, d_mlp=4 * args.d_model)
            torch.manual_seed(0)
            model = DepthModel(c).eval()
            return model, f"zoo {name} configuration, random: {c.n_layers} blocks, d {c.d_model}, ctx {c.ctx}"
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


def glm5_next(args):
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    torch.manual_seed(0)
    n = args.layers
    text = dict(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=2 * args.d_model,
        moe_intermediate_size=args.d_model,
        num_hidden_layers=n,
        num_attention_heads=args.d_model // HEAD_DIM,
        num_key_value_heads=args.d_model // HEAD_DIM,
        n_routed_experts=4,
        num_experts_per_tok=2,
        kv_lora_rank=16,
        q_lora_rank=16,
        v_head_dim=HEAD_DIM,
        qk_nope_head_dim=HEAD_DIM,
        index_topk=16,
        index_head_dim=HEAD_DIM,
        index_n_heads=2,
        index_kpool=4,
        linear_head_dim=HEAD_DIM,
        linear_num_heads=2,
        max_position_embeddings=args.ctx,
        mlp_layer_types=cycle(["dense", "sparse"], n),
        layer_types=cycle(["linear_attention", "indexed_attention"], n),
        pad_token_id=0,
    )
    vision = dict(depth=1, hidden_size=16, num_heads=2, out_hidden_size=args.d_model, intermediate_size=16)
    model = Glm5NextForConditionalGeneration(Glm5NextConfig(text_config=text, vision_config=vision))
    return (
        model,
        f"Glm5NextForConditionalGeneration random, mHC 4 streams, KDA + MLA: {n} layers, d {args.d_model}",
    )


def hy_v4(args):
    from transformers import HYV4Config, HYV4ForCausalLM

    torch.manual_seed(0)
    n = args.layers
    cfg = HYV4Config(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=2 * args.d_model,
        moe_intermediate_size=args.d_model,
        num_hidden_layers=n,
        num_attention_heads=args.d_model // HEAD_DIM,
        num_key_value_heads=args.d_model // HEAD_DIM,
        head_dim=HEAD_DIM,
        n_routed_experts=4,
        num_experts_per_tok=2,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_nope_head_dim=HEAD_DIM,
        qk_rope_head_dim=8,
        v_head_dim=HEAD_DIM,
        index_topk=8,
        index_head_dim=HEAD_DIM,
        index_n_heads=2,
        max_position_embeddings=args.ctx,
        mlp_layer_types=cycle(["dense", "sparse"], n),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return HYV4ForCausalLM(
        cfg
    ), f"HYV4ForCausalLM random, 4 streams without comb: {n} layers, d {args.d_model}"


def gemma3n(args):
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    torch.manual_seed(0)
    n = args.layers
    cfg = Gemma3nTextConfig(
        vocab_size=args.vocab,
        vocab_size_per_layer_input=args.vocab,
        hidden_size=args.d_model,
        hidden_size_per_layer_input=8,
        intermediate_size=2 * args.d_model,
        num_hidden_layers=n,
        num_attention_heads=args.d_model // HEAD_DIM,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        laurel_rank=4,
        num_kv_shared_layers=0,
        layer_types=cycle(["sliding_attention", "full_attention"], n),
        activation_sparsity_pattern=[0.0] * n,
        sliding_window=8,
        max_position_embeddings=args.ctx,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return Gemma3nForCausalLM(
        cfg
    ), f"Gemma3nForCausalLM random, AltUp 4 streams, LAuReL: {n} layers, d {args.d_model}"


def inkling2(args):
    from transformers import Inkling2ForCausalLM

    from tests.probes.adapters.test_inkling2 import text_config

    torch.manual_seed(0)
    return Inkling2ForCausalLM(text_config()).eval(), "Inkling2ForCausalLM random (float32 only)"


def has_transformers(name: str) -> bool:
    return importlib.util.find_spec(f"transformers.models.{name}") is not None


# (family, needs: a check that the package is installed and its name, builder). Not here: inkling2,
# whose MoE router casts its input to float32 against its own weight, so it cannot run in float64
# (tests/probes/adapters/test_inkling2.py checks it in float32)
FAMILIES: list[tuple[str, Callable[[], bool], str, Callable]] = [
    ("depthscope standard", lambda: True, "-", zoo("standard", at_width=True)),
    ("depthscope attnres", lambda: True, "-", zoo("attnres", at_width=True)),
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
    ("glm5_next", lambda: has_transformers("glm5_next"), "transformers", glm5_next),
    ("hy_v4", lambda: has_transformers("hy_v4"), "transformers", hy_v4),
    ("gemma3n", lambda: has_transformers("gemma3n"), "transformers", gemma3n),
]


def sizes(d_model: int = 32, layers: int = 2, vocab: int = 64, ctx: int = 32) -> SimpleNamespace:
    """The ``args`` every builder takes."""
    return SimpleNamespace(d_model=d_model, layers=layers, vocab=vocab, ctx=ctx)


# one small model per registered family name (the family contract test: tests/probes/adapters/
# test_family_contract.py)
BY_FAMILY: dict[str, Callable] = {
    "depthscope": zoo("standard"),
    "transformer-lens": bridge,
    "beam": beam,
    "deepseek_v4": deepseek_v4,
    "gemma3n": gemma3n,
    "glm5_next": glm5_next,
    "hy_v4": hy_v4,
    "inkling2": inkling2,
    "post-ln": bert,
    "qwen4_exp": qwen4_exp,
    "attn-res": attn_res,
    "deep-cross-attention": dca,
    "x-transformers": x_transformers_hc,
    "huggingface": hf_llama,
    "hyper-connections": hyper_conn,
}
