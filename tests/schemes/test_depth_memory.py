"""The schemes that mix depth inside attention (value residual, Depth-Attention, MoDA): each model
against an oracle written here from the papers' equations and the model's own weights (plain
float64 torch, not the scheme code), and the trace's depth rows against the same oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthscope.errors import TraceError
from depthscope.probes.capture import capture
from depthscope.schemes import consumers, sources
from tests.helpers import assert_standard_at_init, build, perturb, random_tokens, tiny

EPS = 1e-6  # the models' RMS epsilon
CASES = [
    ("value-residual", {}),
    ("value-residual", {"mode": "x0"}),
    ("depth-attention", {}),
    ("moda", {}),
    ("moda", {"norm": "post"}),
]


def rms(x, gain=None):
    y = x / torch.sqrt(x.square().mean(-1, keepdim=True) + EPS)
    return y if gain is None else y * gain


def rope(x):
    """RoFormer rotation of [head, pos, d_head]: pairs (i, i + d_head/2), angle pos / 10000^(2i/d_head)."""
    dh = x.shape[-1]
    inv = 10000.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    ang = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * inv[None]
    cos, sin = ang.cos().float().double(), ang.sin().float().double()  # the model keeps float32 tables
    a, b = x[..., : dh // 2], x[..., dh // 2 :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


class Oracle:
    """The forward of one sequence [pos] of a tiny model, from its state dict and the equations."""

    def __init__(self, model):
        self.p = {k: v.double() for k, v in model.state_dict().items()}
        self.cfg = model.cfg
        self.h = model.cfg.n_heads
        self.mass: dict[int, torch.Tensor] = {}  # block -> [head, pos, block] depth mass
        self.parts: dict[int, torch.Tensor] = {}  # block -> [pos, block, d_model] parts of the write

    def heads(self, x):
        return x.reshape(x.shape[0], self.h, -1).transpose(0, 1)

    def seq_probs(self, q, k):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        n = s.shape[-1]
        return s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))

    def attention(self, i, x, memory):
        p, scheme, opts = self.p, self.cfg.scheme, self.cfg.options
        xn = rms(x, p[f"blocks.{i}.attn.norm.weight"])
        q0, k0, v = (self.heads(xn @ p[f"blocks.{i}.attn.W_{m}.weight"].T) for m in "QKV")
        q, k = rope(q0), rope(k0)
        terms = {}  # block -> [head, pos, d_head]
        mass = {}
        if scheme == "value-residual" and opts.mode == "value":
            a = torch.softmax(self.seq_probs(q, k), -1)
            if i == 0:
                memory.append(v)
                terms[0], mass[0] = a @ v, torch.ones(a.shape[:2], dtype=torch.float64)
            else:
                lam = p[f"blocks.{i}.attn.lambdas"]
                terms[i], terms[0] = a @ (lam[0] * v), a @ (lam[1] * memory[0])
                mass[i] = lam[0] * torch.ones(a.shape[:2], dtype=torch.float64)
                mass[0] = lam[1] * torch.ones(a.shape[:2], dtype=torch.float64)
        elif scheme == "depth-attention":
            keys = [m[0] for m in memory] + [k0]
            vals = [m[1] for m in memory] + [v]
            scores = torch.stack([(q0 * kj).sum(-1) for kj in keys], -1) / math.sqrt(q0.shape[-1])
            alpha = torch.softmax(scores, -1)  # [head, pos, j]
            a = torch.softmax(self.seq_probs(q, k), -1)
            for j, vj in enumerate(vals):
                terms[j], mass[j] = a @ (alpha[..., j, None] * vj), alpha[..., j]
            memory.append((k0, v))
        elif scheme == "moda":
            seq = self.seq_probs(q, k)
            dep = [(q0 * kj).sum(-1, keepdim=True) / math.sqrt(q0.shape[-1]) for kj, _ in memory]
            probs = torch.softmax(torch.cat([seq, *dep], -1), -1)
            n = seq.shape[-1]
            terms[i], mass[i] = probs[..., :n] @ v, probs[..., :n].sum(-1)
            for j, (_, vj) in enumerate(memory):
                terms[j], mass[j] = probs[..., n + j, None] * vj, probs[..., n + j]
        else:
            a = torch.softmax(self.seq_probs(q, k), -1)
            terms[i], mass[i] = a @ v, torch.ones(a.shape[:2], dtype=torch.float64)
        wo = p[f"blocks.{i}.attn.W_O.weight"]
        merge = lambda z: z.transpose(0, 1).reshape(z.shape[1], -1) @ wo.T  # noqa: E731
        full = torch.full((*q.shape[:2], self.cfg.n_layers), float("nan"), dtype=torch.float64)
        for j, m in mass.items():
            full[..., j] = m
        self.mass[i] = full
        parts = torch.full((q.shape[1], self.cfg.n_layers, x.shape[-1]), float("nan"), dtype=torch.float64)
        for j, t in terms.items():
            parts[:, j] = merge(t)
        self.parts[i] = parts
        return merge(sum(terms.values()))

    def mlp(self, i, x, memory):
        p = self.p
        xn = rms(x, p[f"blocks.{i}.mlp.norm.weight"])
        if f"blocks.{i}.mlp.depth_kv.W_K.weight" in p:
            kv = (self.heads(xn @ p[f"blocks.{i}.mlp.depth_kv.W_{m}.weight"].T) for m in "KV")
            memory.append(tuple(kv))
        return F.gelu(xn @ p[f"blocks.{i}.mlp.W_in.weight"].T) @ p[f"blocks.{i}.mlp.W_out.weight"].T

    def __call__(self, tokens):
        p, opts = self.p, self.cfg.options
        x0 = x = p["embed.weight"][tokens]
        post = getattr(opts, "norm", "pre") == "post"
        memory: list = []
        for i in range(self.cfg.n_layers):
            if getattr(opts, "mode", None) == "x0":
                x = p[f"blocks.{i}.attn_mix.a"] * x + p[f"blocks.{i}.attn_mix.b"] * x0
            for f in (self.attention, self.mlp):
                x = x + f(i, x, memory)
                x = rms(x) if post else x
        return rms(x, p["ln_final.weight"]) @ p["unembed.weight"].T


def moved(scheme, options, seed=0):
    """A float64 tiny model moved off its initialisation (mixers and sublayers)."""
    return perturb(build(tiny(scheme, options), dtype=torch.float64), scale=0.3, seed=seed, others=0.05)


@pytest.mark.parametrize(("scheme", "options"), CASES, ids=[f"{s}{o}" for s, o in CASES])
def test_the_model_equals_the_oracle_written_from_the_equations(scheme, options):
    model = moved(scheme, options)
    tokens = random_tokens(model.cfg)
    oracle = Oracle(model)
    with torch.no_grad():
        got = model(tokens)
    want = torch.stack([oracle(t) for t in tokens])
    err = float((got - want).norm() / want.norm())
    assert err <= 1e-12, err  # the same float64 arithmetic in another order


@pytest.mark.parametrize(("scheme", "options"), [c for c in CASES if c[1] != {"mode": "x0"}])
def test_the_depth_mass_and_the_parts_of_each_write_equal_the_oracle(scheme, options):
    model = moved(scheme, options)
    tokens = random_tokens(model.cfg)
    _, cache = model.run_with_cache(tokens)
    for b, seq in enumerate(tokens):
        oracle = Oracle(model)
        oracle(seq)
        for i in range(model.cfg.n_layers):
            mass = cache[f"blocks.{i}.attn.hook_depth_mass"][b].transpose(0, 1)  # [head, pos, block]
            parts = cache[f"blocks.{i}.attn.hook_parts"][b]
            torch.testing.assert_close(mass, oracle.mass[i], rtol=1e-12, atol=1e-12, equal_nan=True)
            torch.testing.assert_close(parts, oracle.parts[i], rtol=1e-12, atol=1e-12, equal_nan=True)
            out = cache[f"blocks.{i}.hook_attn_out"][b]
            err = float((parts.nan_to_num(0.0).sum(-2) - out).norm() / out.norm())
            assert err <= 1e-13, (i, err)


@pytest.mark.parametrize("scheme", ["depth-attention", "moda"])
def test_the_heads_masses_over_depth_sum_to_one(scheme):
    """Depth-Attention's alpha and MoDA's joint softmax (the sequence's mass on the layer's own
    block) are distributions over the blocks a head reads."""
    model = moved(scheme, {})
    _, cache = model.run_with_cache(random_tokens(model.cfg))
    for i in range(model.cfg.n_layers):
        mass = cache[f"blocks.{i}.attn.hook_depth_mass"]
        err = float((mass.nansum(-1) - 1).abs().max())
        assert err <= 1e-12, (i, err)
        assert bool(mass[..., i + 1 :].isnan().all())  # a layer never reads a later block


def test_moda_post_norm_renormalises_the_stream_after_every_write():
    """Each consumer input after the first is RMSNorm (weightless) of the previous input plus the
    previous sublayer's output: x_{l+1} = (x_l + f_l) / sqrt(mean((x_l + f_l)^2) + eps)."""
    model = moved("moda", {"norm": "post"})
    _, cache = model.run_with_cache(random_tokens(model.cfg))
    cons, srcs = consumers(model.cfg), sources(model.cfg)
    for prev, nxt, out in zip(cons, cons[1:], srcs[1:]):
        pre = cache[prev.hook_in] + cache[out.hook]
        want = pre / torch.sqrt(pre.square().mean(-1, keepdim=True) + EPS)
        err = float((cache[nxt.hook_in] - want).norm() / want.norm())
        assert err <= 1e-14, (nxt.label, err)


