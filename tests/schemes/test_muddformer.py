"""MUDDFormer: the standard residual at init, a naive re-implementation, per-token weights, capture."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthscope.analysis.causal import views
from depthscope.cli import main
from depthscope.corpus import Corpus
from depthscope.errors import ConfigError
from depthscope.probes import capture
from depthscope.schemes import consumers, sources
from depthscope.schemes._common import EPS
from depthscope.schemes.base import build_options, get_scheme
from depthscope.schemes.muddformer import WAYS, hidden_size
from depthscope.trace import load_trace
from depthscope.train import TrainConfig, decayed_parameters, train
from tests.helpers import build, perturb, random_tokens, reconstruct, share_weights, tiny


def mudd(n_layers: int = 4, **options):
    return tiny("muddformer", options or None, n_layers=n_layers)


def perturbed(cfg, seed: int = 5, scale: float = 0.5):
    """Off initialisation in float64: noise on a, W1 and W2 (W2 nonzero makes the weights per token)."""
    return perturb(build(cfg, dtype=torch.float64), scale, seed)


def test_same_seed_is_the_standard_model_at_init():
    """a one-hot on X_i and W2 = 0: a muddformer built after the same seed as a standard model has
    the same weights outside its mixers and the same logits (exactly: every mix is 1 * X_i + 0)."""
    cfg = mudd()
    model, standard = build(cfg, seed=3), build(tiny("standard", n_layers=4), seed=3)
    theirs = standard.state_dict()
    for name, value in model.state_dict().items():
        if "_mix" not in name:
            assert torch.equal(value, theirs[name]), name
    tokens = random_tokens(cfg)
    a, b = standard(tokens), model(tokens)
    assert (a - b).abs().max() <= 1e-6 * a.abs().max()


def test_every_way_reads_the_standard_stream_at_init():
    """Each of q, k, v and r, the MLP input and the read-out equal the standard residual's inputs
    (float64, 1e-12)."""
    cfg = mudd()
    standard = build(tiny("standard", n_layers=4), dtype=torch.float64)
    model = share_weights(standard, build(cfg, seed=9, dtype=torch.float64))
    tokens = random_tokens(cfg)
    _, cache_a = standard.run_with_cache(tokens)
    _, cache_b = model.run_with_cache(tokens)
    for c in consumers(cfg):
        plain = f"{c.hook_in.rsplit('.', 2)[0]}.hook_in" if c.view else c.hook_in
        ref = cache_a[plain]
        assert (cache_b[c.hook_in] - ref).abs().max() <= 1e-12 * ref.abs().max(), c.label
        w = cache_b[c.hook_weights]
        assert torch.equal(w, torch.ones_like(w)), c.label  # the standard residual's delta basis


def naive_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """MUDDFormer written out from the paper's equations, loop by loop, on the model's own weights."""

    def aggregate(mix, xs, ways):
        x = xs[-1]
        normed = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        dyn = F.gelu(normed @ mix.w1) @ mix.w2  # [batch, pos, way * state], way-major
        out = []
        for c in range(ways):
            weight = [dyn[..., c * len(xs) + j] + mix.a[c, j] for j in range(len(xs))]
            out.append(sum(w[..., None] * xj for w, xj in zip(weight, xs)))
        return out

    x0 = model.embed(tokens)
    xs = [x0]
    for b, block in enumerate(model.blocks):
        q, k, v, r = (x0,) * 4 if b == 0 else aggregate(block.attn_mix, xs, 4)
        h = r + block.attn((q, k, v))
        xs.append(h + block.mlp(h))
    (final,) = aggregate(model.readout_mix, xs, 1)
    return model.unembed(model.ln_final(final))


def test_agrees_with_a_naive_implementation_off_init():
    cfg = mudd()
    model = perturbed(cfg)
    tokens = random_tokens(cfg)
    a, b = model(tokens), naive_logits(model, tokens)
    assert (a - b).abs().max() <= 1e-12 * a.abs().max()


def test_causal_off_init():
    """Per-token weights come from the token's own state: a later token never changes earlier logits."""
    cfg = mudd()
    model = perturbed(cfg)
    tokens = random_tokens(cfg)
    t = cfg.ctx // 3
    changed = tokens.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 7) % 256
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=0)
    assert (a[:, t + 1] - b[:, t + 1]).abs().max() > 0


