"""Hyper-Connections: standard residual at init, an independent re-implementation, the unrolling."""

from __future__ import annotations

import pytest
import torch

from depthscope.errors import ConfigError
from depthscope.schemes import consumers, sources
from depthscope.schemes._common import rms_norm
from depthscope.schemes.base import build_options, get_scheme
from tests.helpers import build, perturb, random_tokens, share_weights, tiny

MODES = ["dynamic", "static"]


def standard_like(model, n: int):
    """The standard model with the same shared weights, its final-norm eps divided by n^2.

    The read-out of n identical streams is n times the standard stream, and
    rmsnorm(n x, eps) = rmsnorm(x, eps / n^2): with that eps the logits must agree exactly.
    """
    std = share_weights(model, build(tiny("standard"), seed=99, dtype=torch.float64))
    std.ln_final.eps = model.ln_final.eps / n**2
    return std


def sublayer_sites(cfg):
    return [c for c in consumers(cfg) if c.site.kind != "readout"]


def mixer_hook(c, name: str) -> str:
    return c.hook_weights.replace("hook_weights", name)


def naive_unroll(cfg, cache) -> dict[str, torch.Tensor]:
    """Delta-basis weights from the native hooks, pair by pair: c[k, j] = B_j (prod A_r) A_m^k.

    A source j written with row vector v (over streams; the embedding: all ones) reaches
    consumer k as v A_r^(j+1) ... A_r^(k-1); the consumer reads it with weight (that) . A_m^(k),
    the read-out with its sum.
    """
    subs = sublayer_sites(cfg)
    pre = [cache[mixer_hook(c, "hook_h_pre")] for c in subs]
    res = [cache[mixer_hook(c, "hook_h_res")] for c in subs]
    post = [cache[mixer_hook(c, "hook_h_post")] for c in subs]
    out = {}
    for k, c in enumerate(consumers(cfg)):
        cols = []
        for j in range(k + 1):  # source j: embedding (j = 0) or the output of sublayer j - 1
            v = torch.ones_like(post[0]) if j == 0 else post[j - 1]
            for t in range(j, k):  # the carries of sublayers j .. k-1
                v = torch.einsum("bps,bpst->bpt", v, res[t])
            cols.append(v.sum(-1) if c.site.kind == "readout" else (v * pre[k]).sum(-1))
        out[c.label] = torch.stack(cols, dim=-1)
    return out


def hc_reference(model, tokens):
    """Hyper-connections written out stream by stream from the paper (arXiv 2409.19606).

    Returns the logits and, per sublayer, the matrices (A_m [b,p,n], A_r [b,p,n,n], B [b,p,n]).
    """
    n = model.cfg.options.streams
    dynamic = model.cfg.options.mode == "dynamic"
    x0 = model.embed(tokens)
    streams = [x0] * n
    mats = []
    for block in model.blocks:
        for kind in ("attn", "mlp"):
            mix = getattr(block, f"{kind}_mix")
            a_m = mix.a_m.expand(*x0.shape[:-1], n)
            a_r = mix.a_r.expand(*x0.shape[:-1], n, n)
            b = mix.b.expand(*x0.shape[:-1], n)
            if dynamic:
                normed = [rms_norm(h) * mix.norm_gain for h in streams]  # H_bar, per stream
                w_m, w_r, w_b = mix.w_dyn[0], mix.w_dyn[1 : n + 1], mix.w_dyn[n + 1]
                a_m = a_m + mix.s_alpha * torch.stack([torch.tanh(h @ w_m) for h in normed], -1)
                a_r = a_r + mix.s_alpha * torch.stack([torch.tanh(h @ w_r.T) for h in normed], -2)
                b = b + mix.s_beta * torch.stack([torch.tanh(h @ w_b) for h in normed], -1)
            h_in = sum(a_m[..., s, None] * streams[s] for s in range(n))
            out = getattr(block, kind)(h_in)
            streams = [
                sum(a_r[..., s, t, None] * streams[s] for s in range(n)) + b[..., t, None] * out
                for t in range(n)
            ]
            mats.append((a_m, a_r, b))
    return model.unembed(model.ln_final(sum(streams))), mats


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 3, 4])
def test_init_is_the_standard_residual(mode, n):
    """At init (B = 1, A_m = e_{k mod n}, A_r = I, W = 0) logits equal the standard model's (float64)."""
    model = build(tiny("hc", {"streams": n, "mode": mode}), dtype=torch.float64)
    tokens = random_tokens(model.cfg)
    ours, theirs = model(tokens), standard_like(model, n)(tokens)
    assert (ours - theirs).abs().max() <= 1e-12 * theirs.abs().max()