def test_the_x0_variant_starts_as_the_standard_residual():
    assert_standard_at_init(build(tiny("value-residual", {"mode": "x0"})))


@pytest.mark.parametrize(("scheme", "options"), [c for c in CASES if c[1] != {"mode": "x0"}])
def test_the_trace_keeps_the_depth_rows_and_its_shares_still_sum_to_one(scheme, options):
    """The trace's depth rows (float32 capture) against the float64 oracle on the same windows:
    the token mean of the depth mass, and each part's share of its write, sum <part, write> over
    sum |write|^2; the parts' shares sum to 1 and the stream's shares still do."""
    model = perturb(build(tiny(scheme, options)), scale=0.3, others=0.05)
    tokens = random_tokens(model.cfg, batch=4, pos=16)
    trace = capture(model, tokens, batch_size=2, progress=False)
    assert float(abs(trace["contribution_share"].sum("source") - 1).max()) <= 1e-6
    mass, dots, total = 0.0, 0.0, 0.0
    for seq in tokens:
        oracle = Oracle(model)
        write = {i: p.nan_to_num(0.0).sum(-2) for i, p in (oracle(seq), oracle.parts)[1].items()}
        mass = mass + torch.stack([oracle.mass[i].mean(1).T for i in range(model.cfg.n_layers)])
        dots = dots + torch.stack([(oracle.parts[i] * write[i][:, None]).sum((0, 2)) for i in write])
        total = total + torch.stack([write[i].square().sum() for i in write])
    rows = [f"{i}.attn" for i in range(model.cfg.n_layers)]
    want_mass = (mass / len(tokens)).transpose(1, 2).numpy()  # [layer, head, block]
    got_mass = trace["depth_mass"].sel(layer=rows).values
    np.testing.assert_allclose(got_mass, want_mass, rtol=0, atol=2e-6)  # float32 softmax, token means
    want_split = (dots / total[:, None]).numpy()
    got_split = (trace["depth_write"] / trace["depth_write_total"]).sel(layer=rows).values
    np.testing.assert_allclose(got_split, want_split, rtol=0, atol=2e-5)
    assert float(np.abs(np.nansum(got_split, 1) - 1).max()) <= 1e-5  # the parts add up to the write


