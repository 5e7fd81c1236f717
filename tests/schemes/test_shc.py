"""sHC: residual matrices on the unit spectral sphere, with negative entries; the standard model at init;
H_res recomputed from the module's parameters and its captured streams."""

from __future__ import annotations

import pytest
import torch

from depthscope.corpus import load_corpus
from depthscope.errors import ConfigError
from depthscope.schemes import names
from depthscope.schemes._common import EPS
from depthscope.train import TrainConfig, train
from tests.helpers import build, perturb, random_tokens, share_weights, tiny
from tests.schemes.test_hc import mixer_hook, sublayer_sites

F32 = torch.finfo(torch.float32).eps


def sigma_max(m: torch.Tensor) -> torch.Tensor:
    """Largest singular value of [..., n, n] matrices in float64, as sqrt(lambda_max(M^T M)).

    An eigensolver of the symmetric Gram matrix, not the SVD the scheme uses.
    """
    m = m.double()
    return torch.linalg.eigvalsh(m.transpose(-1, -2) @ m)[..., -1].clamp_min(0).sqrt()


def test_trained_matrices_lie_on_the_unit_spectral_sphere_with_negative_entries():
    """After 20 AdamW steps from init: every per-token H_res has spectral norm 1 to float32 rounding,
    and training has made entries negative (impossible in mHC's doubly stochastic matrices).

    Tolerance: H~ / sigma rounds each entry once (1/2 ulp), and the float32 SVD's sigma is accurate
    to a small multiple of n eps (LAPACK's backward-stable SVD): 8 n eps covers both.
    """
    n = 4
    cfg = tiny("shc", {"streams": n})
    model = train(
        cfg, TrainConfig(steps=20, batch_size=8, lr=1e-2, eval_tokens=512), load_corpus(), progress=False
    )
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the SVD's gradient at H~ = I is finite
    assert (model.blocks[1].attn_mix.b_res.detach() - torch.eye(n)).abs().max() > 1e-2  # training moved it
    _, cache = model.eval().run_with_cache(random_tokens(cfg, pos=16))
    tol = 8 * n * F32
    lowest = []
    for c in sublayer_sites(cfg):
        res = cache[mixer_hook(c, "hook_h_res")]
        assert res.dtype == torch.float32 and res.shape == (2, 16, n, n)
        err = float((sigma_max(res) - 1).abs().max())
        assert err <= tol, f"{c.label}: |sigma_max - 1| = {err:.2e} > {tol:.2e}"
        lowest.append(float(res.min()))
    assert min(lowest) < -1e-3, f"no clearly negative entry after training: minima {lowest}"


def test_perturbed_matrices_lie_on_the_sphere_and_vary_per_token():
    """Noise on the mixers: spectral norm 1 per token (float32), negative entries, input-dependent."""
    n = 3
    model = perturb(build(tiny("shc", {"streams": n})), scale=0.3)
    _, cache = model.run_with_cache(random_tokens(model.cfg, pos=16))
    for c in sublayer_sites(model.cfg):
        res = cache[mixer_hook(c, "hook_h_res")]
        err = float((sigma_max(res) - 1).abs().max())
        assert err <= 8 * n * F32, f"{c.label}: |sigma_max - 1| = {err:.2e}"
        assert float(res.min()) < -1e-2, c.label
        assert float(res.std(dim=(0, 1)).max()) > 1e-3, c.label  # per token, not one static matrix


@pytest.mark.parametrize("reference", ["standard", "mhc"])
@pytest.mark.parametrize("n", [2, 4])
def test_init_is_the_standard_residual_and_mhc_at_init(reference, n):
    """At init H_res = I exactly (to one ulp) and the float32 logits equal the standard model's and mHC's.

    Both are exact in real arithmetic: the streams stay identical copies of the standard residual
    stream (H_pre sums to 1, H_post = 1, and H_res = I here, doubly stochastic in mHC), and the
    standard model's final-norm eps is divided by n^2 (rmsnorm(n x, eps) = rmsnorm(x, eps / n^2)).
    What remains is float32 rounding: at most n + 1 roundings (the weighted sum of n streams and
    the norm) per sublayer read and at the read-out, each a relative eps of the largest logit.
    """
    cfg = tiny("shc", {"streams": n})
    model = build(cfg)
    tokens = random_tokens(cfg)
    if reference == "standard":
        other = share_weights(model, build(tiny("standard"), seed=99))
        other.ln_final.eps = model.ln_final.eps / n**2
    else:
        other = share_weights(model, build(tiny("mhc", {"streams": n}), seed=99))  # phi, alpha, biases too
        for name, p in other.named_parameters():
            assert torch.equal(p, model.get_parameter(name)), name
    logits, cache = model.run_with_cache(tokens)
    for c in sublayer_sites(cfg):
        res = cache[mixer_hook(c, "hook_h_res")]
        assert float((res - torch.eye(n)).abs().max()) <= F32, c.label
    with torch.no_grad():
        ours, theirs = logits.double(), other(tokens).double()
    tol = (n + 1) * (cfg.n_sublayers + 1) * F32 * float(theirs.abs().max())
    err = float((ours - theirs).abs().max())
    assert err <= tol, f"{reference}: max |logit difference| {err:.2e} > {tol:.2e}"


