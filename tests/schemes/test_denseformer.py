"""DenseFormer: identity at init, k x p weight selection, delta-basis unrolling, native matrix."""

from __future__ import annotations

import pytest
import torch

from depthscope.errors import ConfigError
from depthscope.schemes import consumers
from depthscope.schemes.base import build_options, get_scheme
from depthscope.schemes.denseformer import dwa_matrix, unroll_dwa
from tests.helpers import build, perturb, random_tokens, share_weights, tiny

KXP = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 5), (3, 2)]


def dense(dilation: int = 1, period: int = 1, n_layers: int = 6):
    return tiny("denseformer", {"dilation": dilation, "period": period}, n_layers=n_layers)


def perturbed(cfg, seed: int = 3):
    return perturb(build(cfg, dtype=torch.float64), 1.0, seed, match=".alpha")


@pytest.mark.parametrize("k,p", KXP)
def test_equals_standard_at_init(k, p):
    """alpha_{i,i} = 1, the rest 0: logits are exactly the standard model's (float64)."""
    cfg = dense(k, p)
    standard = build(tiny("standard", n_layers=6), dtype=torch.float64)
    model = share_weights(standard, build(cfg, seed=7, dtype=torch.float64))
    shared = set(standard.state_dict())
    assert {n for n in model.state_dict() if not n.endswith(".alpha")} == shared  # all else shared
    tokens = random_tokens(cfg)
    a, b = standard(tokens), model(tokens)
    torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert a.abs().max() > 0