@pytest.mark.parametrize("mode", MODES)
def test_init_matrices_and_weights(mode):
    """Native hooks at init hold e_{k mod n}, I and 1; delta-basis weights are 1 (n at the read-out)."""
    n = 3
    cfg = tiny("hc", {"streams": n, "mode": mode})
    _, cache = build(cfg, dtype=torch.float64).run_with_cache(random_tokens(cfg, pos=8))
    for k, c in enumerate(sublayer_sites(cfg)):
        pre = cache[mixer_hook(c, "hook_h_pre")]
        assert pre.shape == (2, 8, n)
        torch.testing.assert_close(pre, torch.eye(n, dtype=pre.dtype)[k % n].expand_as(pre), rtol=0, atol=0)
        res = cache[mixer_hook(c, "hook_h_res")]
        assert res.shape == (2, 8, n, n)
        torch.testing.assert_close(res, torch.eye(n, dtype=res.dtype).expand_as(res), rtol=0, atol=0)
        assert (cache[mixer_hook(c, "hook_h_post")] == 1).all()
        assert (cache[c.hook_weights] == 1).all()
    assert (cache["readout_mix.hook_weights"] == n).all()


@pytest.mark.parametrize("mode", MODES)
def test_matches_paper_reference(mode):
    """Perturbed model: logits and every native matrix equal a stream-by-stream re-implementation."""
    cfg = tiny("hc", {"streams": 3, "mode": mode})
    model = perturb(build(cfg, dtype=torch.float64))
    tokens = random_tokens(cfg, pos=8)
    logits, cache = model.run_with_cache(tokens)
    ref_logits, mats = hc_reference(model, tokens)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-12)
    for c, (a_m, a_r, b) in zip(sublayer_sites(cfg), mats, strict=True):
        torch.testing.assert_close(cache[mixer_hook(c, "hook_h_pre")], a_m, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(cache[mixer_hook(c, "hook_h_res")], a_r, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(cache[mixer_hook(c, "hook_h_post")], b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_unrolled_weights_match_pairwise_products(mode):
    """hook_weights (tracked coefficients) equal the pairwise products B_j (prod A_r) A_m^k."""
    cfg = tiny("hc", {"streams": 4, "mode": mode})
    model = perturb(build(cfg, dtype=torch.float64), seed=3)
    _, cache = model.run_with_cache(random_tokens(cfg, pos=8))
    expected = naive_unroll(cfg, cache)
    assert len(expected) == cfg.n_sublayers + 1
    for c in consumers(cfg):
        torch.testing.assert_close(cache[c.hook_weights], expected[c.label], rtol=1e-10, atol=1e-12)


def test_static_matrices_are_the_parameters_and_dynamic_ones_vary():
    """Static HC hooks are the same for every token (= the parameters); dynamic ones depend on the token."""
    static = perturb(build(tiny("hc", {"mode": "static"}), dtype=torch.float64))
    dynamic = perturb(build(tiny("hc"), dtype=torch.float64))
    tokens = random_tokens(static.cfg, pos=8)
    _, cs = static.run_with_cache(tokens)
    _, cd = dynamic.run_with_cache(tokens)
    res = cs["blocks.1.mlp_mix.hook_h_res"]
    torch.testing.assert_close(res, static.blocks[1].mlp_mix.a_r.detach().expand_as(res), rtol=0, atol=0)
    spread = cd["blocks.1.mlp_mix.hook_h_res"].std(dim=(0, 1))
    assert spread.min() > 1e-4


def test_patched_write_weight_removes_a_source():
    """A hook that zeroes B of one sublayer removes its output from every later input."""
    cfg = tiny("hc")
    model = perturb(build(cfg, dtype=torch.float64))
    tokens = random_tokens(cfg, pos=8)
    labels = [s.label for s in sources(cfg)]
    j = labels.index("1.attn")
    with model.hooks(fwd_hooks=[("blocks.1.attn_mix.hook_h_post", lambda x, hook: torch.zeros_like(x))]):
        _, cache = model.run_with_cache(tokens)
    for c in consumers(cfg):
        w = cache[c.hook_weights]
        if w.shape[-1] > j:
            assert (w[..., j] == 0).all(), c.label
            assert (w[..., j - 1] != 0).any(), c.label


def test_dynamic_parts_learn_from_init():
    """At init W = 0 gets a gradient (through s = 0.01) while s gets none (tanh(0) = 0)."""
    model = build(tiny("hc"), dtype=torch.float64).train()
    tokens = random_tokens(model.cfg, pos=8)
    model(tokens).logsumexp(-1).mean().backward()
    mix = model.blocks[1].attn_mix
    assert mix.w_dyn.grad.abs().max() > 0
    assert mix.s_alpha.grad == 0 and mix.s_beta.grad == 0


def test_options_and_validation():
    assert build_options(get_scheme("hc"), {"mode": "static", "streams": "2"}).mode == "static"
    with pytest.raises(ConfigError, match="mode"):
        build_options(get_scheme("hc"), {"mode": "sometimes"})
    with pytest.raises(ConfigError, match="streams"):
        tiny("hc", {"streams": 0})