def captured_streams(model, mixers, tokens):
    """The streams H [batch, pos, stream, d_model] each of ``mixers`` reads, with the run's cache.

    ``read`` is wrapped by an instance attribute for the forward (removed afterwards).
    """
    seen = {}

    def wrap(name, mix):
        original = mix.read

        def read(state):
            seen[name] = state.h.detach().clone()
            return original(state)

        return read

    for name, mix in mixers.items():
        mix.read = wrap(name, mix)
    try:
        _, cache = model.run_with_cache(tokens)
    finally:
        for mix in mixers.values():
            del mix.read
    return seen, cache


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_h_res_equals_an_oracle_from_the_parameters_and_captured_streams(dtype):
    """One sublayer (block 1's MLP), off init: H_res recomputed in float64 from its phi, alpha, b_res
    and the streams it read equals ``hook_h_res``; the next sublayer reads sum_s H_res[s, t] h_s +
    H_post[t] f exactly.

    Oracle: x' = vec(H) / sqrt(mean(vec(H)^2) + eps), L = a_res mat(x' phi_res^T) + b_res (row-major
    source x target), H_res = L / sigma_max(L) with sigma_max from an eigensolver of L^T L.
    float64 model: 1e-12. float32 model: the logits come from dot products of K = n d_model terms,
    exact to K eps of the sum of |terms| (|a_res| |phi_res| @ |x'|), plus a few roundings of L
    itself; dividing by sigma_max >= |L|_max / n keeps the error within 2 (K + 8) eps of
    (|a_res| |phi_res| @ |x'| + |L|) / sigma_max, elementwise.
    """
    n = 4
    model = perturb(build(tiny("shc", {"streams": n}), dtype=dtype), scale=0.3)
    mix, nxt = model.blocks[1].mlp_mix, model.blocks[2].attn_mix
    tokens = random_tokens(model.cfg, pos=16)
    streams, cache = captured_streams(model, {"here": mix, "next": nxt}, tokens)
    h = streams["here"].double()  # [batch, pos, stream, d_model]
    assert float((h[..., 0, :] - h[..., 1, :]).abs().max()) > 1e-2  # the streams differ: orientation matters

    flat = h.flatten(-2)
    x = flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + EPS)
    phi_res, a_res = mix.phi.detach().double()[2 * n :], mix.alpha.detach().double()[2]
    b_res = mix.b_res.detach().double()
    logits = a_res * (x @ phi_res.T).unflatten(-1, (n, n)) + b_res  # [batch, pos, source, target]
    sigma = sigma_max(logits)[..., None, None]
    want = logits / sigma
    got = cache[names.mixer_hook(1, "mlp", "hook_h_res")].double()
    assert got.shape == want.shape
    assert float(want.min()) < -1e-2  # negative entries are part of what is compared
    if dtype == torch.float64:
        tol = 1e-12 * torch.ones_like(want)
    else:
        k = n * model.cfg.d_model
        terms = a_res.abs() * (x.abs() @ phi_res.abs().T).unflatten(-1, (n, n))
        tol = 2 * (k + 8) * F32 * (terms + logits.abs()) / sigma
    excess = float((got - want).abs().sub(tol).max())
    assert excess <= 0, f"H_res off the oracle by {excess:.2e} beyond the tolerance"

    # the write: the next sublayer's streams are H_res^T H + H_post (x) f, with f the MLP's output
    post = cache[names.mixer_hook(1, "mlp", "hook_h_post")].double()
    out = cache[names.source_out(1, "mlp")].double()
    rebuilt = torch.einsum("bpst,bpsd->bptd", got, h) + post[..., None] * out[..., None, :]
    nxt_h = streams["next"].double()
    err = float((rebuilt - nxt_h).abs().max() / nxt_h.abs().max())
    assert err <= (1e-12 if dtype == torch.float64 else 8 * (n + 1) * F32), f"write off by {err:.2e}"


def test_validation():
    with pytest.raises(ConfigError, match="streams"):
        tiny("shc", {"streams": 1})