def test_the_parts_read_after_w_o_give_the_depth_rows_of_the_terms_before_it(monkeypatch):
    """The capture reads each attention's terms before W_O and maps once (``project``); reading the
    parts after W_O instead (``hook_parts``, no projection) gives the same depth rows, to float32
    rounding of the dots."""
    from dataclasses import replace

    model = perturb(build(tiny("depth-attention", {})), scale=0.3, others=0.05)
    tokens = random_tokens(model.cfg, batch=4, pos=16)
    before = capture(model, tokens, batch_size=2, progress=False)
    hooks = model.scheme.native_hooks(model.cfg)
    assert [h.project for h in hooks if h.parts_of] == [
        f"blocks.{i}.attn.W_O" for i in range(model.cfg.n_layers)
    ]
    after_w_o = [
        replace(h, hook=h.hook.replace("hook_terms", "hook_parts"), project=None) if h.parts_of else h
        for h in hooks
    ]
    monkeypatch.setattr(model.scheme, "native_hooks", classmethod(lambda cls, cfg: after_w_o))
    after = capture(model, tokens, batch_size=2, progress=False)
    for name in ("depth_write", "depth_write_total", "depth_mass"):
        np.testing.assert_allclose(after[name].values, before[name].values, rtol=1e-5, atol=1e-7)
    last = model.cfg.n_layers - 1  # reads every block: a finite part for each
    assert bool(np.isfinite(before["depth_write"].sel(layer=f"{last}.attn").values[: last + 1]).all())


