"""``inspect``: one prompt, position by position, exact like every capture: its |h|^2-weighted mean
over positions is ``capture``'s share on the same tokens, for every kind of weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthscope import DepthscopeError
from depthscope.probes import capture, inspect
from depthscope.schemes import consumers, sources
from depthscope.schemes.base import get_scheme, variants
from depthscope.schemes.muddformer import WAYS
from tests.helpers import build, perturb, tiny
from tests.probes.adapters.spec_models import CTX, VOCAB, seeded

# unit, static, per-token and per-feature weights among them
SCHEMES = ["standard", "denseformer", "attnres", "dca", "hc"]
# every variant whose weights are per token (dca, dca-k2, grn-v3, attnres, attnres-block4, hc, mhc,
# shortswa, muddformer): the ones whose per-position rows a mean over positions cannot check
DYNAMIC = {
    label: (scheme, opts)
    for label, scheme, opts in variants()
    if not get_scheme(scheme).is_static(tiny(scheme, opts or None).options)
}


def weighted_mean(per_pos, rms):
    """The |h|^2-weighted mean over positions of a (pos, layer, source) share."""
    w = (rms**2).values[:, :, None]
    return np.nansum(per_pos.values * w, 0) / w.sum(0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_weighted_mean_over_positions_is_the_capture(scheme):
    model = build(tiny(scheme))
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))
    one = inspect(model, ids)
    trace = capture(model, ids, n_tokens=24, skip_positions=0, progress=False)
    assert one.sizes["pos"] == 24 and list(one.layer.values) == list(trace.layer.values)
    np.testing.assert_allclose(one["contribution_share"].sum("source"), 1.0, atol=1e-5)
    mean = weighted_mean(one["contribution_share"], one["input_rms"])
    avail = np.isfinite(trace["contribution_share"].values)
    np.testing.assert_allclose(mean[avail], trace["contribution_share"].values[avail], atol=1e-6)
    np.testing.assert_allclose(
        one["mixing"].mean("pos").values[avail], trace["mixing"].values[avail], atol=1e-6
    )
    assert float(one["residual_error"].max()) < 1e-4


def moved(cfg, seed: int = 3):
    """A float64 model of ``cfg`` off its initialisation (mixers most), so that its weights vary over
    positions (at initialisation every scheme's weights are the same at every token)."""
    return perturb(build(cfg, seed=seed, dtype=torch.float64), scale=0.3, seed=seed, others=0.05)


def hooked(model, ids):
    """Each source, consumer input and consumer weights of one forward, by plain forward hooks on the
    model's own modules (not through any adapter): {hook name: value [pos, ...] of the one prompt}."""
    cfg = model.cfg
    names = [s.hook for s in sources(cfg)] + [n for c in consumers(cfg) for n in (c.hook_in, c.hook_weights)]
    got = {}

    def keep(name):
        def hook(module, args, out):
            got[name] = out.detach()[0]

        return hook

    handles = [model.get_submodule(n).register_forward_hook(keep(n)) for n in names]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return got


def per_position(model, ids):
    """(mixing, share), each [pos, layer, source] (NaN where a source is not available), computed
    position by position from hooked tensors: M[l, s] (its mean over features when per feature) and
    <c[l, s], h_l> / |h_l|^2 with c[l, s] = M[l, s] (*) v_s, at each position."""
    got = hooked(model, ids)
    srcs, cons = sources(model.cfg), consumers(model.cfg)
    pos = ids.shape[1]
    mixing = np.full((pos, len(cons), len(srcs)), np.nan)
    share = np.full((pos, len(cons), len(srcs)), np.nan)
    for i, c in enumerate(cons):
        w, h = got[c.hook_weights], got[c.hook_in]  # [pos, n], [pos, n, d] or [pos, m, n, m]; [pos, d]
        block = w.ndim == 4  # Frac-Connections: fraction f of c[l, s] is sum_g w[f, s, g] v_s[g]
        for p in range(pos):
            for s in range(w.shape[2] if block else w.shape[1]):
                v = got[srcs[s].hook][p]
                if block:
                    m = w.shape[1]
                    fr = v.unflatten(0, (m, -1))
                    part = torch.cat([sum(w[p, f, s, g] * fr[g] for g in range(m)) for f in range(m)])
                    mixing[p, i, s] = float(sum(w[p, f, s, f] for f in range(m)) / m)
                else:
                    part = w[p, s] * v  # c[l, s] at position p, [d]
                    mixing[p, i, s] = float(w[p, s].mean())
                share[p, i, s] = float(part @ h[p] / (h[p] @ h[p]))
    return mixing, share


@pytest.mark.parametrize("label", list(DYNAMIC))
def test_each_position_is_the_weights_and_shares_hooked_at_that_position(label):
    """Off initialisation (float64), each position's ``mixing`` and ``contribution_share`` are the
    weights and the share <c[l, s], h_l> / |h_l|^2 hooked at that very position: a permutation of the
    positions (reversed, shifted by one) keeps every mean over positions but fails here."""
    scheme, opts = DYNAMIC[label]
    cfg = tiny(scheme, opts or None)
    model = moved(cfg)
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(4))
    one = inspect(model, ids)
    assert list(one.layer.values) == [c.label for c in consumers(cfg)]
    assert list(one.source.values) == [s.label for s in sources(cfg)]
    mixing, share = per_position(model, ids)
    # the test model's weights (and shares) really differ from position to position: reversing the
    # positions or shifting them by one would move them by far more than the tolerance
    for want in (mixing, share):
        assert np.nanmax(np.abs(want - want[::-1])) > 1e-2, label
        assert np.nanmax(np.abs(want[1:] - want[:-1])) > 1e-2, label
    np.testing.assert_array_equal(np.isnan(one["mixing"].values), np.isnan(mixing))
    np.testing.assert_allclose(one["mixing"].values, mixing, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(one["contribution_share"].values, share, rtol=1e-9, atol=1e-12)
    assert float(one["residual_error"].max()) < 1e-10


def test_the_per_token_variants_are_the_dynamic_schemes():
    assert {"dca", "grn-v3", "attnres", "hc", "mhc", "shortswa", "muddformer"} <= set(DYNAMIC)
    assert not {"standard", "denseformer", "hc-static", "grn-v1", "grn-v2"} & set(DYNAMIC)


def test_muddformer_ways_at_each_position_are_its_own_weight_mlp():
    """MUDDFormer's block 1 mixes X_0 = embed and X_1 = embed + attn_0 + mlp_0 with A = its weight MLP's
    output at X_1, per token (``dense_weights``, called here on the hooked X_1): way c's row over
    (embed, 0.attn, 0.mlp) at each position is (A[c, 0] + A[c, 1], A[c, 1], A[c, 1])."""
    cfg = tiny("muddformer")
    model = moved(cfg)
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(4))
    one = inspect(model, ids)
    got = hooked(model, ids)
    x1 = got["blocks.0.mlp_mix.hook_in"] + got[sources(cfg)[2].hook]  # X_A + mlp_0 = X_1, [pos, d]
    with torch.no_grad():
        a = model.blocks[1].attn_mix.dense_weights(x1).numpy()  # [pos, way, state]
    assert a.std(0).min() > 1e-2  # per token: every way's weight on every state varies over positions
    for c, way in enumerate(WAYS):
        want = np.stack([a[:, c, 0] + a[:, c, 1], a[:, c, 1], a[:, c, 1]], -1)  # [pos, source]
        got_way = one["mixing"].sel(layer=f"1.attn.{way}").values[:, :3]
        np.testing.assert_allclose(got_way, want, rtol=1e-9, atol=1e-12, err_msg=way)


