"""Native weights in traces, and the DenseFormer unrolling checked after training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthscope.corpus import load_corpus
from depthscope.probes import capture
from depthscope.trace import stack_traces
from depthscope.train import TrainConfig, train
from tests.helpers import build, perturb, random_tokens, tiny


def unroll_by_hand(alphas: dict[int, list[float]], n_blocks: int, dilation: int) -> np.ndarray:
    """DenseFormer's DWA weights over block states, unrolled into embedding + sublayer outputs.

    Independent of the package: X_0 = embed; block b reads Y_b (DWA after block b, or X_b), adds
    its attention and MLP outputs; alphas[b] are the weights of DWA_b over X_j, j = b mod k ... b.
    """
    n_src = 2 * n_blocks + 1
    xs = [np.eye(n_src)[0]]
    rows = []

    def y(b):
        if b not in alphas:
            return xs[b]
        js = list(range(b % dilation, b + 1, dilation))
        return sum(a * xs[j] for a, j in zip(alphas[b], js))

    for b in range(n_blocks):
        h = y(b)
        rows.append(h.copy())
        h = h + np.eye(n_src)[2 * b + 1]
        rows.append(h.copy())
        xs.append(h + np.eye(n_src)[2 * b + 2])
    rows.append(y(n_blocks))
    out = np.array(rows)
    out[np.triu(np.ones_like(out, dtype=bool), 1)] = np.nan
    return out


@pytest.mark.parametrize("options", [{}, {"dilation": 2}])
def test_denseformer_trace_equals_hand_unrolling_after_training(options):
    cfg = tiny("denseformer", options)
    model = train(
        cfg, TrainConfig(steps=25, batch_size=4, lr=3e-2, eval_tokens=256), load_corpus(), progress=False
    )
    alphas = {}
    for b in range(1, cfg.n_layers + 1):
        mixer = model.readout_mix if b == cfg.n_layers else model.blocks[b].attn_mix
        if hasattr(mixer, "alpha"):
            alphas[b] = mixer.alpha.detach().double().tolist()
    assert any(abs(a[-1] - 1) > 1e-3 or any(abs(x) > 1e-3 for x in a[:-1]) for a in alphas.values())  # moved
    trace = capture(model, random_tokens(cfg, batch=2))
    expected = unroll_by_hand(alphas, cfg.n_layers, options.get("dilation", 1))
    np.testing.assert_allclose(trace["mixing"].values, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(trace["mixing_std"].values[~np.isnan(expected)], 0.0, atol=1e-6)
    for b, a in alphas.items():  # the native matrix holds the same numbers
        row = trace["dwa_alpha"].sel(dwa=b).values
        np.testing.assert_allclose(row[~np.isnan(row)], a, rtol=1e-6)


@pytest.mark.parametrize("scheme", ["hc", "mhc"])
def test_stream_matrices_are_token_means_of_the_hooks(scheme):
    cfg = tiny(scheme)
    model = perturb(build(cfg))
    tokens = random_tokens(cfg, batch=3)
    trace = capture(model, tokens, batch_size=2)
    _, cache = model.run_with_cache(tokens)
    for name, hook in (("hc_res", "hook_h_res"), ("hc_pre", "hook_h_pre"), ("hc_post", "hook_h_post")):
        for i in range(cfg.n_layers):
            for kind in ("attn", "mlp"):
                ref = cache[f"blocks.{i}.{kind}_mix.{hook}"].double().mean((0, 1)).numpy()
                np.testing.assert_allclose(
                    trace[name].sel(layer=f"{i}.{kind}").values, ref, rtol=1e-5, atol=1e-7
                )
    assert np.isnan(trace["hc_res"].sel(layer="readout")).all()
    if scheme == "mhc":  # token means of doubly stochastic matrices are doubly stochastic
        res = trace["hc_res"].drop_sel(layer="readout")
        np.testing.assert_allclose(res.sum("stream_to"), 1.0, atol=1e-3)
        np.testing.assert_allclose(res.sum("stream_from"), 1.0, atol=1e-3)


def test_ddl_gate_means_and_stacking_with_other_schemes():
    cfg = tiny("ddl")
    model = build(cfg)
    with torch.no_grad():
        for i in range(cfg.n_layers):
            model.blocks[i].mlp.gate.bias.fill_(0.5 * i)
    tokens = random_tokens(cfg, batch=2)
    trace = capture(model, tokens)
    _, cache = model.run_with_cache(tokens)
    for i in range(cfg.n_layers):
        assert trace["ddl_beta"].sel(layer=f"{i}.mlp").item() == pytest.approx(
            cache[f"blocks.{i}.mlp.hook_beta"].double().mean().item(), rel=1e-6
        )
    stacked = stack_traces([trace, capture(build(tiny("hc")), tokens), capture(build(tiny()), tokens)])
    assert (
        stacked["ddl_beta"].sel(scheme="hc").isnull().all()
        and stacked["hc_res"].sel(scheme="ddl").isnull().all()
    )
    assert stacked["hc_res"].sizes["stream_from"] == 4
