"""GLM-5-Next and Hunyuan-V4 (transformers) through the stream unrolling they share with DeepSeek-V4
(``streams.hyper_adapter``): on random and on perturbed mixing weights, each consumer's per-token
weights equal least squares of its input on the sources, both recorded by plain hooks on the
transformers modules; `depthscope capture DIR` on a saved model, its shares against the same
independent computation."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from depthscope.probes import capture
from tests.probes.adapters.lstsq import (
    assert_shares,
    cli_windows,
    compare,
    record,
    rows_of,
    save_byte_tokenizer,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB, N_LAYERS = 256, 3  # 256: a directory without a tokenizer reads text as bytes


def glm5_next():
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    text = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        kv_lora_rank=16,
        q_lora_rank=16,
        v_head_dim=16,
        qk_nope_head_dim=16,
        index_topk=16,
        index_head_dim=16,
        index_n_heads=2,
        index_kpool=4,
        linear_head_dim=16,
        linear_num_heads=2,
        max_position_embeddings=64,
        mlp_layer_types=["dense", "sparse", "sparse"],
        layer_types=["linear_attention", "indexed_attention", "linear_attention"],
        pad_token_id=0,
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        num_heads=2,
        out_hidden_size=32,
        intermediate_size=32,
        projection_intermediate_size=32,
    )
    return Glm5NextForConditionalGeneration(Glm5NextConfig(text_config=text, vision_config=vision))


def hy_v4():
    from transformers import HYV4Config, HYV4ForCausalLM

    cfg = HYV4Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        index_topk=8,
        index_head_dim=16,
        index_n_heads=2,
        max_position_embeddings=64,
        mlp_layer_types=["dense", "sparse", "sparse"],
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return HYV4ForCausalLM(cfg)


BUILDERS = {"glm5_next": (glm5_next, "model.language_model."), "hy_v4": (hy_v4, "model.")}


def tokens(n=2, pos=16, seed=1):
    return torch.randint(0, VOCAB, (n, pos), generator=torch.Generator().manual_seed(seed))


def perturb(model, seed=0):
    """Spread the hyper-connections' biases and projections: far from their initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("_hc.base", "hc_head.hc_base")):
                p.add_(torch.randn(p.shape, generator=g))
            elif name.endswith(("_hc.fn", "hc_head.hc_fn")):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(("_hc.scale", "hc_head.hc_scale")):
                p.fill_(1.0)
    return model


def independent(model, prefix: str, toks):
    """Per-token least-squares rows of every consumer, from plain hooks only."""
    taps = [("embed", f"{prefix}embed_tokens", "out"), ("readout.in", f"{prefix}norm", "in")]
    for i in range(N_LAYERS):
        layer = f"{prefix}layers.{i}"
        taps += [
            (f"{i}.attn", f"{layer}.self_attn", "out"),
            (f"{i}.mlp", f"{layer}.mlp", "out"),
            (f"{i}.attn.in", f"{layer}.input_layernorm", "in"),
            (f"{i}.mlp.in", f"{layer}.post_attention_layernorm", "in"),
        ]
    seen = {k: v[0] for k, v in record(model, toks, taps).items()}
    order = ["embed"] + [f"{i}.{k}" for i in range(N_LAYERS) for k in ("attn", "mlp")]
    inputs = {label: (f"{label}.in", n) for n, label in enumerate(order[1:] + ["readout"], start=1)}
    rows, resid = rows_of(seen, order, inputs)
    return rows, resid, seen, order, inputs


@pytest.fixture(scope="module", params=list(BUILDERS))
def family(request):
    torch.manual_seed(0)
    make, prefix = BUILDERS[request.param]
    return request.param, make().eval(), prefix


@pytest.mark.parametrize("perturbed", [False, True], ids=["random", "perturbed"])
def test_mixing_equals_least_squares_on_the_hooked_tensors(family, perturbed):
    name, model, prefix = family
    if perturbed:
        model = perturb(model)
    toks = tokens()
    trace = capture(model, toks, batch_size=1, skip_positions=0)
    rows, resid, *_ = independent(model, prefix, toks)
    assert resid < 1e-5  # every input is a combination of the hooked sources
    assert trace.attrs["family"] == name and float(trace["residual_error"].max()) < 1e-4
    assert compare(trace, rows) < 1e-5
    assert list(trace["layer"].values)[-1] == "readout" and trace.sizes["source"] == 2 * N_LAYERS + 1
    if perturbed:  # input-dependent weights, really varying over tokens
        assert float(trace["mixing_std"].max()) > 0.02
    if name == "glm5_next":  # the read-out is the mean of the streams, comb is doubly stochastic
        np.testing.assert_allclose(trace["pre"].sel(layer="readout"), 0.25, rtol=1e-6)
        np.testing.assert_allclose(trace["comb"].dropna("layer", how="all").sum("stream_to"), 1.0, atol=1e-2)
        assert trace.attrs["comb_col_error_max"] < 1e-5
    else:  # Hunyuan-V4 never mixes its streams: no comb, no Sinkhorn checks
        assert "comb" not in trace and "comb_row_error_max" not in trace.attrs
        assert trace["post"].notnull().sum() == 2 * N_LAYERS * 4


def test_capture_directory_shares_against_least_squares(family, tmp_path):
    """`depthscope capture DIR` (a byte-level tokenizer saved beside it), then the shares
    recomputed on the same windows from plain hooks and least squares."""
    from depthscope.cli import main
    from depthscope.trace import load_trace

    name, model, prefix = family
    perturb(model, seed=3).save_pretrained(tmp_path / name)
    save_byte_tokenizer(tmp_path / name)
    out = tmp_path / "t.nc"
    assert (
        main(["capture", str(tmp_path / name), "--out", str(out), "--tokens", "64", "--ctx", "16", "--quiet"])
        == 0
    )
    trace = load_trace(out)
    assert trace.attrs["family"] == name and trace.attrs["skip_positions"] == 1
    windows = cli_windows(tmp_path / name, 16, 64)
    rows, _, seen, order, inputs = independent(model, prefix, windows)
    assert_shares(trace, rows, seen, order, inputs, skip=1)
