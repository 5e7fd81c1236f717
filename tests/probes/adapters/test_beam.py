"""Beam (transformers) through the beam adapter: a tiny trained, saved and reloaded model whose
depth-scaled residual gives every source exactly 1/sqrt(K) at a consumer of depth K, checked
against per-token weights solved from plain hooks on the model's own modules."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from depthscope.probes import capture

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB, N_LAYERS = 99, 3


def tiny_config():
    from transformers import BeamConfig

    return BeamConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=8,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        mlp_layer_types=["dense", "sparse", "dense"],
        layer_types=["sliding_attention", "full_attention", "full_attention"],
    )


def tokens(n=4, pos=24, seed=1):
    return torch.randint(2, VOCAB, (n, pos), generator=torch.Generator().manual_seed(seed))


def sandwich_gains(model) -> dict[str, torch.Tensor]:
    """The post-norm gains: what scales each write (Beam has no learned mixing parameter)."""
    keep = ("post_attention_layernorm", "post_feedforward_layernorm")
    return {k: v.detach().clone() for k, v in model.named_parameters() if any(s in k for s in keep)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Random init, 6 AdamW steps on random tokens, saved and reloaded with the transformers class."""
    from transformers import AutoModelForCausalLM, BeamForCausalLM

    torch.manual_seed(0)
    model = BeamForCausalLM(tiny_config())
    before = sandwich_gains(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(6):
        x = tokens(4, 24, seed=100 + step)
        opt.zero_grad()
        model(x, labels=x).loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("beam") / "tiny-beam"
    model.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path).eval(), before


def test_training_moved_the_sandwich_gains_and_the_counting_is_the_documented_one(trained):
    model, before = trained
    after = sandwich_gains(model)
    assert len(after) == 2 * N_LAYERS
    assert all(float((after[k] - before[k]).abs().max()) > 1e-3 for k in after)
    # the module docstring's statement: attention of layer l adds with k = 2(l + 1), its MLP k + 1
    counted = [(layer.attn_residual_add_idx, layer.mlp_residual_add_idx) for layer in model.model.layers]
    assert counted == [(2 * (i + 1), 2 * (i + 1) + 1) for i in range(N_LAYERS)]


def solved_weights(model, toks):
    """Per consumer, per-token weights [tokens, n] over the sources written before it, solved by
    least squares from plain hooks (sources: the embedding and the post-norm outputs; consumers:
    the pre-norm inputs and the final norm's input), with the residual of the solve."""
    events = []

    def record(kind, read_input):
        def hook(module, args, out):
            events.append((kind, (args[0] if read_input else out).double()))

        return hook

    m = model.model
    plan = [(m.embed_tokens, "source", False), (m.norm, "consumer", True)]
    for layer in m.layers:
        plan += [
            (layer.input_layernorm, "consumer", True),
            (layer.post_attention_layernorm, "source", False),
            (layer.pre_feedforward_layernorm, "consumer", True),
            (layer.post_feedforward_layernorm, "source", False),
        ]
    handles = [mod.register_forward_hook(record(kind, inp)) for mod, kind, inp in plan]
    try:
        with torch.no_grad():
            model(toks)
    finally:
        for h in handles:
            h.remove()
    values, rows, worst = [], [], 0.0
    for kind, t in events:
        if kind == "source":
            values.append(t.flatten(0, 1))
            continue
        v = torch.stack(values, dim=-1)  # [tokens, d_model, n]
        h = t.flatten(0, 1).unsqueeze(-1)
        w = torch.linalg.lstsq(v, h).solution.squeeze(-1)  # [tokens, n]
        worst = max(worst, float((v @ w.unsqueeze(-1) - h).norm() / h.norm()))
        rows.append(w)
    return rows, worst


def test_every_cell_is_one_over_sqrt_depth(trained):
    model, _ = trained
    toks = tokens()
    trace = capture(model, toks, batch_size=2, skip_positions=0)
    depth = trace["layer_depth"]
    assert list(depth.values) == list(range(1, 2 * N_LAYERS + 2))
    m = trace["mixing"]
    avail = m.notnull()
    assert (avail.sum("source") == depth).all()  # consumer at depth K reads K sources
    np.testing.assert_allclose(
        m.where(avail, 0.0), (1.0 / np.sqrt(depth)).where(avail, 0.0), atol=1e-6, rtol=0
    )
    assert float(trace["mixing_std"].max()) < 1e-7  # static
    assert float(trace["residual_error"].max()) < 1e-4
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)
    # independent: the weights solved per token from the model's own tensors
    rows, worst = solved_weights(model, toks)
    assert worst < 1e-5 and len(rows) == trace.sizes["layer"]
    for label, w in zip(trace["layer"].values, rows):
        n = w.shape[-1]
        np.testing.assert_allclose(trace["mixing"].sel(layer=label)[:n], w.mean(0), atol=1e-5, err_msg=label)
        np.testing.assert_allclose(
            trace["mixing_std"].sel(layer=label)[:n], w.std(0, correction=0), atol=1e-5
        )
        np.testing.assert_allclose(w, 1.0 / math.sqrt(n), atol=1e-5)
    k = trace["residual_add_idx"]
    assert np.isnan(float(k[0])) and list(k.values[1:]) == list(range(2, 2 * N_LAYERS + 2))
    np.testing.assert_allclose(trace["branch_scale"][1:], 1.0 / np.sqrt(k[1:]))
    np.testing.assert_allclose(trace["residual_scale"][1:] ** 2 + trace["branch_scale"][1:] ** 2, 1.0)
    assert trace.attrs["scheme"] == "depth-scaled" and "beam (tiny-beam)" in trace.attrs["label"]
