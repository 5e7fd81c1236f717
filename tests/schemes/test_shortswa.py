"""ShortSWA (Residual Stream Duality): the depth window and the sequence-axis sublayer."""

from __future__ import annotations

import math

import pytest
import torch

from depthscope.errors import ConfigError
from depthscope.schemes import consumers, sources
from depthscope.schemes.base import sublayer_sites
from tests.helpers import build, perturb, random_tokens, share_weights, tiny

K = 3  # a window shorter than the 6 sublayers of the tiny model, so some sources fall out of it


def perturb_mixers(model, scale: float = 1.0):
    return perturb(model, scale)


def depth_states(cfg, cache) -> list[torch.Tensor]:
    """h^(0) = embedding, h^(l+1) = h^(l) + o_l, rebuilt from the hooked sources."""
    out = [cache["hook_embed"]]
    for s in sources(cfg)[1:]:
        out.append(out[-1] + cache[s.hook])
    return out


def rms(x):
    return x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()


def test_window_of_one_is_the_standard_residual():
    cfg = tiny("shortswa", {"window": 1})
    model = build(cfg, dtype=torch.float64)
    tokens = random_tokens(cfg)
    _, cache = model.run_with_cache(tokens)
    states = depth_states(cfg, cache)
    for site in sublayer_sites(cfg):
        h = cache[f"blocks.{site.block}.{site.kind}_mix.hook_in"]
        assert torch.equal(h, states[site.index]), site.label
    standard = share_weights(model, build(tiny("standard"), seed=5, dtype=torch.float64))
    torch.testing.assert_close(model(tokens), standard(tokens), rtol=0, atol=0)


def test_window_starts_uniform_and_sums_to_one_after_training_moves():
    cfg = tiny("shortswa", {"window": K})
    model = build(cfg, dtype=torch.float64)
    tokens = random_tokens(cfg)
    _, cache = model.run_with_cache(tokens)
    for site in sublayer_sites(cfg):
        alpha = cache[f"blocks.{site.block}.{site.kind}_mix.hook_window"]
        size = min(K, site.index + 1)
        assert alpha.shape == (2, cfg.ctx, size)
        torch.testing.assert_close(alpha, torch.full_like(alpha, 1 / size), rtol=0, atol=1e-15)
    perturb_mixers(model, scale=3.0)
    _, cache = model.run_with_cache(tokens)
    for site in sublayer_sites(cfg)[1:]:
        alpha = cache[f"blocks.{site.block}.{site.kind}_mix.hook_window"]
        assert (alpha >= 0).all()
        torch.testing.assert_close(alpha.sum(-1), torch.ones_like(alpha[..., 0]), rtol=0, atol=1e-14)
        assert (alpha - 1 / alpha.shape[-1]).abs().max() > 0.05, site.label  # no longer uniform


def test_window_is_the_papers_attention_over_depth():
    """alpha = softmax((W_Q n_l).(W_K n_j) / sqrt(d_k)) over the last K states, keys projected per state."""
    cfg = tiny("shortswa", {"window": K})
    model = perturb_mixers(build(cfg, dtype=torch.float64))
    _, cache = model.run_with_cache(random_tokens(cfg))
    states = depth_states(cfg, cache)
    d_k = cfg.d_model // cfg.n_heads
    for site in sublayer_sites(cfg)[1:]:
        mix = getattr(model.blocks[site.block], f"{site.kind}_mix")
        window = states[max(0, site.index - K + 1) : site.index + 1]
        q = rms(states[site.index]) @ mix.W_Q.T  # [batch, pos, d_k]
        keys = torch.stack([rms(h) @ mix.W_K.T for h in window], dim=-2)  # [batch, pos, window, d_k]
        alpha = torch.softmax((keys @ q[..., None]).squeeze(-1) / math.sqrt(d_k), dim=-1)
        torch.testing.assert_close(cache[f"blocks.{site.block}.{site.kind}_mix.hook_window"], alpha)
        mixed = sum(a[..., None] * h for a, h in zip(alpha.unbind(-1), window))
        torch.testing.assert_close(cache[f"blocks.{site.block}.{site.kind}_mix.hook_in"], mixed)


