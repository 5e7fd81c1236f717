"""Deep Delta Learning: the delta rule itself, the gate, the hooks, and the model's increments."""

from __future__ import annotations

import torch

from depthscope.schemes import consumers, sources
from depthscope.schemes.ddl import delta_update
from tests.helpers import build, perturb, random_tokens, tiny

CFG = tiny("ddl")


def unit(shape, dtype=torch.float64):
    k = torch.randn(*shape, dtype=dtype)
    return k / k.norm(dim=-1, keepdim=True)


def perturb_gates(model, scale: float = 1.0):
    return perturb(model, scale, match=".gate.")


def test_zero_beta_is_the_identity():
    x, k = torch.randn(5, 7, 16, dtype=torch.float64), unit((5, 7, 16))
    v = torch.randn(5, 7, dtype=torch.float64)
    assert torch.equal(delta_update(x, k, v, torch.zeros(5, 7, dtype=torch.float64)), x)
    assert torch.equal(delta_update(x, k, v, 0.0), x)


def test_zero_beta_in_the_model_skips_every_sublayer():
    """Forcing every gate to 0 leaves the stream equal to the embedding, exactly."""
    model = build(CFG, dtype=torch.float64)
    zero = lambda beta, hook: torch.zeros_like(beta)  # noqa: E731
    hooks = [(f"blocks.{i}.{kind}.hook_beta", zero) for i in range(3) for kind in ("attn", "mlp")]
    with model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(random_tokens(CFG))
    for s in sources(CFG)[1:]:
        assert torch.equal(cache[s.hook], torch.zeros_like(cache[s.hook])), s.label
    assert torch.equal(cache["readout_mix.hook_in"], cache["hook_embed"])
    assert (cache["blocks.2.mlp.hook_branch"].abs().max()) > 0  # the branches still ran


def test_beta_two_is_a_householder_reflection_plus_write():
    x, k, v = torch.randn(6, 16, dtype=torch.float64), unit((6, 16)), torch.randn(6, dtype=torch.float64)
    eye = torch.eye(16, dtype=torch.float64)
    reflect = eye - 2 * k[:, :, None] * k[:, None, :]  # [batch, d, d]
    torch.testing.assert_close(reflect @ reflect.transpose(1, 2), eye.expand(6, 16, 16), rtol=0, atol=1e-12)
    torch.testing.assert_close(reflect @ reflect, eye.expand(6, 16, 16), rtol=0, atol=1e-12)  # involution
    expected = (reflect @ x[:, :, None]).squeeze(-1) + 2 * k * v[:, None]
    torch.testing.assert_close(delta_update(x, k, v, 2.0), expected, rtol=0, atol=1e-12)
    # without the write, the reflection preserves the norm and flips the k-component
    y = delta_update(x, k, torch.zeros(6, dtype=torch.float64), 2.0)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)
    torch.testing.assert_close((k * y).sum(-1), -(k * x).sum(-1), rtol=0, atol=1e-12)


def test_beta_one_erases_the_k_component_and_writes_v():
    x, k, v = torch.randn(6, 16, dtype=torch.float64), unit((6, 16)), torch.randn(6, dtype=torch.float64)
    y = delta_update(x, k, v, 1.0)
    torch.testing.assert_close((k * y).sum(-1), v, rtol=0, atol=1e-12)
    orth = lambda z: z - (k * z).sum(-1, keepdim=True) * k  # noqa: E731
    torch.testing.assert_close(orth(y), orth(x), rtol=0, atol=1e-12)


def test_beta_is_one_at_init_and_stays_in_range():
    model = build(CFG)
    tokens = random_tokens(CFG)
    _, cache = model.run_with_cache(tokens)
    betas = [cache[f"blocks.{i}.{kind}.hook_beta"] for i in range(3) for kind in ("attn", "mlp")]
    for b in betas:
        assert b.shape == (2, CFG.ctx)
        assert torch.equal(b, torch.ones_like(b))
    perturb_gates(model, scale=20.0)  # saturate the sigmoid in both directions
    _, cache = model.run_with_cache(tokens)
    betas = torch.stack([cache[f"blocks.{i}.{kind}.hook_beta"] for i in range(3) for kind in ("attn", "mlp")])
    assert betas.min() >= 0 and betas.max() <= 2
    assert betas.min() < 0.1 and betas.max() > 1.9  # the perturbation really spread them