@pytest.mark.parametrize("k,p", KXP)
def test_dilation_and_period_select_the_documented_weights(k, p):
    """A DWA exactly after blocks i with p | i, over X_j with j = i (mod k): floor(i/k) + 1 weights."""
    cfg = dense(k, p, n_layers=7)
    model = build(cfg)
    d = cfg.n_layers
    params = dict(model.named_parameters())
    expected_names = set()
    for i in range(1, d + 1):
        name = "readout_mix.alpha" if i == d else f"blocks.{i}.attn_mix.alpha"
        if i % p:
            assert name not in params
            continue
        expected_names.add(name)
        assert params[name].shape == (i // k + 1,)
        assert params[name].tolist() == [0.0] * (i // k) + [1.0]  # init: 1 on X_i, 0 elsewhere
    assert {n for n in params if "_mix" in n} == expected_names  # no other mixer parameters
    alpha = dwa_matrix(model)
    assert alpha.shape == (d, d + 1)
    for i in range(1, d + 1):
        has = ~torch.isnan(alpha[i - 1])
        cols = [j for j in range(d + 1) if i % p == 0 and j <= i and j % k == i % k]
        assert has.nonzero().flatten().tolist() == cols
        if cols:
            assert alpha[i - 1, i] == 1.0 and alpha[i - 1, cols[:-1]].abs().sum() == 0


def test_planted_weights_give_the_documented_average():
    """With planted alphas, the input of block 1 is alpha_0 X_0 + alpha_1 X_1, X_1 = x0 + attn_0 + mlp_0."""
    cfg = dense(1, 1, n_layers=3)
    model = build(cfg, dtype=torch.float64)
    with torch.no_grad():
        model.blocks[1].attn_mix.alpha.copy_(torch.tensor([0.5, -2.0]))
        model.blocks[2].attn_mix.alpha.copy_(torch.tensor([0.25, 0.0, 3.0]))
    _, cache = model.run_with_cache(random_tokens(cfg, pos=8))
    x0 = cache["hook_embed"]
    x1 = x0 + cache["blocks.0.hook_attn_out"] + cache["blocks.0.hook_mlp_out"]
    y1 = 0.5 * x0 - 2.0 * x1
    torch.testing.assert_close(cache["blocks.1.attn_mix.hook_in"], y1, rtol=1e-13, atol=0)
    x2 = y1 + cache["blocks.1.hook_attn_out"] + cache["blocks.1.hook_mlp_out"]
    h1 = y1 + cache["blocks.1.hook_attn_out"]
    torch.testing.assert_close(cache["blocks.1.mlp_mix.hook_in"], h1, rtol=1e-13, atol=0)
    torch.testing.assert_close(cache["blocks.2.attn_mix.hook_in"], 0.25 * x0 + 3.0 * x2, rtol=1e-13, atol=0)
    w = cache["blocks.1.attn_mix.hook_weights"][0, 0]
    assert w.tolist() == [0.5 - 2.0, -2.0, -2.0]  # embed, 0.attn, 0.mlp


def naive_unrolling(model) -> list[list[float]]:
    """Delta-basis rows computed independently: symbolic coefficients of every hidden state, in Python."""
    cfg = model.cfg
    k, p, d = cfg.options.dilation, cfg.options.period, cfg.n_layers
    n = 2 * d + 1

    def unit(s):
        return [1.0 if t == s else 0.0 for t in range(n)]

    def add(a, b, sa=1.0, sb=1.0):
        return [sa * x + sb * y for x, y in zip(a, b)]

    xs = [unit(0)]
    rows = []

    def dwa(i):
        if i == 0 or i % p:
            return xs[i]
        mixer = model.readout_mix if i == d else model.blocks[i].attn_mix
        js = [j for j in range(i + 1) if j % k == i % k]
        y = [0.0] * n
        for a, j in zip(mixer.alpha.tolist(), js, strict=True):
            y = add(y, xs[j], 1.0, a)
        return y

    for b in range(d):
        y = dwa(b)
        h = add(y, unit(2 * b + 1))
        rows += [y, h]
        xs.append(add(h, unit(2 * b + 2)))
    rows.append(dwa(d))
    return [row[: i + 1] for i, row in enumerate(rows)]


@pytest.mark.parametrize("k,p", [(1, 1), (2, 1), (2, 2), (4, 5), (3, 2)])
def test_hook_weights_equal_an_independent_unrolling(k, p):
    cfg = dense(k, p, n_layers=6)
    model = perturbed(cfg)
    _, cache = model.run_with_cache(random_tokens(cfg, pos=6))
    expected = naive_unrolling(model)
    matrix = unroll_dwa(dwa_matrix(model))
    for row, c in enumerate(consumers(cfg)):
        w = cache[c.hook_weights]
        want = torch.tensor(expected[row], dtype=torch.float64)
        assert w.shape == (2, 6, len(want))
        # static: the same for every token
        torch.testing.assert_close(w, want.expand_as(w), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(matrix[row, : len(want)], want, rtol=1e-12, atol=1e-12)
        assert torch.isnan(matrix[row, len(want) :]).all()  # unavailable sources are NaN
    assert any(abs(x - 1.0) > 1e-3 for row in expected for x in row)  # really moved from the standard


def test_unroll_of_the_initial_matrix_is_the_standard_residual():
    for k, p in KXP:
        matrix = unroll_dwa(dwa_matrix(build(dense(k, p))))
        n = matrix.shape[0]
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        assert (matrix[lower] == 1).all() and torch.isnan(matrix[~lower]).all()


def test_rows_without_dwa_are_nan_and_pass_through():
    """Period 2 at 3 blocks: DWA only after block 2; rows 1 and 3 are all NaN and pass X_i through."""
    model = perturbed(dense(1, 2, n_layers=3))
    alpha = dwa_matrix(model)
    assert torch.isnan(alpha[0]).all() and torch.isnan(alpha[2]).all()
    assert not torch.isnan(alpha[1, :3]).any()
    rows = unroll_dwa(alpha)
    assert not torch.isnan(rows[-1]).any()
    # the read-out reads X_3 = Y_2 + attn_2 + mlp_2: block 2's attention row (Y_2) plus two ones
    torch.testing.assert_close(rows[-1], torch.cat([rows[4, :5], torch.ones(2, dtype=torch.float64)]))
    # block 1's attention reads X_1 = x0 + attn_0 + mlp_0 unchanged: all ones
    assert rows[2, :3].tolist() == [1.0, 1.0, 1.0]
    assert (rows[4, :5] != 1).any()  # while Y_2 is a real average


@pytest.mark.parametrize("key,value", [("dilation", 0), ("period", -1), ("dilation", "0")])
def test_validate_rejects_non_positive(key, value):
    with pytest.raises(ConfigError, match=key):
        tiny("denseformer", {key: value})


def test_options_parse_from_strings():
    opts = build_options(get_scheme("denseformer"), {"dilation": "4", "period": "5"})
    assert (opts.dilation, opts.period) == (4, 5)


def test_dwa_matrix_needs_a_denseformer():
    with pytest.raises(ConfigError, match="denseformer"):
        dwa_matrix(build(tiny("standard")))


def test_dwa_weights_receive_gradients():
    model = build(dense(1, 1, n_layers=3)).train()
    model(random_tokens(model.cfg, pos=8)).pow(2).mean().backward()
    for name, p in model.named_parameters():
        if name.endswith(".alpha"):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
