"""mHC: Sinkhorn projection, standard residual at init, doubly stochastic composites, re-implementation."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from depthscope.errors import ConfigError
from depthscope.schemes import consumers
from depthscope.schemes._common import rms_norm
from depthscope.schemes.mhc import sinkhorn
from tests.helpers import build, perturb, random_tokens, tiny
from tests.schemes.test_hc import (
    mixer_hook,
    naive_unroll,
    standard_like,
    sublayer_sites,
)


def naive_sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """Plain autograd Sinkhorn-Knopp: exp, then rows then columns normalised, ``iters`` times."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / m.sum(-1, keepdim=True)
        m = m / m.sum(-2, keepdim=True)
    return m


def mhc_reference(model, tokens):
    """mHC written out from the paper (arXiv 2512.24880), per stream, with a naive Sinkhorn.

    Returns the logits and, per sublayer, (H_pre [b,p,n], H_res [b,p,n,n], H_post [b,p,n]).
    """
    n, iters = model.cfg.options.streams, model.cfg.options.sinkhorn_iters
    x0 = model.embed(tokens)
    streams = [x0] * n
    mats = []
    for block in model.blocks:
        for kind in ("attn", "mlp"):
            mix = getattr(block, f"{kind}_mix")
            x = rms_norm(torch.cat(streams, dim=-1))  # x' = RMSNorm(vec(H)), streams in order
            phi_pre, phi_post, phi_res = mix.phi[:n].T, mix.phi[n : 2 * n].T, mix.phi[2 * n :].T
            a_pre, a_post, a_res = mix.alpha
            h_pre = torch.sigmoid(a_pre * (x @ phi_pre) + mix.b_pre)
            h_post = 2 * torch.sigmoid(a_post * (x @ phi_post) + mix.b_post)
            h_res = naive_sinkhorn(a_res * (x @ phi_res).unflatten(-1, (n, n)) + mix.b_res, iters)
            out = getattr(block, kind)(sum(h_pre[..., s, None] * streams[s] for s in range(n)))
            streams = [
                sum(h_res[..., s, t, None] * streams[s] for s in range(n)) + h_post[..., t, None] * out
                for t in range(n)
            ]
            mats.append((h_pre, h_res, h_post))
    return model.unembed(model.ln_final(sum(streams))), mats


def perturbed_mhc(n_layers: int = 3, seed: int = 0):
    """A float64 mHC model with noise on phi, alpha and the biases: input-dependent matrices far from init.

    The sizes keep the residual logits within a few units, where 20 Sinkhorn rounds converge.
    """
    model = build(tiny("mhc", n_layers=n_layers), dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    scales = {"phi": 0.1, "alpha": 0.5}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "_mix" in name:
                scale = scales.get(name.rsplit(".", 1)[-1], 0.3)  # b_pre, b_post, b_res: 0.3
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def test_sinkhorn_makes_random_matrices_doubly_stochastic():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 4, 4, generator=g)
    m = sinkhorn(logits, 20)
    assert (m >= 0).all()
    assert (m.sum(-1) - 1).abs().max() < 1e-3
    assert (m.sum(-2) - 1).abs().max() < 1e-5  # the last normalisation of each round
    torch.testing.assert_close(m, naive_sinkhorn(logits, 20), rtol=1e-5, atol=1e-6)
    # invariant to a common shift of the logits (the max subtraction)
    torch.testing.assert_close(sinkhorn(logits + 50.0, 20), m, rtol=1e-5, atol=1e-6)


def test_sinkhorn_gradient_is_exact():
    """The hand-written backward passes gradcheck and equals autograd through the naive loop."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: sinkhorn(x, 5), (logits,))
    weights = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64)
    (ours,) = torch.autograd.grad((sinkhorn(logits, 20) * weights).sum(), logits)
    (theirs,) = torch.autograd.grad((naive_sinkhorn(logits, 20) * weights).sum(), logits)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [2, 4])
def test_init_is_the_standard_residual(n):
    """With phi = 0: H_pre sums to 1, H_post = 1, H_res doubly stochastic: the standard residual (float64)."""
    model = build(tiny("mhc", {"streams": n}), dtype=torch.float64)
    tokens = random_tokens(model.cfg)
    ours, theirs = model(tokens), standard_like(model, n)(tokens)
    assert (ours - theirs).abs().max() <= 1e-9 * theirs.abs().max()


def test_init_matrices():
    """H_pre = (n+1)/(2n) on stream k mod n, 1/(2n) elsewhere; H_post = 1; H_res = (eI + 1 - I)/(e+n-1)."""
    n = 4
    cfg = tiny("mhc", {"streams": n})
    _, cache = build(cfg, dtype=torch.float64).run_with_cache(random_tokens(cfg, pos=8))
    eye = torch.eye(n, dtype=torch.float64)
    want_res = (1 + (math.e - 1) * eye) / (math.e + n - 1)
    for k, c in enumerate(sublayer_sites(cfg)):
        pre = cache[mixer_hook(c, "hook_h_pre")]
        want_pre = torch.full((n,), 1 / (2 * n), dtype=torch.float64)
        want_pre[k % n] = (n + 1) / (2 * n)
        torch.testing.assert_close(pre, want_pre.expand_as(pre), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(
            cache[mixer_hook(c, "hook_h_post")], torch.ones_like(pre), rtol=0, atol=1e-12
        )
        res = cache[mixer_hook(c, "hook_h_res")]
        torch.testing.assert_close(res, want_res.expand_as(res), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(
            cache[c.hook_weights], torch.ones_like(cache[c.hook_weights]), rtol=1e-6, atol=1e-6
        )
    torch.testing.assert_close(
        cache["readout_mix.hook_weights"], torch.full_like(cache["readout_mix.hook_weights"], n)
    )


def test_init_breaks_stream_symmetry():
    """One backward pass at init gives the streams' pre logits different gradients (uniform b_pre: not)."""
    model = build(tiny("mhc"), dtype=torch.float64).train()
    model(random_tokens(model.cfg, pos=8)).logsumexp(-1).mean().backward()
    grad = model.blocks[1].mlp_mix.phi.grad[:4]  # phi_pre, one row per stream
    assert (grad - grad.mean(0)).abs().max() > 1e-6 * grad.abs().max()


