"""Tiny random models of every model type in transformers' causal-LM mapping, for the tests and the
architecture sweep (``benchmarks/sweep_architectures.py``)."""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 128
# sizes a tiny model gets wherever its config has the key (its sub-configs too)
SMALL: dict[str, Any] = dict(
    hidden_size=64,
    n_embd=64,
    d_model=64,
    dim=64,
    embed_dim=64,
    n_embed=64,
    emb_dim=64,
    num_hidden_layers=4,
    n_layer=4,
    num_layers=4,
    n_layers=4,
    decoder_layers=4,
    encoder_layers=4,
    num_attention_heads=4,
    n_head=4,
    num_heads=4,
    n_heads=4,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rotary_dim=8,
    intermediate_size=128,
    n_inner=128,
    ffn_dim=128,
    d_ff=128,
    decoder_ffn_dim=128,
    encoder_ffn_dim=128,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    expert_intermediate_size=32,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    topk_group=1,
    n_group=1,
    vocab_size=VOCAB,
    n_words=VOCAB,
    vocab_size_per_layer_input=VOCAB,
    hidden_size_per_layer_input=8,
    max_position_embeddings=128,
    n_positions=128,
    n_ctx=128,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
    is_decoder=True,
)
# qwen4_exp's indexed (QSA) attention has no defaults for its indexer
QSA = dict(
    indexer_budget=8, indexer_compress_ratio=2, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16
)
HYBRID = ["linear_attention", "full_attention"] * 2  # hybrids: both kinds of layer in four
OVERRIDES: dict[str, dict[str, Any]] = {
    "gpt_neo": dict(attention_types=[[["global", "local"], 2]]),
    "mamba2": dict(head_dim=32, n_groups=1),
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1),
    "bamba": dict(attn_layer_indices=[1, 3]),
    "granitemoehybrid": dict(layer_types=HYBRID),
    "kimi_linear": dict(layer_types=HYBRID),
    "bailing_hybrid": dict(layer_group_size=2),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"] * 2),
    "zaya": dict(num_experts_per_tok=1),
    "qwen4_exp_text": QSA,
    "qwen4_exp": dict(text_config=QSA),
    "zamba2": dict(layers_block_type=["linear_attention", "hybrid"] * 2),
    "gemma4_assistant": dict(text_config=dict(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)),
    "reformer": dict(axial_pos_embds_dim=[32, 32], axial_pos_shape=[8, 16]),
    # the depth-mixing families: the sizes their own tests use (tests/families.py, test_inkling2.py)
    "inkling2_text": dict(
        unpadded_vocab_size=VOCAB,
        layer_types=["hybrid", "hybrid_sliding"] * 2,
        n_layers_per_attn_res_block=2,
        swa_head_dim=16,
        moe_intermediate_size=16,
        eos_token_id=None,
    ),
    "inkling2_loop_text": dict(
        unpadded_vocab_size=VOCAB, swa_head_dim=16, moe_intermediate_size=16, eos_token_id=None
    ),
    "gemma3n_text": dict(
        num_kv_shared_layers=0,
        layer_types=["sliding_attention", "full_attention"] * 2,
        activation_sparsity_pattern=[0.0] * 4,
        laurel_rank=4,
        intermediate_size=128,
        num_key_value_heads=1,
    ),
}


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """A tiny config of ``model_type``: ``SMALL`` sizes where it has the key, then ``OVERRIDES`` and
    ``overrides``."""
    from transformers import CONFIG_MAPPING

    return _shrunk(CONFIG_MAPPING[model_type], {**OVERRIDES.get(model_type, {}), **overrides})


def _shrunk(cls: type, extra: dict[str, Any]) -> Any:
    default = cls()
    keys = {**default.to_dict(), **dict.fromkeys(getattr(cls, "attribute_map", {}))}
    kw = {k: v for k, v in SMALL.items() if k in keys}
    if "kv_lora_rank" in keys:  # multi-head latent attention: as many key/value heads as queries
        kw["num_key_value_heads"] = kw.get("num_attention_heads", 4)
    for sub in getattr(cls, "sub_configs", {}):
        inner = getattr(default, sub, None)
        if hasattr(inner, "to_dict") and set(inner.to_dict()) & set(SMALL):
            kw[sub] = _shrunk(type(inner), extra.pop(sub, {})).to_dict()
    for k, v in keys.items():  # special token ids inside the small vocabulary
        if k.endswith("token_id") and isinstance(v, int) and v >= VOCAB:
            kw[k] = 1
        elif k.endswith("token_id") and isinstance(v, list):
            kw[k] = [x if x < VOCAB else 1 for x in v]
    return cls(**{**kw, **extra})


