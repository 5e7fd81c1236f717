"""DCA and GRN-v1/v2/v3: identity at init, trainable gate, k-DCA stack, weight structure, naive GRN."""

from __future__ import annotations

import pytest
import torch

from depthscope.errors import ConfigError
from depthscope.schemes import consumers
from depthscope.schemes._common import rms_norm
from depthscope.schemes.base import build_options, get_scheme
from tests.helpers import build, perturb, random_tokens, share_weights, tiny

OPTIONS = [
    {"grn": "v1"},
    {"grn": "v2"},
    {"grn": "v3"},
    {"grn": "dca"},
    {"grn": "dca", "k": 1},
    {"grn": "dca", "k": 2},
    {"grn": "v3", "k": 2},
    {"grn": "v1", "k": 1},
]
IDS = ["-".join(f"{k}{v}" for k, v in o.items()) for o in OPTIONS]


def dca(options: dict, n_layers: int = 4):
    return tiny("dca", options, n_layers=n_layers)


def perturbed(cfg, seed: int = 5, scale: float = 0.5):
    return perturb(build(cfg, dtype=torch.float64), scale, seed)


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
def test_equals_standard_at_init(options):
    """b = 1, w = 0: every input and the logits equal the standard residual's (float64, 1e-12)."""
    cfg = dca(options)
    standard = build(tiny("standard", n_layers=4), dtype=torch.float64)
    model = share_weights(standard, build(cfg, seed=9, dtype=torch.float64))
    mixer_free = {n for n in model.state_dict() if "_mix" not in n}
    assert mixer_free == set(standard.state_dict())  # every non-mixer weight was shared
    tokens = random_tokens(cfg)
    a, cache_a = standard.run_with_cache(tokens)
    b, cache_b = model.run_with_cache(tokens)
    assert (a - b).abs().max() <= 1e-12 * a.abs().max()
    for c in consumers(cfg):
        plain = f"{c.hook_in.rsplit('.', 2)[0]}.hook_in" if c.view else c.hook_in
        ref = cache_a[plain]
        assert (cache_b[c.hook_in] - ref).abs().max() <= 1e-12 * ref.abs().max(), c.label


def test_clamp_is_relu_with_gradient_one_at_zero():
    x = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    y = x.clamp(min=0)
    y.sum().backward()
    assert y.tolist() == torch.relu(x).tolist()
    assert x.grad.tolist() == [0.0, 1.0, 1.0]  # torch.relu would give 0 at 0


@pytest.mark.parametrize(
    "options", [{"grn": "v3"}, {"grn": "dca"}, {"grn": "dca", "k": 1}], ids=["v3", "dca", "dca-k1"]
)
def test_one_optimiser_step_moves_every_gate_projection(options):
    """w starts at 0; the gate's gradient at 0 is 1, so one step makes every w nonzero."""
    model = build(dca(options, n_layers=3)).train()
    ws = {n: p for n, p in model.named_parameters() if n.endswith(".w")}
    assert len(ws) == (3 * 3 if options["grn"] == "dca" else 3) + 1  # every GRN, read-out included
    assert all((p == 0).all() for p in ws.values())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = random_tokens(model.cfg, pos=16)
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    opt.step()
    for name, p in ws.items():
        assert (p != 0).sum() > p.numel() // 2, name


def run_states(model, tokens):
    """Cache of one forward, and the state after each block."""
    states = []
    handles = [b.register_forward_hook(lambda m, i, o: states.append(o)) for b in model.blocks]
    try:
        _, cache = model.run_with_cache(tokens)
    finally:
        for h in handles:
            h.remove()
    return cache, states