def test_delta_basis_is_exact_off_init():
    """hook_weights x sources rebuild every hook_in, q/k/v/r rows, MLP rows and read-out (float64)."""
    cfg = mudd()
    rebuilt = reconstruct(perturbed(cfg), random_tokens(cfg))
    assert set(rebuilt) == {c.label for c in consumers(cfg)}
    for label, (h, r) in rebuilt.items():
        err = float((h - r).norm() / h.norm())
        assert err <= 1e-12, f"{label}: relative error {err:.2e}"


def test_mlp_row_is_the_r_row_plus_its_own_attention():
    cfg = mudd()
    model = perturbed(cfg)
    _, cache = model.run_with_cache(random_tokens(cfg))
    for b in range(cfg.n_layers):
        r = cache[f"blocks.{b}.attn_mix.r.hook_weights"]
        m = cache[f"blocks.{b}.mlp_mix.hook_weights"]
        assert m.shape[-1] == r.shape[-1] + 1
        assert torch.equal(m[..., :-1], r) and torch.equal(m[..., -1], torch.ones_like(m[..., -1]))


def test_perturbed_w2_makes_weights_differ_across_tokens_and_ways():
    """W2 = 0 gives weights a, the same at every token; a nonzero W2 makes them per token, and the
    four ways differ (their rows of W2 differ)."""
    cfg = mudd()
    model = perturb(build(cfg, dtype=torch.float64), 0.5, 2, match="w2")
    _, cache = model.run_with_cache(random_tokens(cfg))
    for b in range(1, cfg.n_layers):
        ws = [cache[f"blocks.{b}.attn_mix.{w}.hook_weights"] for w in WAYS]
        for w in ws:
            assert float(w.std(dim=(0, 1)).min()) > 1e-3  # every source's weight varies over tokens
        assert min(float((ws[i] - ws[j]).abs().max()) for i in range(4) for j in range(i)) > 1e-3
    assert float(cache["readout_mix.hook_weights"].std(dim=(0, 1)).min()) > 1e-3


def test_a_few_training_steps_make_the_weights_per_token():
    """From init (W2 = 0, weights the same at every token) three SGD steps move W2 (its gradient
    GELU(z)^T g is nonzero with W1 random) and the weights become per token."""
    cfg = mudd(n_layers=3)
    model = build(cfg).train()
    w2 = {n: p for n, p in model.named_parameters() if n.endswith(".w2")}
    assert len(w2) == cfg.n_layers and all((p == 0).all() for p in w2.values())  # blocks 1.. and read-out
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tokens = random_tokens(cfg, batch=4, seed=2)
    for _ in range(3):
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        opt.step()
    model.eval()
    _, cache = model.run_with_cache(random_tokens(cfg))
    assert all((p != 0).any() for p in w2.values())
    for c in consumers(cfg):
        if (c.site.block >= 1 and c.view) or c.site.kind == "readout":
            spread = float(cache[c.hook_weights].std(dim=(0, 1)).max())
            assert spread > 1e-6, f"{c.label}: weights the same at every token ({spread:.1e})"