def tiny_model(model_type: str, max_params: int = 20_000_000, **overrides: Any) -> Any:
    """A random model of ``tiny_config`` (seed 0, eval mode) by ``AutoModelForCausalLM``; ValueError
    for one above ``max_params`` parameters (counted on the meta device first)."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(model_type, **overrides)
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    if n > max_params:
        raise ValueError(f"{n} parameters in the tiny config")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


# --- the layer-level oracle: plain hooks on the model's layers, nothing of depthscope -------------


def layer_values(model: Any, tokens: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]] | None:
    """(input, output) [batch, pos, d_model] in float64 of every layer of ``model`` that runs on
    ``tokens``, by its index: forward hooks on every ModuleList's modules, and the layers are the
    longest list whose modules that ran each took the previous one's output. None when there is no
    such list of single tensors of that shape (multi-stream models: their families' own tests
    check them).
    """
    seen: dict[tuple[int, int], list] = {}
    handles = []

    def pre(key):
        def hook(module, args, kwargs):
            seen.setdefault(key, []).append([args[0] if args else kwargs.get("hidden_states")])

        return hook

    def post(key):
        def hook(module, args, out):
            seen[key][-1].append(out[0] if isinstance(out, tuple) else out)

        return hook

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    for a, layers in enumerate(lists):
        for k, layer in enumerate(layers):
            handles.append(layer.register_forward_pre_hook(pre((a, k)), with_kwargs=True))
            handles.append(layer.register_forward_hook(post((a, k))))
    try:
        with torch.no_grad():
            model.eval()(tokens)
    finally:
        for h in handles:
            h.remove()
    best: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for a, layers in enumerate(lists):
        pairs = _chained({k: seen[(a, k)] for k in range(len(layers)) if (a, k) in seen}, tokens.shape)
        if pairs is not None and len(pairs) > len(best):
            best = {k: (x.double(), y.double()) for k, (x, y) in pairs.items()}
    return best or None


def _chained(ran: dict[int, list], shape: torch.Size) -> dict[int, list] | None:
    """The (input, output) of each module of a list that ran once, if each is one tensor
    [batch, pos, d] and each module's input is the previous one's output; else None."""
    if not ran or any(len(c) != 1 or len(c[0]) != 2 for c in ran.values()):
        return None
    pairs = {k: c[0] for k, c in ran.items()}
    if not all(
        isinstance(t, torch.Tensor) and t.shape == (*shape, t.shape[-1]) for p in pairs.values() for t in p
    ):
        return None
    ks = sorted(pairs)
    chained = all(torch.allclose(pairs[k][0], pairs[j][1], rtol=1e-6, atol=1e-7) for j, k in zip(ks, ks[1:]))
    return pairs if chained else None


def running_sum(trace: Any) -> bool:
    """Whether the trace reads a stream that is a running sum of its writes: every source enters
    every consumer that sees it with one static weight (a standard residual, scaled writes). Depth
    mixing (beam's 1/sqrt(K), a post-LN model's 1/sigma, per-token weights) is not one. A static weight
    of exactly 0 is a source not read (longcat_flash's shortcut MoE: written before the second
    half-layer's reads, which give it 0).
    """
    import numpy as np

    m = trace["mixing"].values
    same = (
        np.isnan(m)
        | (m == 0.0)
        | np.isclose(m, np.nanmax(np.where(np.isnan(m), -np.inf, m), axis=0), rtol=1e-6)
    )
    return bool(same.all() and np.nanmax(np.abs(trace["mixing_std"].values)) < 1e-9)


def oracle_errors(trace: Any, model: Any, tokens: torch.Tensor) -> dict[str, float] | None:
    """Largest absolute differences between a trace (captured on ``tokens`` with no skipped
    positions) and the layer-level oracle, or None where the oracle does not apply (a stream that is
    not a running sum of its writes, or not one tensor [batch, pos, d_model]).

    For every consumer that reads a layer boundary (the first row of each layer: the layer's
    input; the read-out: the last layer's output) with input h: ``rms`` is its input RMS against
    the oracle's; ``write`` the sum of the shares of block j's sources against
    <out_j - in_j, h> / |h|^2 (token sums) for every earlier layer j; ``embed`` the embedding
    sources' shares against <in_0, h> / |h|^2.
    """
    from depthscope.trace.labels import block_of

    if not running_sum(trace):
        return None
    values = layer_values(model, tokens)
    if values is None:
        return None
    blocks = [block_of(s) for s in trace["source"].values]
    share = trace["contribution_share"].fillna(0.0).values
    order = sorted(values)
    rows = {}  # the first consumer of each layer (its input) and the read-out (the last output)
    for r, lab in enumerate(trace["layer"].values):
        b = block_of(lab)
        key = "readout" if b == "readout" else int(b) if b.isdigit() else None
        if key is not None:
            rows.setdefault(key, r)
    x0 = values[order[0]][0]
    worst = {"rms": 0.0, "write": 0.0, "embed": 0.0}
    for i, r in rows.items():
        h = values[order[-1]][1] if i == "readout" else values[i][0]
        hh = float((h * h).sum())
        rms = float(h.pow(2).mean().sqrt())
        worst["rms"] = max(worst["rms"], abs(float(trace["input_rms"].values[r]) - rms) / rms)
        emb = sum(share[r, k] for k in range(len(blocks)) if blocks[k] == "embed")
        worst["embed"] = max(worst["embed"], abs(emb - float((x0 * h).sum()) / hh))
        for j in order:
            if i != "readout" and j >= i:
                break
            w = values[j][1] - values[j][0]
            got = sum(share[r, k] for k in range(len(blocks)) if blocks[k] == str(j))
            worst["write"] = max(worst["write"], abs(got - float((w * h).sum()) / hh))
    return worst