def test_text_prompts_decode_their_tokens_and_specs_are_read():
    model = build(tiny("standard"))
    one = inspect(model, "def f(x):")
    assert "".join(one["token"].values) == "def f(x):" and one.sizes["pos"] == 9
    nano = seeded("nanogpt")
    ids = torch.randint(0, VOCAB, (CTX,), generator=torch.Generator().manual_seed(1))
    got = inspect(nano, ids, spec=nano.SPEC)
    np.testing.assert_allclose(got["mixing"].sel(layer="readout").dropna("source"), 1.0)  # a plain residual


def test_a_prompt_longer_than_the_context_is_one_clear_error():
    model = build(tiny("standard"))
    with pytest.raises(DepthscopeError, match="context"):
        inspect(model, torch.zeros(model.cfg.ctx + 1, dtype=torch.long))


def test_inspect_from_the_command_line_draws_and_saves(tmp_path, capsys):
    import xarray as xr

    from depthscope.cli import main

    text = "def f(x): return x"
    assert main(["inspect", "attnres", "--text", text, "--out", str(tmp_path / "p.nc")]) == 0
    said = capsys.readouterr().out.strip().splitlines()[-1]
    ds = xr.load_dataset(tmp_path / "p.nc")
    shape = f"{len(text)} positions x {ds.sizes['layer']} consumers x {ds.sizes['source']} sources"
    assert said == f"wrote {tmp_path / 'p.nc'}: {shape}", said
    assert ds.sizes["pos"] == len(text) and "".join(ds["token"].values) == text
    for extra in (["--layer", "readout"], ["--position", "3"]):
        out = tmp_path / f"f{len(extra[1])}.svg"
        assert main(["inspect", "attnres", "--text", text, "--out", str(out), *extra]) == 0
        assert out.stat().st_size > 1000
    assert (
        main(["inspect", "attnres", "--text", text, "--out", str(tmp_path / "x.svg"), "--layer", "9.x"]) == 2
    )