def test_parameters_shapes_and_weight_decay():
    """a [way, state] (the paper's dense_bs), W1 [d, hidden], W2 [hidden, way * state] on blocks 1..D-1
    and the read-out (one way); none on block 0; W1 and W2 decayed, a not."""
    cfg = mudd(n_layers=3)
    model = build(cfg)
    params = dict(model.named_parameters())
    assert not [n for n in params if n.startswith("blocks.0.attn_mix")]
    for b in (1, 2):
        n = b + 1
        h = hidden_size(cfg, 4, n, last=False)
        assert h == 64  # 4 * n <= 12 rounds up to 64
        assert params[f"blocks.{b}.attn_mix.a"].shape == (4, n)
        assert params[f"blocks.{b}.attn_mix.w1"].shape == (cfg.d_model, h)
        assert params[f"blocks.{b}.attn_mix.w2"].shape == (h, 4 * n)
        assert torch.equal(params[f"blocks.{b}.attn_mix.a"][:, -1], torch.ones(4))
    assert params["readout_mix.a"].shape == (1, cfg.n_layers + 1)
    assert params["readout_mix.w2"].shape == (64, cfg.n_layers + 1)
    decayed = decayed_parameters(model)
    mixing = {n for n in params if "_mix" in n}
    assert {n for n in mixing if n in decayed} == {n for n in mixing if n.endswith((".w1", ".w2"))}
    w1_std = float(params["blocks.1.attn_mix.w1"].detach().std())  # 1024 draws: sd of the estimate ~2%
    assert w1_std == pytest.approx(1 / math.sqrt(cfg.d_model), rel=0.2)


def test_hidden_width_rule_and_option():
    cfg = mudd()
    assert hidden_size(cfg, 4, 16, last=False) == 128  # 64 -> past the next multiple: 128
    assert hidden_size(cfg, 1, 9, last=True) == 64  # 36 -> 64
    small = mudd(hidden=8)
    assert build(small).blocks[1].attn_mix.w1.shape == (small.d_model, 8)
    assert build_options(get_scheme("muddformer"), {"hidden": "8"}).hidden == 8


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_validate_rejects_bad_hidden(value):
    with pytest.raises(ConfigError, match="hidden"):
        mudd(hidden=value)


def test_capture_reads_q_k_v_r_depths_and_native_weights():
    """The engine's identity check passes off init; ``analysis.views`` gives the four ways' read depths
    (at init each way is the standard row: block b's attention reads lags 1..2b + 1, mean b + 1)."""
    cfg = mudd()
    trace = capture(perturbed(cfg).float(), random_tokens(cfg), progress=False)
    assert float(trace["residual_error"].max()) < 1e-5
    v = views(trace)
    assert list(v["view"].values) == list(WAYS) and list(v["block"].values) == list(range(cfg.n_layers))
    assert np.isfinite(v["mean_lag"].values).all()
    static = trace["mudd_static"]
    assert static.dims == ("aggregate", "way", "state") and static.sizes["state"] == cfg.n_layers + 1
    assert np.isnan(static.sel(aggregate=cfg.n_layers, way="q")).all()  # the read-out has one way
    assert "residual way" in trace.attrs["consumer_input"]
    init = views(capture(build(cfg), random_tokens(cfg), progress=False))
    for b in range(cfg.n_layers):
        assert np.allclose(init["mean_lag"].sel(block=b).values, b + 1, atol=1e-9)


def test_short_training_then_cli_capture(tmp_path):
    """A 2-block muddformer trained a few steps, saved, captured by ``depthscope capture``: the identity
    check passes, and the weights of the ways vary over tokens."""
    corpus = Corpus("loops", b"for i in range(10):\n    total += i * i\n" * 400)
    cfg = mudd(n_layers=2)
    model = train(cfg, TrainConfig(steps=8, batch_size=4, lr=1e-2, eval_tokens=256), corpus, progress=False)
    path = model.save(tmp_path / "mudd.safetensors")
    out = tmp_path / "mudd.nc"
    args = ["capture", str(path), "--out", str(out), "--tokens", "256", "--batch-size", "4", "--quiet"]
    assert main(args) == 0
    trace = load_trace(out)
    assert trace.attrs["scheme"] == "muddformer"
    assert float(trace["residual_error"].max()) < 1e-4
    assert [str(x) for x in trace["layer"].values] == [c.label for c in consumers(cfg)]
    assert [str(x) for x in trace["source"].values] == [s.label for s in sources(cfg)]
    assert float(trace["mixing_std"].sel(layer="1.attn.q").max()) > 0


