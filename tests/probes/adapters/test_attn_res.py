"""attn-res's AttnResTransformer (full and block) captured directly: tiny models trained a few steps,
saved and reloaded, against the softmax over depth recomputed by hand from plain hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attn_res.main import AttnResMode, AttnResTransformer, TransformerConfig

from depthscope.probes import capture
from depthscope.probes.adapters import attn_res as family
from depthscope.probes.adapters import resolve

SIZE = dict(d_model=32, n_layers=8, n_heads=2, n_kv_heads=1, vocab_size=64, max_seq_len=16)
MODES = {
    "full": ("full", 1),
    "block-2": ("block", 2),
    "block-3": ("block", 3),
}  # block-3: 8 // 3 = 2 per block
LABELS = ["0.attn", "0.mlp", "1.attn", "1.mlp", "2.attn", "2.mlp", "3.attn", "3.mlp"]


def make(args: dict) -> AttnResTransformer:
    return AttnResTransformer(
        TransformerConfig(**{**args, "attn_res_mode": AttnResMode(args["attn_res_mode"])})
    )


@pytest.fixture(scope="module", params=list(MODES))
def trained(request, tmp_path_factory):
    """(variant, reloaded model, tokens, largest change of a pseudo-query)."""
    mode, blocks = MODES[request.param]
    args = {**SIZE, "attn_res_mode": mode, "n_blocks": blocks}
    torch.manual_seed(0)
    model = make(args)
    before = torch.stack([layer.attn_res.pseudo_query.detach().clone() for layer in model.layers])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        ids = torch.randint(0, SIZE["vocab_size"], (4, 16), generator=g)
        _, loss = model(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = torch.stack([layer.attn_res.pseudo_query.detach() for layer in model.layers])
    path = tmp_path_factory.mktemp("attnres") / "model.pt"
    torch.save({"args": args, "state_dict": model.state_dict()}, path)
    saved = torch.load(path, weights_only=True)
    reloaded = make(saved["args"])
    reloaded.load_state_dict(saved["state_dict"])
    tokens = torch.randint(0, SIZE["vocab_size"], (2, 16), generator=g)
    return request.param, reloaded.eval(), tokens, float((after - before).abs().max())


def members(model) -> list[list[list[int]]]:
    """The package's bookkeeping replayed: per sublayer, its entries as lists of sources (0 = embedding,
    j + 1 = output of sublayer j)."""
    cfg = model.cfg
    size = cfg.n_layers // cfg.n_blocks if cfg.attn_res_mode == AttnResMode.BLOCK else 1
    blocks, partial, out = [[0]], None, []
    for i in range(cfg.n_layers):
        out.append([list(b) for b in blocks] + ([list(partial)] if partial else []))
        if i > 0 and i % size == 0 and partial:
            blocks.append(partial)
            partial = None
        partial = (partial or []) + [i + 1]
    return out


@torch.no_grad()
def by_hand(model, tokens):
    """Per sublayer: (delta-basis weights [tokens, source], entry weights [tokens, entry])."""
    seen = {}
    handles = [
        layer.attn_res.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0]))
        for i, layer in enumerate(model.layers)
    ]
    model(tokens)
    for h in handles:
        h.remove()
    out = {}
    for i, entries in enumerate(members(model)):
        v = seen[i].double()  # [entry, batch, pos, d_model]
        keys = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + model.cfg.eps)
        logits = (keys * model.layers[i].attn_res.pseudo_query.double()).sum(-1)
        alpha = torch.softmax(logits, 0).flatten(1).T  # [tokens, entry]
        w = torch.zeros(alpha.shape[0], i + 1, dtype=torch.float64)
        for e, sources in enumerate(entries):
            for s in sources:
                w[:, s] = alpha[:, e]
        out[LABELS[i]] = (w, alpha)
    return out


def test_training_moves_the_pseudo_queries(trained):
    assert trained[3] > 1e-3


def test_mixing_matches_the_softmax_over_depth_by_hand(trained):
    variant, model, tokens, _ = trained
    trace = capture(model, tokens)
    assert float(trace.residual_error.max()) < 1e-4
    np.testing.assert_allclose(trace.contribution_share.sum("source").values, 1.0, atol=1e-6)
    for label, (w, alpha) in by_hand(model, tokens).items():
        row = trace.sel(layer=label)
        n = w.shape[1]
        np.testing.assert_allclose(row.mixing.values[:n], w.mean(0).numpy(), atol=1e-5, err_msg=label)
        np.testing.assert_allclose(row.mixing_std.values[:n], w.std(0, unbiased=False).numpy(), atol=1e-5)
        k = alpha.shape[1]
        np.testing.assert_allclose(row.attnres_alpha.values[:k], alpha.mean(0).numpy(), atol=1e-5)
        assert np.isnan(row.attnres_alpha.values[k:]).all()
        np.testing.assert_allclose(row.attnres_alpha.values[:k].sum(), 1.0, atol=1e-6)  # entries sum to 1
    # the package's final output is the plain sum of all sources: read-out weights exactly 1
    assert (trace.mixing.sel(layer="readout").values == 1).all()
    assert (trace.mixing_std.sel(layer="readout").values == 0).all()
    if variant == "full":
        np.testing.assert_allclose(trace.mixing.isel(layer=slice(0, -1)).sum("source"), 1.0, atol=1e-6)
    else:  # a block's weight counts once per member: rows sum to more than 1
        assert float(trace.mixing.sel(layer="3.mlp").sum()) > 1.1


def test_detection_finds_the_attnres_operators(trained):
    variant, model, _, _ = trained
    ad = resolve(model)
    assert ad.family == family.NAME and family.detect(model)
    assert [c.label for c in ad.consumers] == [*LABELS, "readout"]
    assert [s.label for s in ad.sources] == ["embed", *LABELS]
    assert ad.attrs["scheme"] == "attnres" and ad.attrs["label"] == f"attn-res 0.1.0: {variant}"


def test_a_model_without_attnres_reads_as_a_standard_residual():
    torch.manual_seed(0)
    model = make({**SIZE, "attn_res_mode": "none", "n_blocks": 1})
    trace = capture(model, torch.randint(0, SIZE["vocab_size"], (2, 16)))
    assert trace.attrs["scheme"] == "residual"
    assert (trace.mixing.fillna(1).values == 1).all() and float(trace.residual_error.max()) < 1e-4
