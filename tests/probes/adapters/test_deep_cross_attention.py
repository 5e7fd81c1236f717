"""deep-cross-attention's DCAGPT captured directly: a tiny model trained a few steps, saved and
reloaded, against the GRN weights recomputed by hand from plain hooks on the package's modules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from deep_cross_attention import DCAGPT

from depthscope.probes import capture
from depthscope.probes.adapters import deep_cross_attention as family
from depthscope.probes.adapters import resolve

ARGS = dict(num_tokens=64, dim=32, depth=3, past_layers_k=1, dim_head=16, heads=2)
# select_layers with k = 1 by hand: the stack entries each GRN reads (0 = embedding, j + 1 = block j)
STACKS = {0: [0], 1: [0, 1], 2: [0, 2], "readout": [0, 3]}


def mixing_params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "grn" in n}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(reloaded model, tokens, how far the GRN parameters moved)."""
    torch.manual_seed(0)
    model = DCAGPT(**ARGS)
    before = mixing_params(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        ids = torch.randint(0, ARGS["num_tokens"], (4, 17), generator=g)
        loss = model(ids, return_loss=True)
        opt.zero_grad()
        loss.backward()
        opt.step()
    moved = {
        n: float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters() if n in before
    }
    path = tmp_path_factory.mktemp("dca") / "dca.pt"
    torch.save({"args": ARGS, "state_dict": model.state_dict()}, path)
    saved = torch.load(path, weights_only=True)
    reloaded = DCAGPT(**saved["args"])
    reloaded.load_state_dict(saved["state_dict"])
    tokens = torch.randint(0, ARGS["num_tokens"], (2, 16), generator=g)
    return reloaded.eval(), tokens, moved


@torch.no_grad()
def by_hand(model, tokens):
    """Per consumer: per-token delta-basis weights [tokens, source] (feature means), from the stacks the
    GRNs receive (forward pre-hooks) and their parameters, plus the dynamic part per stack entry.
    """
    stacks = {}
    handles = [
        blk.qkv_grn.register_forward_pre_hook(lambda m, a, i=i: stacks.__setitem__(i, a[0]))
        for i, blk in enumerate(model.dca_blocks)
    ]
    handles.append(
        model.final_grn.register_forward_pre_hook(lambda m, a: stacks.__setitem__("readout", a[0]))
    )
    model(tokens)
    for h in handles:
        h.remove()

    def grn(module, stack):  # -> (per-feature coefficients [o, entry, b, n, d], dynamic [o, entry, b, n])
        norm, linear = module.to_aggregate[0], module.to_aggregate[1]
        x = stack.double()
        eps = norm.eps if norm.eps is not None else torch.finfo(stack.dtype).eps
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm.weight.double()
        dynamic = torch.relu(normed @ linear.weight.double().T).permute(3, 0, 1, 2)
        return dynamic[..., None] + module.bias.double()[:, :, None, None, :], dynamic

    def to_sources(coef, stack_ids, n_blocks):  # coef [entry, b, n, d] -> [b*n, source] feature means
        cols = []
        for stack in [0] + [j + 1 for j in range(n_blocks) for _ in range(2)]:
            e = stack_ids.index(stack) if stack in stack_ids else None
            cols.append(coef[e].mean(-1).flatten() if e is not None else torch.zeros(coef[0, ..., 0].numel()))
        return torch.stack(cols, -1).double()

    out, dyn = {}, {}
    for i, blk in enumerate(model.dca_blocks):
        coef, dynamic = grn(blk.qkv_grn, stacks[i])
        for o, v in enumerate("qkv"):
            out[f"{i}.attn.{v}"] = to_sources(coef[o], STACKS[i], i)
            dyn[f"{i}.attn.{v}"] = dynamic[o].flatten(1).mean(-1)
        q = out[f"{i}.attn.q"]
        out[f"{i}.mlp"] = torch.cat([q, torch.ones(q.shape[0], 1, dtype=q.dtype)], -1)
    coef, dynamic = grn(model.final_grn, stacks["readout"])
    out["readout"] = to_sources(coef[0], STACKS["readout"], len(model.dca_blocks))
    dyn["readout"] = dynamic[0].flatten(1).mean(-1)
    return out, dyn


def test_training_moves_the_grn_parameters(trained):
    _, _, moved = trained
    assert moved["dca_blocks.2.qkv_grn.bias"] > 1e-3
    assert moved["dca_blocks.2.qkv_grn.to_aggregate.1.weight"] > 1e-3
    assert moved["final_grn.bias"] > 1e-3


def test_mixing_matches_the_grn_recomputed_by_hand(trained):
    model, tokens, _ = trained
    trace = capture(model, tokens)
    expected, dynamic = by_hand(model, tokens)
    assert list(trace.layer.values) == list(expected)
    assert float(trace.residual_error.max()) < 1e-4
    np.testing.assert_allclose(trace.contribution_share.sum("source").values, 1.0, atol=1e-6)
    for label, w in expected.items():
        row = trace.sel(layer=label)
        n = w.shape[1]
        np.testing.assert_allclose(row.mixing.values[:n], w.mean(0).numpy(), atol=1e-5, err_msg=label)
        np.testing.assert_allclose(row.mixing_std.values[:n], w.std(0, unbiased=False).numpy(), atol=1e-5)
        assert np.isnan(row.mixing.values[n:]).all()
        if label in dynamic:
            got = row.grn_weight.values
            np.testing.assert_allclose(got[: len(dynamic[label])], dynamic[label].numpy(), atol=1e-5)
    # select_layers dropped block 0 at block 2 and blocks 0 and 1 at the read-out: weight 0, not NaN
    assert (trace.mixing.sel(layer="2.attn.k", source=["0.attn", "0.mlp"]).values == 0).all()
    assert (
        trace.mixing.sel(layer="readout", source=["0.attn", "0.mlp", "1.attn", "1.mlp"]).values == 0
    ).all()
    assert (trace.mixing.sel(layer="1.mlp", source="1.attn").values == 1).all()


def test_static_natives_are_the_bias_means_and_the_selected_stack(trained):
    model, tokens, _ = trained
    trace = capture(model, tokens)
    bias = model.dca_blocks[2].qkv_grn.bias.detach().double().mean(-1)
    np.testing.assert_allclose(trace.grn_bias.sel(layer="2.attn.v").values, bias[2].numpy(), atol=1e-6)
    np.testing.assert_array_equal(trace.grn_stack.sel(layer="2.attn.q").values, STACKS[2])
    np.testing.assert_array_equal(trace.grn_stack.sel(layer="readout").values, STACKS["readout"])
    assert np.isnan(trace.grn_stack.sel(layer="0.attn.q").values[1])


def test_detection_finds_the_dca_modules(trained):
    model, _, _ = trained
    ad = resolve(model)
    assert ad.family == family.NAME and family.detect(model)
    assert [s.label for s in ad.sources] == ["embed", "0.attn", "0.mlp", "1.attn", "1.mlp", "2.attn", "2.mlp"]
    assert [c.n_sources for c in ad.consumers[:4]] == [1, 1, 1, 2]
    assert ad.attrs["scheme"] == "dca" and ad.attrs["label"] == "deep-cross-attention 0.1.1: dca k=1"