def known_static(cfg):
    """A float64 muddformer whose static weights a are known distinct values, sign, way, state and
    aggregate all telling (``static_value``); W2 stays 0, so every weight is its a, the same at every
    token."""
    model = build(cfg, dtype=torch.float64)
    d = cfg.n_layers
    with torch.no_grad():
        for b in range(1, d):
            a = model.blocks[b].attn_mix.a  # [way, state]: rows q, k, v, r
            for c in range(4):
                for j in range(b + 1):
                    a[c, j] = static_value(b, c, j)
        for j in range(d + 1):
            model.readout_mix.a[0, j] = static_value(d, 3, j)  # the read-out's one way is the r way
    return model


def static_value(aggregate: int, way: int, state: int) -> float:
    """Distinct for every (aggregate, way, state), exact in binary, of both signs."""
    return (-1) ** (way + state) * (aggregate + way / 4 + state / 32 + 0.5)


def test_captured_static_weights_are_the_models_own_a():
    """``mudd_static`` [aggregate, way, state] is, exactly, blocks.{b}.attn_mix.a[way, state] for the
    aggregates b = 1..D-1 (ways q, k, v, r: a's rows in that order; states X_0..X_b: its columns) and
    readout_mix.a[0, state] in the r row of aggregate D; NaN where an aggregate has no such weight."""
    cfg = mudd()
    d = cfg.n_layers
    model = known_static(cfg)
    static = capture(model, random_tokens(cfg), progress=False)["mudd_static"]
    assert list(static["aggregate"].values) == list(range(1, d + 1))
    assert list(static["way"].values) == ["q", "k", "v", "r"]
    assert list(static["state"].values) == [f"X_{j}" for j in range(d + 1)]
    want = np.full((d, 4, d + 1), np.nan)
    for b in range(1, d):
        want[b - 1, :, : b + 1] = model.blocks[b].attn_mix.a.detach().numpy()
        for c, way in enumerate("qkvr"):
            for j in range(b + 1):
                assert float(static.sel(aggregate=b, way=way, state=f"X_{j}")) == static_value(b, c, j)
    want[d - 1, 3] = model.readout_mix.a.detach().numpy()[0]
    assert float(static.sel(aggregate=d, way="r", state="X_0")) == static_value(d, 3, 0)
    np.testing.assert_array_equal(static.values, want)  # NaN where want has NaN


def test_static_weights_are_what_each_way_reads():
    """With W2 = 0 the weights are the static a, so the captured ``mixing`` of every q, k, v, r row and
    of the read-out follows from ``mudd_static`` alone, through the delta basis written out here:
    X_0 = embed, X_{b+1} = Xbar_b^R + attn_b + mlp_b, Xbar_b^c = sum_j mudd_static[b, c, j] X_j
    (every way of block 0 reads X_0). A way's static row read as another way's fails."""
    cfg = mudd()
    d = cfg.n_layers
    trace = capture(known_static(cfg), random_tokens(cfg), progress=False)
    static = trace["mudd_static"]
    n = 2 * d + 1  # sources: embed, then each block's attention and MLP
    coef = [np.eye(n)[0]]  # X_j's coefficients over the sources

    def mix(b, way):
        return sum(float(static.sel(aggregate=b, way=way, state=f"X_{j}")) * coef[j] for j in range(b + 1))

    for b in range(d):
        ways = {w: coef[0] for w in "qkvr"} if b == 0 else {w: mix(b, w) for w in "qkvr"}
        for w, row in ways.items():
            got = trace["mixing"].sel(layer=f"{b}.attn.{w}").values
            np.testing.assert_allclose(got[: 2 * b + 1], row[: 2 * b + 1], rtol=1e-12, atol=1e-12)
        coef.append(ways["r"] + np.eye(n)[2 * b + 1] + np.eye(n)[2 * b + 2])
    readout = trace["mixing"].sel(layer="readout").values
    np.testing.assert_allclose(readout, mix(d, "r"), rtol=1e-12, atol=1e-12)