def test_no_weight_beyond_the_window():
    """Delta weights are 1 for sources in every window state, and sum_{j >= s} alpha_j inside it."""
    cfg = tiny("shortswa", {"window": K})
    model = perturb_mixers(build(cfg, dtype=torch.float64))
    tokens = random_tokens(cfg)
    _, cache = model.run_with_cache(tokens)
    for site in sublayer_sites(cfg):
        prefix = f"blocks.{site.block}.{site.kind}_mix"
        alpha, w = cache[f"{prefix}.hook_window"], cache[f"{prefix}.hook_weights"]
        first = site.index - alpha.shape[-1] + 1  # depth of the oldest state in the window
        assert first == max(0, site.index - K + 1)
        for s in range(site.n_sources):
            if s <= first:
                assert torch.equal(w[..., s], torch.ones_like(w[..., s])), (site.label, s)
            else:
                expected = sum(alpha[..., j - first] for j in range(s, site.index + 1))
                torch.testing.assert_close(w[..., s], expected, rtol=0, atol=1e-15)
    # independently: the input of the last sublayer (index 5) is the alpha-mix of h^(3..5) alone
    states = depth_states(cfg, cache)
    h = cache["blocks.2.mlp_mix.hook_in"]
    alpha = cache["blocks.2.mlp_mix.hook_window"]
    torch.testing.assert_close(h, sum(alpha[..., j, None] * states[3 + j] for j in range(K)))


def test_sublayer_receives_the_value_projection_of_the_mix():
    cfg = tiny("shortswa", {"window": K})
    model = perturb_mixers(build(cfg, dtype=torch.float64), scale=0.3)
    _, cache = model.run_with_cache(random_tokens(cfg))
    for site in sublayer_sites(cfg):
        block = model.blocks[site.block]
        mix, sub = getattr(block, f"{site.kind}_mix"), getattr(block, site.kind)
        out = sub(cache[f"blocks.{site.block}.{site.kind}_mix.hook_in"] @ mix.W_V)
        torch.testing.assert_close(
            out, cache[f"blocks.{site.block}.hook_{site.kind}_out"], rtol=0, atol=1e-14
        )
    assert "readout_mix.W_V" not in dict(model.named_parameters())
    assert torch.equal(cache["readout_mix.hook_in"], depth_states(cfg, cache)[-1])


def test_sequence_axis_layout_and_weights():
    cfg = tiny("shortswa", {"axis": "sequence", "window": 4})
    assert cfg.kinds == ("swa", "attn", "mlp")
    assert [s.label for s in sources(cfg)][:5] == ["embed", "0.swa", "0.attn", "0.mlp", "1.swa"]
    model = build(cfg)
    assert model.blocks[1].swa.window == 4
    _, cache = model.run_with_cache(random_tokens(cfg, pos=10))
    for c in consumers(cfg):
        w = cache[c.hook_weights]
        assert w.shape == (2, 10, c.site.n_sources) and torch.equal(w, torch.ones_like(w)), c.label


@pytest.mark.parametrize("w", [1, 4])
def test_sequence_window_is_causal_and_local(w):
    """The swa sublayer's output at t depends on inputs t-w+1 .. t only."""
    cfg = tiny("shortswa", {"axis": "sequence", "window": w})
    swa = build(cfg, dtype=torch.float64).blocks[0].swa
    x = torch.randn(2, 20, cfg.d_model, dtype=torch.float64)
    base = swa(x)
    t = 12
    for p in range(20):
        moved = x.clone()
        moved[:, p] += 1.0
        changed = (swa(moved)[:, t] - base[:, t]).abs().max() > 1e-9
        assert bool(changed) == (t - w < p <= t), (p, w)


def test_sequence_window_of_ctx_is_plain_causal_attention():
    cfg = tiny("shortswa", {"axis": "sequence", "window": 32})
    model = build(cfg, dtype=torch.float64)
    tokens = random_tokens(cfg)
    windowed = model(tokens)
    for block in model.blocks:
        block.swa.window = None  # the same module, plain causal attention
    torch.testing.assert_close(model(tokens), windowed, rtol=1e-12, atol=1e-12)
    cfg16 = tiny("shortswa", {"axis": "sequence", "window": 16})
    model16 = share_weights(model, build(cfg16, seed=3, dtype=torch.float64))
    assert (model16(tokens) - windowed).abs().max() > 1e-6  # a shorter window does change the model


@pytest.mark.parametrize(
    "options",
    [{"window": 0}, {"axis": "sequence", "window": 0}, {"axis": "sequence", "window": 33}],
)
def test_invalid_windows_are_refused(options):
    with pytest.raises(ConfigError, match="window"):
        tiny("shortswa", options)
    tiny("shortswa", {"window": 100})  # over depth, a window past the depth is the full-memory variant


def test_trace_says_what_a_depth_row_describes():
    """hook_in is u = sum_j alpha_j h^(j) (exact over the sources); the sublayer receives u W_V."""
    from depthscope.probes import capture

    depth = capture(build(tiny("shortswa")), random_tokens(tiny()))
    assert "u W_V" in depth.attrs["consumer_input"] and float(depth["residual_error"].max()) < 1e-5
    seq = capture(build(tiny("shortswa", {"axis": "sequence"})), random_tokens(tiny()))
    assert "consumer_input" not in seq.attrs
