"""DeepSeek-V4 (transformers) through the deepseek_v4 adapter: a tiny trained, saved and reloaded
model, its trace against a hand unrolling of the mHC streams from plain hooks, comb's Sinkhorn
tolerance and the composite over depth."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from depthscope.probes import capture

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB, N_LAYERS = 99, 3


def tiny_config():
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        vocab_size=VOCAB,
        hidden_size=32,
        moe_intermediate_size=32,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        q_lora_rank=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        max_position_embeddings=64,
        sliding_window=8,
        o_groups=2,
        o_lora_rank=16,
        index_n_heads=2,
        index_head_dim=16,
        index_topk=4,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    )


def tokens(n=4, pos=24, seed=1):
    return torch.randint(0, VOCAB, (n, pos), generator=torch.Generator().manual_seed(seed))


def mixing_parameters(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "_hc." in k or "hc_head." in k}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Random init with the mixing biases spread (so comb is far from uniform), 6 AdamW steps,
    saved and reloaded with the transformers class."""
    from transformers import AutoModelForCausalLM, DeepseekV4ForCausalLM

    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(tiny_config())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_hc.base") or name.endswith("hc_head.hc_base"):
                p.normal_(0.0, 1.0)
            elif name.endswith("_hc.fn") or name.endswith("hc_head.hc_fn"):
                p.normal_(0.0, 0.1)
    before = mixing_parameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(6):
        x = tokens(4, 24, seed=100 + step)
        opt.zero_grad()
        model(x, labels=x).loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("dsv4") / "tiny-dsv4"
    model.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path).eval(), before


def test_training_moved_the_mixing_parameters(trained):
    model, before = trained
    after = mixing_parameters(model)
    assert set(after) == set(before) and len(after) == 6 * N_LAYERS + 3
    moved = [k for k in after if float((after[k] - before[k]).abs().max()) > 1e-3]
    assert len(moved) == len(after), sorted(set(after) - set(moved))


def hand_unrolling(model, toks):
    """Per consumer, per-token delta-basis weights [batch, pos, n] from plain forward hooks on the
    hyper-connections and the head (pre recomputed in float64, the streams unrolled by hand), and
    every comb matrix in execution order."""
    seen = []

    def record(module, args, out):
        seen.append((module, args[0], out if isinstance(out, tuple) else None))

    handles = [
        m.register_forward_hook(record)
        for m in model.modules()
        if type(m).__name__ in ("DeepseekV4HyperConnection", "DeepseekV4HyperHead")
    ]
    try:
        with torch.no_grad():
            model(toks)
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        return _unroll(seen, model.config.hc_mult, toks.shape)


def _unroll(seen, n, shape):
    coef = torch.ones(*shape, n, 1, dtype=torch.float64)  # stream s holds sum_j coef[s, j] v_j
    rows, combs = [], []
    for module, streams, out in seen:
        x = streams.flatten(2).double()
        x = x / (x.pow(2).mean(-1, keepdim=True) + module.input_norm.eps).sqrt()
        if out is None:  # the head
            z = x @ module.hc_fn.double().T
            pre = torch.sigmoid(z * module.hc_scale.double() + module.hc_base.double()) + module.eps
        else:
            z = (x @ module.fn.double().T)[..., :n]
            pre = torch.sigmoid(z * module.scale[0].double() + module.base[:n].double()) + module.hc_eps
        rows.append((pre.unsqueeze(-1) * coef).sum(2))
        if out is not None:
            post, comb = out[0].double(), out[1].double()
            combs.append(comb)
            mixed = torch.einsum("bpjk,bpjn->bpkn", comb, coef)  # h'_k = sum_j comb[j, k] h_j
            coef = torch.cat([mixed, post.unsqueeze(-1)], dim=-1)
    return rows, combs


