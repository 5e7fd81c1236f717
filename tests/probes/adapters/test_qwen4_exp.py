"""Qwen4-Exp (transformers) through the qwen4_exp adapter: a tiny trained, saved and reloaded model
with PLE layers, its per-channel trace against a hand recomputation of the gated residual's
weights from plain hooks, unrolled by hand."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthscope.probes import capture

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB, N_LAYERS, STREAMS = 99, 3, 4
PLE = (0, 2)  # 0-based layers with a per-layer embedding (ple_layer_ids 1 and 3)


def tiny_config():
    from transformers.models.qwen4_exp import Qwen4ExpTextConfig

    return Qwen4ExpTextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        hc_count=STREAMS,
        hc_lowrank=8,
        layer_types=["linear_attention", "indexed_attention", "linear_attention"],
        ple_layer_ids=[i + 1 for i in PLE],
        ple_embed_dim=32,
        ngram_vocab_size_base=101,
        heads_per_ngram=2,
        make_ngram_vocab_size_divisible_by=8,
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=16,
        indexer_budget=8,
        indexer_compress_ratio=4,
        eos_token_id=1,
    )


def tokens(n=4, pos=24, seed=1):
    return torch.randint(2, VOCAB, (n, pos), generator=torch.Generator().manual_seed(seed))


def mixing_parameters(model) -> dict[str, torch.Tensor]:
    keep = ("hyper_connection", "ple.")
    return {k: v.detach().clone() for k, v in model.named_parameters() if any(s in k for s in keep)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Random init with the gate projections spread (so the read gates are far from 1/2 and vary
    by channel and token), 6 AdamW steps on random tokens, saved and reloaded with the
    transformers class."""
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen4_exp import Qwen4ExpForCausalLM

    torch.manual_seed(0)
    model = Qwen4ExpForCausalLM(tiny_config())
    spread = {"input_mix_weight_down": 0.3, "input_mix_weight_up": 1.0, "block_inject_weight": 0.3}
    with torch.no_grad():
        for name, p in model.named_parameters():
            for key, std in spread.items():
                if f".{key}." in name:
                    p.normal_(0.0, std)
    before = mixing_parameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(6):
        x = tokens(4, 24, seed=100 + step)
        opt.zero_grad()
        model(x, labels=x).loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("qwen4") / "tiny-qwen4"
    model.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path).eval(), before


def test_training_moved_the_mixing_parameters(trained):
    model, before = trained
    after = mixing_parameters(model)
    hc = [k for k in after if "hyper_connection" in k]
    assert len(hc) == 4 * 2 * N_LAYERS + 3  # hc_norm, down, up, inject per sublayer; the mixer has no inject
    moved = [k for k in after if float((after[k] - before[k]).abs().max()) > 1e-3]
    assert set(hc) <= set(moved), sorted(set(hc) - set(moved))
    assert {f"model.layers.{i}.ple.conv1d.weight" for i in PLE} <= set(moved)  # zero at init, now not


def hand_weights(model, toks):
    """Per consumer, the per-token per-channel weights [batch, pos, source, d_model] over the
    sources, recomputed in float64 from plain hooks (the gate re-run through the module's own
    linear layers) and unrolled by hand; and the read gates, PLE gates and inject gates seen."""
    seen = []

    def record(name):
        return lambda module, args, out: seen.append((name.rsplit(".", 1)[-1], module, args[0], out))

    handles = []
    for name, m in model.named_modules():
        ple_part = ".ple." in name and name.rsplit(".", 1)[-1] in ("value_proj", "norm_key", "norm_query")
        if ple_part or type(m).__name__ in ("Qwen4ExpTextGatedResidual", "Qwen4ExpTextPLELayer"):
            handles.append(m.register_forward_hook(record(name)))
    try:
        with torch.no_grad():
            model(toks)
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        return _unroll(seen, model.config, toks.shape)