@pytest.mark.parametrize("k", [1, 2, 3])
def test_k_dca_stack_holds_input_sum_and_last_k(k):
    cfg = dca({"grn": "dca", "k": k}, n_layers=6)
    model = perturbed(cfg)
    cache, states = run_states(model, random_tokens(cfg, pos=8))
    f = [cache[f"blocks.{j}.hook_attn_out"] + cache[f"blocks.{j}.hook_mlp_out"] for j in range(6)]
    saw_sum = False
    for t, state in enumerate(states):
        outs = f[: t + 1]  # outputs of blocks 0..t are on the stack after block t
        assert len(state.entries) <= k + 2
        assert torch.equal(state.entries[0], cache["hook_embed"])
        if len(outs) <= k:
            expected = outs
        else:
            older = outs[:-k]
            total = older[0]
            for x in older[1:]:
                total = total + x
            expected = [total] + outs[-k:]
            saw_sum = saw_sum or len(older) > 1
        assert len(state.entries) == 1 + len(expected)
        for got, want in zip(state.entries[1:], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
    assert saw_sum
    # GRN parameters per stack position: block t reads min(t + 1, k + 2) entries
    for t in range(6):
        assert model.blocks[t].attn_mix.q.b.shape == (min(t + 1, k + 2), cfg.d_model)
    assert model.readout_mix.b.shape == (k + 2, cfg.d_model)


def test_weight_structure_per_variant():
    """v1 scalar and static; v2 per-feature and static; v3 and dca per-feature and per-token."""
    tokens = random_tokens(dca({}), pos=8)
    for grn in ("v1", "v2", "v3", "dca"):
        cfg = dca({"grn": grn})
        _, cache = perturbed(cfg).run_with_cache(tokens)
        for c in consumers(cfg)[2:]:  # from block 1 on, where the stack has several entries
            w = cache[c.hook_weights]
            if grn == "v1":
                assert w.ndim == 3, c.label
            else:
                assert w.shape[-1] == cfg.d_model, c.label
                assert (w.std(-1) > 1e-3).any(), c.label  # differs across features
            spread = (w - w[:1, :1]).abs().max()
            if grn in ("v1", "v2"):
                assert spread == 0, c.label  # the same for every token
            else:
                assert spread > 1e-3, c.label  # input-dependent


def test_sources_of_one_entry_share_one_weight():
    """Block j's attn and mlp outputs share their weight; in k-DCA so do all members of the sum."""
    cfg = dca({"grn": "dca", "k": 1}, n_layers=4)
    _, cache = perturbed(cfg).run_with_cache(random_tokens(cfg, pos=8))
    w = cache["readout_mix.hook_weights"]  # sources: embed, 0.a, 0.m, 1.a, 1.m, 2.a, 2.m, 3.a, 3.m
    sum_members = w[:, :, 1:7]  # blocks 0..2 are in the sum entry, block 3 is the last k = 1
    assert (sum_members - sum_members[:, :, :1]).abs().max() == 0
    assert torch.equal(w[:, :, 7], w[:, :, 8])
    assert (w[:, :, 7] - w[:, :, 1]).abs().max() > 1e-3  # a different entry, a different weight
    mlp = cache["blocks.2.mlp_mix.hook_weights"]
    q = cache["blocks.2.attn_mix.q.hook_weights"]
    assert torch.equal(mlp[:, :, :-1], q) and (mlp[:, :, -1] == 1).all()  # q GRN + 1 on 2.attn


def naive_grn(params, entries, variant):
    """sum_i (b_i + relu(w . rmsnorm(g_i))) g_i, one entry at a time, straight from the parameters."""
    out = 0
    for i, g in enumerate(entries):
        c = params["b"][i]
        if variant in ("v3", "dca"):
            c = c + torch.relu((rms_norm(g) * params["w"]).sum(-1, keepdim=True))
        out = out + c * g
    return out


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
def test_naive_grn_equals_hook_in(options):
    cfg = dca(options, n_layers=4)
    model = perturbed(cfg)
    _, cache = model.run_with_cache(random_tokens(cfg, pos=8))
    params = dict(model.named_parameters())
    variant, k = cfg.options.grn, cfg.options.k
    f = [cache[f"blocks.{j}.hook_attn_out"] + cache[f"blocks.{j}.hook_mlp_out"] for j in range(4)]

    def stack(t):
        outs = f[:t]
        if k is None or len(outs) <= k:
            return [cache["hook_embed"]] + outs
        return [cache["hook_embed"], sum(outs[:-k])] + outs[-k:]

    def grn(prefix, t):
        p = {"b": params[f"{prefix}.b"], "w": params.get(f"{prefix}.w")}
        return naive_grn(p, stack(t), variant)

    def close(got, want):
        assert (got - want).abs().max() <= 1e-12 * want.abs().max()

    for t in range(4):
        views = ("q", "k", "v") if variant == "dca" else (None,)
        for view in views:
            prefix = f"blocks.{t}.attn_mix" + (f".{view}" if view else "")
            close(cache[f"{prefix}.hook_in"], grn(prefix, t))
        skip = grn(f"blocks.{t}.attn_mix" + (".q" if variant == "dca" else ""), t)
        close(cache[f"blocks.{t}.mlp_mix.hook_in"], skip + cache[f"blocks.{t}.hook_attn_out"])
    close(cache["readout_mix.hook_in"], grn("readout_mix", 4))
    if variant in ("v3", "dca"):  # the native gate hook: relu(w . N(g_i)), [batch, pos, entry]
        w = params["readout_mix.w"]
        want = torch.stack([torch.relu((rms_norm(g) * w).sum(-1)) for g in stack(4)], -1)
        close(cache["readout_mix.hook_gate"], want)
        assert (want > 0).any() and (want == 0).any()  # the relu is active on both sides


def test_dca_hooks_live_on_the_views():
    model = build(dca({"grn": "dca"}, n_layers=2))
    hooks = list(model.hook_dict)
    assert "blocks.0.attn_mix.hook_in" not in hooks and "blocks.0.attn_mix.hook_weights" not in hooks
    for view in "qkv":
        for hook in ("hook_in", "hook_weights", "hook_gate"):
            assert f"blocks.1.attn_mix.{view}.{hook}" in hooks
    assert get_scheme("dca").views(model.cfg.options, "attn") == ("q", "k", "v")
    assert get_scheme("dca").views(model.cfg.options, "mlp") == ()
    assert get_scheme("dca").views(build_options(get_scheme("dca"), {"grn": "v3"}), "attn") == ()


@pytest.mark.parametrize("values", [{"k": 0}, {"k": "-2"}, {"grn": "v4"}])
def test_validate_rejects_bad_options(values):
    with pytest.raises(ConfigError):
        tiny("dca", values)


def test_options_parse_from_strings():
    opts = build_options(get_scheme("dca"), {"grn": "v2", "k": "3"})
    assert (opts.grn, opts.k) == ("v2", 3)
    assert build_options(get_scheme("dca"), {"k": "none"}).k is None


@pytest.mark.parametrize(
    "options, keys",
    [
        (
            {},
            [f"blocks.{b}.attn_mix.{v}.{p}" for b in (0, 1) for v in "kqv" for p in "bw"]
            + ["readout_mix.b", "readout_mix.w"],
        ),
        ({"grn": "v1"}, ["blocks.0.attn_mix.b", "blocks.1.attn_mix.b", "readout_mix.b"]),
        (
            {"grn": "v3", "k": 1},
            [f"blocks.{b}.attn_mix.{p}" for b in (0, 1) for p in "bw"] + ["readout_mix.b", "readout_mix.w"],
        ),
    ],
)
def test_parameter_names_are_those_of_existing_checkpoints(options, keys):
    """The names written by the DCA module before it went through the protocol (ports and views), so
    checkpoints saved then still load (listed from that code)."""
    model = build(dca(options, n_layers=2))
    assert sorted(k for k in model.state_dict() if "_mix" in k) == sorted(keys)


def test_dca_attention_is_a_views_mixer_with_one_port_per_view():
    from depthscope.schemes.base import Port, ViewsMixer

    mixer = build(dca({})).blocks[1].attn_mix
    assert isinstance(mixer, ViewsMixer) and not isinstance(mixer, Port)
    assert all(isinstance(getattr(mixer, v), Port) for v in "qkv")
    assert not hasattr(mixer, "hook_in") and not hasattr(mixer, "hook_weights")