def test_perturbed_matrices_satisfy_the_constraints():
    """Every H_res seen is doubly stochastic (1e-3) and non-negative; H_pre in (0, 1), H_post in (0, 2)."""
    model = perturbed_mhc()
    _, cache = model.run_with_cache(random_tokens(model.cfg, pos=16))
    for c in sublayer_sites(model.cfg):
        res = cache[mixer_hook(c, "hook_h_res")]
        assert (res >= 0).all()
        assert (res.sum(-1) - 1).abs().max() < 1e-3 and (res.sum(-2) - 1).abs().max() < 1e-3
        assert res.std(dim=(0, 1)).max() > 1e-3  # input-dependent, not the init
        pre, post = cache[mixer_hook(c, "hook_h_pre")], cache[mixer_hook(c, "hook_h_post")]
        assert ((pre > 0) & (pre < 1)).all() and ((post > 0) & (post < 2)).all()


def composite(cache, cfg) -> torch.Tensor:
    """Per token, the product of every sublayer's residual matrix in execution order: [b, p, n, n]."""
    out = None
    for c in sublayer_sites(cfg):
        res = cache[mixer_hook(c, "hook_h_res")]
        out = res if out is None else out @ res  # a row vector over streams carries as v <- v R
    return out


def test_composite_stays_doubly_stochastic_unlike_hc():
    """Across 12 sublayers the mHC composite stays doubly stochastic with gain < 1.1; HC's grows."""
    model = perturbed_mhc(n_layers=6)
    tokens = random_tokens(model.cfg, pos=16)
    _, cache = model.run_with_cache(tokens)
    prod = composite(cache, model.cfg)
    assert (prod.sum(-1) - 1).abs().max() < 1e-2 and (prod.sum(-2) - 1).abs().max() < 1e-2
    assert prod.abs().sum(-1).max() < 1.1
    # HC with A_r = I + noise of the size of mHC's b_res noise: the composite gain is not bounded
    hc = perturb(build(tiny("hc", {"mode": "static"}, n_layers=6), dtype=torch.float64), scale=0.3)
    _, hc_cache = hc.run_with_cache(tokens)
    assert composite(hc_cache, hc.cfg).abs().sum(-1).max() > 2.0


def test_matches_paper_reference():
    """Perturbed model: logits and every native matrix equal a per-stream re-implementation."""
    model = perturbed_mhc()
    tokens = random_tokens(model.cfg, pos=8)
    logits, cache = model.run_with_cache(tokens)
    ref_logits, mats = mhc_reference(model, tokens)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-12)
    for c, (pre, res, post) in zip(sublayer_sites(model.cfg), mats, strict=True):
        torch.testing.assert_close(cache[mixer_hook(c, "hook_h_pre")], pre, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(cache[mixer_hook(c, "hook_h_res")], res, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(cache[mixer_hook(c, "hook_h_post")], post, rtol=1e-10, atol=1e-12)


def test_unrolled_weights_match_pairwise_products():
    model = perturbed_mhc(seed=2)
    _, cache = model.run_with_cache(random_tokens(model.cfg, pos=8))
    expected = naive_unroll(model.cfg, cache)
    for c in consumers(model.cfg):
        torch.testing.assert_close(cache[c.hook_weights], expected[c.label], rtol=1e-10, atol=1e-12)


def test_float32_matches_float64():
    """The float32 model (constraints computed in float32) follows the float64 one closely."""
    m64 = perturbed_mhc()
    m32 = copy.deepcopy(m64).float()
    tokens = random_tokens(m64.cfg, pos=8)
    torch.testing.assert_close(m32(tokens).double(), m64(tokens), rtol=1e-4, atol=1e-4)


def test_validation():
    with pytest.raises(ConfigError, match="streams"):
        tiny("mhc", {"streams": 1})
    with pytest.raises(ConfigError, match="sinkhorn_iters"):
        tiny("mhc", {"sinkhorn_iters": 0})