def test_mixing_equals_the_hand_unrolling(trained):
    model, _ = trained
    toks = tokens()
    trace = capture(model, toks, batch_size=2, skip_positions=0)
    rows, _ = hand_unrolling(model, toks)
    assert list(trace["layer"].values) == [f"{i}.{k}" for i in range(N_LAYERS) for k in ("attn", "mlp")] + [
        "readout"
    ]
    assert len(rows) == trace.sizes["layer"] == 2 * N_LAYERS + 1
    for label, w in zip(trace["layer"].values, rows):
        n = w.shape[-1]
        flat = w.flatten(0, 1)
        np.testing.assert_allclose(
            trace["mixing"].sel(layer=label)[:n], flat.mean(0), rtol=1e-5, err_msg=label
        )
        np.testing.assert_allclose(
            trace["mixing_std"].sel(layer=label)[:n], flat.std(0, correction=0), rtol=1e-4, atol=1e-7
        )
    assert float(trace["mixing_std"].max()) > 0.05  # input-dependent weights, really varying over tokens
    assert float(trace["residual_error"].max()) < 1e-4
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)
    assert trace.attrs["family"] == "deepseek_v4" and trace.attrs["scheme"] == "mhc"
    assert (
        trace.attrs["label"].startswith("transformers ") and "deepseek_v4 (tiny-dsv4)" in trace.attrs["label"]
    )


def test_comb_is_doubly_stochastic_within_the_sinkhorn_tolerance_and_the_composite_is_bounded(trained):
    """The implementation ends its Sinkhorn rounds with a column normalisation (sum + hc_eps), so
    columns sum to 1 up to hc_eps and float32 rounding; rows to what hc_sinkhorn_iters rounds
    leave. A product of such matrices over depth keeps its row and column sums within (to first
    order) the sum of the per-matrix deviations from 1."""
    model, _ = trained
    toks = tokens()
    trace = capture(model, toks, batch_size=4, skip_positions=0)
    _, combs = hand_unrolling(model, toks)
    comb = torch.stack(combs)  # [consumer, batch, pos, stream_from, stream_to]
    row_err = float((comb.sum(-1) - 1).abs().max())
    col_err = float((comb.sum(-2) - 1).abs().max())
    eps = model.config.hc_eps
    assert col_err <= 2 * eps  # hc_eps in the denominator + float32 rounding
    # rows: what hc_sinkhorn_iters = 20 rounds leave; near-permutation combs converge slowly
    # (measured 1.35e-2 here, at one token of 0.mlp's comb; 4.9e-3 for 2.mlp, below 6e-4 for the rest)
    assert 1e-3 < row_err <= 2e-2
    assert trace.attrs["comb_row_error_max"] == pytest.approx(row_err, rel=1e-6)
    assert trace.attrs["comb_col_error_max"] == pytest.approx(col_err, rel=1e-3, abs=1e-9)
    composite = combs[0]
    for c in combs[1:]:
        composite = composite @ c  # source-row convention: stream s -> t through both
    sums = torch.cat([composite.sum(-1), composite.sum(-2)], dim=-1)
    gain_max, gain_min = float(sums.max()), float(sums.min())
    per_matrix = [float((c.sum(-1) - 1).abs().max() + (c.sum(-2) - 1).abs().max()) for c in combs]
    bound = sum(per_matrix)
    assert 1 - bound <= gain_min <= gain_max <= 1 + bound
    assert gain_max > 1 + 1e-5  # not trivially 1: the row deviations do accumulate
    assert trace.attrs["composite_gain_max"] == pytest.approx(gain_max, rel=1e-9)
    assert trace.attrs["composite_gain_min"] == pytest.approx(gain_min, rel=1e-9)
    # the native comb is the token mean of the hooked matrices, its rows and columns sum to 1
    np.testing.assert_allclose(
        trace["comb"].sel(layer="1.mlp"), comb[3].flatten(0, 1).mean(0), rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(trace["comb"].dropna("layer", how="all").sum("stream_to"), 1.0, atol=5e-3)
    assert (
        trace["pre"].sel(layer="readout").notnull().all()
        and trace["post"].sel(layer="readout").isnull().all()
    )