def test_parts_that_do_not_add_up_to_the_write_are_refused():
    model = build(tiny("moda", {}))
    hook = model.blocks[1].attn.hook_terms  # what the capture listens to: the terms before W_O
    forward = hook.forward
    hook.forward = lambda t: forward(t * 1.01)  # a split that loses nothing but scales: 1% off
    with pytest.raises(TraceError, match=r"parts of 1\.attn's write do not add up"):
        capture(model, n_tokens=512, batch_size=4, progress=False)


def test_routed_shares_pass_an_attentions_share_on_to_the_blocks_its_write_came_through():
    """On a MoDA trace: the read-out's shares by block, written as one matrix product here (each
    source a row of its block's indicator, an attention's row replaced by its write split), sum to 1
    and equal ``routed_shares``; the report's figure draws exactly these bars."""
    from depthscope.analysis.native import routed_shares, write_split
    from depthscope.figures.causal import native_figure

    model = perturb(build(tiny("moda", {})), scale=0.3, others=0.05)
    trace = capture(model, random_tokens(model.cfg, batch=4, pos=16), batch_size=2, progress=False)
    share = trace["contribution_share"].sel(layer="readout").values
    split = write_split(trace)
    n_blocks = model.cfg.n_layers
    route = np.zeros((len(share), 1 + n_blocks))  # source -> (embed, blocks 0..)
    for s, label in enumerate(trace["source"].values):
        label = str(label)
        if label == "embed":
            route[s, 0] = 1.0
        elif label.endswith(".attn"):
            route[s, 1:] = np.nan_to_num(split.sel(layer=label).values)
        else:
            route[s, 1 + int(label.split(".")[0])] = 1.0
    want = share @ route
    got = routed_shares(trace)
    assert list(got["block"].values) == ["embed", *map(str, range(n_blocks))]
    np.testing.assert_allclose(got.values, want, rtol=0, atol=1e-12)
    assert abs(float(got.sum()) - 1) <= 1e-5
    own = np.array(
        [
            [
                1.0 if b == (0 if str(x) == "embed" else 1 + int(str(x).split(".")[0])) else 0.0
                for b in range(1 + n_blocks)
            ]
            for x in trace["source"].values
        ]
    )
    assert np.abs(want - share @ own).max() > 1e-3  # the routing moves share between blocks
    fig = native_figure(trace)
    bars = [p.get_height() for p in fig.axes[2].patches]
    np.testing.assert_allclose(bars[len(bars) // 2 :], got.values, rtol=0, atol=1e-12)