def test_k_is_unit_along_the_branch_output():
    model = perturb_gates(build(CFG, dtype=torch.float64))
    _, cache = model.run_with_cache(random_tokens(CFG))
    for i in range(3):
        for kind in ("attn", "mlp"):
            o, k = cache[f"blocks.{i}.{kind}.hook_branch"], cache[f"blocks.{i}.{kind}.hook_k"]
            assert (o.norm(dim=-1) > 1e-4).all()
            torch.testing.assert_close(
                k.norm(dim=-1), torch.ones(k.shape[:-1], dtype=k.dtype), rtol=0, atol=1e-12
            )
            torch.testing.assert_close(k * o.norm(dim=-1, keepdim=True), o, rtol=0, atol=1e-14)


def test_increment_is_the_delta_rule_on_the_stream():
    """hook_{kind}_out == beta (o - (k.x) k), from the hooked branch output, gate and stream."""
    model = perturb_gates(build(CFG, dtype=torch.float64))
    _, cache = model.run_with_cache(random_tokens(CFG))
    x = cache["hook_embed"]
    for i in range(3):
        for kind in ("attn", "mlp"):
            torch.testing.assert_close(cache[f"blocks.{i}.{kind}_mix.hook_in"], x, rtol=0, atol=0)
            o, beta = cache[f"blocks.{i}.{kind}.hook_branch"], cache[f"blocks.{i}.{kind}.hook_beta"]
            k = o / o.norm(dim=-1, keepdim=True)
            expected = beta[..., None] * (o - (k * x).sum(-1, keepdim=True) * k)
            delta = cache[f"blocks.{i}.hook_{kind}_out"]
            torch.testing.assert_close(delta, expected, rtol=1e-10, atol=1e-14)
            x = x + delta
    torch.testing.assert_close(cache["readout_mix.hook_in"], x, rtol=0, atol=0)


def test_naive_forward_matches_the_model():
    """An independent loop over depth (branches called directly, gate written out) gives the logits."""
    model = perturb_gates(build(CFG, dtype=torch.float64))
    tokens = random_tokens(CFG)
    x = model.embed(tokens)
    for block in model.blocks:
        for kind in ("attn", "mlp"):
            sub = getattr(block, kind)
            o = sub.branch(x)
            gate = (x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()) @ sub.gate.weight + sub.gate.bias
            beta = 2 / (1 + torch.exp(-gate))
            k = o / o.norm(dim=-1, keepdim=True)
            # (I - beta k k^T) x + beta k |o|, as explicit per-token matrices
            a = (
                torch.eye(CFG.d_model, dtype=x.dtype)
                - beta[..., None, None] * k[..., :, None] * k[..., None, :]
            )
            x = (a @ x[..., None]).squeeze(-1) + beta[..., None] * k * o.norm(dim=-1, keepdim=True)
    expected = model.unembed(model.ln_final(x))
    torch.testing.assert_close(model(tokens), expected, rtol=1e-10, atol=1e-12)


def test_delta_basis_weights_are_all_ones_and_gates_survive_the_global_init():
    model = build(CFG)
    _, cache = model.run_with_cache(random_tokens(CFG, pos=6))
    for c in consumers(CFG):
        w = cache[c.hook_weights]
        assert torch.equal(w, torch.ones_like(w)), c.label
    for name, p in model.named_parameters():
        if ".gate." in name:
            assert torch.equal(p, torch.zeros_like(p)), name
    names = [n for n, _ in model.named_parameters()]
    assert "blocks.0.attn.gate.weight" in names and "blocks.2.mlp.branch.W_out.weight" in names