def _unroll(seen, cfg, shape):
    n, d = cfg.hc_count, cfg.hidden_size
    coef = torch.ones(*shape, n, 1, dtype=torch.float64)  # stream s holds sum_j coef[s, j] v_j
    rows, gates, ple_gates, inject = [], [], [], []
    held = {}
    for name, module, x, out in seen:
        kind = type(module).__name__
        if name in ("value_proj", "norm_key", "norm_query"):
            held[name] = out.double()
        elif kind == "Qwen4ExpTextPLELayer":
            key, query = held["norm_key"], held["norm_query"]
            score = (key.unflatten(-1, (n, d)) * query.unflatten(-1, (n, d))).sum(-1) / math.sqrt(d)
            sigma = torch.sigmoid(score.sign() * score.abs().clamp_min(1e-6).sqrt())
            ple_gates.append(sigma)
            one_hot = torch.eye(n, dtype=torch.float64).expand(*shape, n, n)  # [.., stream, conv source]
            coef = torch.cat([coef, sigma.unsqueeze(-1), one_hot], dim=-1)
        else:
            h = x.double().unflatten(-1, (n, d))
            rms = (h.pow(2).mean(-1, keepdim=True) + module.hc_norm.eps).sqrt()
            gain = 1 + module.hc_norm.weight.double().view(n, d)
            normed = (h / rms * gain).flatten(-2)
            down = F.linear(normed, module.input_mix_weight_down.weight.double())
            gate = torch.sigmoid(F.linear(F.silu(down / n), module.input_mix_weight_up.weight.double()))
            a = gate.unflatten(-1, (n, d)) * gain / rms / n  # [batch, pos, stream, d_model]
            gates.append(gate.unflatten(-1, (n, d)))
            rows.append(torch.einsum("bpsc,bpsj->bpjc", a, coef))
            if module.block_inject_weight is not None:
                inj = 2 * torch.sigmoid(F.linear(normed, module.block_inject_weight.weight.double()) / n)
                inject.append(inj)
                coef = torch.cat([coef, inj.unsqueeze(-1)], dim=-1)
    return rows, gates, ple_gates, inject


def test_mixing_equals_the_hand_recomputation(trained):
    model, _ = trained
    toks = tokens()
    trace = capture(model, toks, batch_size=2, skip_positions=0)
    rows, gates, ple_gates, inject = hand_weights(model, toks)
    sources = list(trace["source"].values)
    ple = ["0.ple", *(f"0.ple_conv.{s}" for s in range(STREAMS))]
    assert sources[:7] == ["embed", *ple, "0.attn"] and sources[-7:-2] == [p.replace("0.", "2.") for p in ple]
    assert trace.sizes["source"] == 1 + 2 * N_LAYERS + len(PLE) * (1 + STREAMS)
    assert len(rows) == trace.sizes["layer"] == 2 * N_LAYERS + 1
    for label, w in zip(trace["layer"].values, rows):
        per_token = w.mean(-1).flatten(0, 1)  # channel mean, like the trace
        n = per_token.shape[-1]
        np.testing.assert_allclose(
            trace["mixing"].sel(layer=label)[:n], per_token.mean(0), rtol=1e-5, err_msg=label
        )
        np.testing.assert_allclose(
            trace["mixing_std"].sel(layer=label)[:n], per_token.std(0, correction=0), rtol=1e-4, atol=1e-7
        )
    assert float(trace["residual_error"].max()) < 1e-4
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)
    # the n-gram sources are real: the convolution (zero at init) and the gated value both contribute
    assert float(trace["source_rms"].sel(source="2.ple_conv.1")) > 1e-4
    assert float(abs(trace["contribution_share"].sel(layer="readout", source="2.ple"))) > 1e-6
    # natives: PLE gates on the attention row after each PLE, inject gates per sublayer
    for i, sigma in zip(PLE, ple_gates):
        np.testing.assert_allclose(trace["ple_gate"].sel(layer=f"{i}.attn"), sigma.mean((0, 1)), rtol=1e-5)
    assert trace["ple_gate"].sel(layer="1.attn").isnull().all()
    np.testing.assert_allclose(trace["inject_gate"].sel(layer="1.mlp"), inject[3].mean((0, 1)), rtol=1e-5)
    assert trace["inject_gate"].sel(layer="readout").isnull().all()
    for label, gate in zip(trace["layer"].values, gates):
        np.testing.assert_allclose(trace["read_gate"].sel(layer=label), gate.mean((0, 1, 3)), rtol=1e-5)
    assert min(float(g.std()) for g in gates) > 0.05  # per-channel gates, far from a constant 1/2
    assert trace.attrs["family"] == "qwen4_exp" and trace.attrs["scheme"] == "gated-streams"
    assert "qwen4_exp_text (tiny-qwen4)" in trace.attrs["label"]


def test_the_multimodal_class_is_read_through_its_language_model():
    """``qwen4_exp`` (Qwen4ExpForConditionalGeneration) on text: the same adapter, prefix
    ``model.language_model.``."""
    from transformers.models.qwen4_exp import Qwen4ExpConfig, Qwen4ExpForConditionalGeneration

    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32)
    model = Qwen4ExpForConditionalGeneration(
        Qwen4ExpConfig(text_config=tiny_config().to_dict(), vision_config=vision)
    )
    assert model.config.model_type == "qwen4_exp"
    trace = capture(model, tokens(2, 16), skip_positions=0)
    assert trace.attrs["family"] == "qwen4_exp" and trace.sizes["source"] == 17
    assert float(trace["residual_error"].max()) < 1e-4
