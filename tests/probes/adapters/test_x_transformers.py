"""x-transformers' depth-mixing options captured directly (hyper-connections with the H_res defect,
AttentionResidual, LIMe): tiny TransformerWrappers trained a few steps, saved and reloaded, against
weights recomputed by hand from plain hooks on the package's own modules."""

from __future__ import annotations

import importlib.metadata
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from x_transformers import Decoder, TransformerWrapper

from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.adapters import resolve
from depthscope.probes.adapters import x_transformers as family

BASE = dict(num_tokens=64, max_seq_len=16)
LAYERS = dict(dim=32, depth=2, heads=2)
OPTIONS = {
    "hc": dict(num_residual_streams=4),
    "hc-qkv": dict(num_residual_streams=4, qkv_receive_diff_residuals=True),
    "attnres": dict(attn_aggregated_residuals=True, attn_aggregated_residual_kwargs=dict(lora_rank=16)),
    "lime": dict(integrate_layers=True),
}
ROWS = {
    "hc": ["0.attn", "0.mlp", "1.attn", "1.mlp"],
    "hc-qkv": ["0.attn.q", "0.attn.k", "0.attn.v", "0.mlp", "1.attn.q", "1.attn.k", "1.attn.v", "1.mlp"],
    "attnres": ["0.attn", "0.mlp", "1.attn", "1.mlp"],
    "lime": ["0.attn", "0.mlp", "1.attn.q", "1.attn.k", "1.attn.v", "1.mlp"],  # LIMe: q/k/v after the first
}
MIXERS = {"hc": ".2.", "hc-qkv": ".2.", "attnres": "layer_integrators", "lime": "layer_integrators"}


def make(args: dict) -> TransformerWrapper:
    return TransformerWrapper(**args["wrapper"], attn_layers=Decoder(**args["layers"]))


def train(option: str, tmp_path_factory):
    """(reloaded model, tokens, largest change of a mixing parameter)."""
    args = {"wrapper": BASE, "layers": {**LAYERS, **OPTIONS[option]}}
    torch.manual_seed(0)
    model = make(args)
    mixing = {n: p.detach().clone() for n, p in model.named_parameters() if MIXERS[option] in n}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        ids = torch.randint(0, BASE["num_tokens"], (4, 17), generator=g)
        loss = F.cross_entropy(model(ids[:, :-1]).transpose(1, 2), ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = dict(model.named_parameters())
    moved = max(float((params[n].detach() - p).abs().max()) for n, p in mixing.items())
    path = tmp_path_factory.mktemp("xt") / "model.pt"
    torch.save({"args": args, "state_dict": model.state_dict()}, path)
    saved = torch.load(path, weights_only=True)
    reloaded = make(saved["args"])
    reloaded.load_state_dict(saved["state_dict"])
    tokens = torch.randint(0, BASE["num_tokens"], (2, 16), generator=g)
    return reloaded.eval(), tokens, moved


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """option -> (reloaded model, tokens, how far the mixing parameters moved), trained once per module."""
    cache = {}

    def get(option: str):
        if option not in cache:
            cache[option] = train(option, tmp_path_factory)
        return cache[option]

    return get


def run_with_hooks(model, tokens, hooks):
    """One forward with plain forward pre-hooks ``(module, fn(args, kwargs))``, removed afterwards."""
    handles = [
        m.register_forward_pre_hook(lambda _, a, k, fn=fn: fn(a, k), with_kwargs=True) for m, fn in hooks
    ]
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()


def rms(x, weight, eps=None):
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def over_states(w):
    """Weights over states h_0..h_i [tokens, state] -> delta basis: source m gets sum_{j >= m} w_j."""
    return torch.stack([w[:, m:].sum(-1) for m in range(w.shape[1])], -1)


def rows_by_layer(option):
    out = {}
    for row in ROWS[option]:
        out.setdefault(".".join(row.split(".")[:2]), []).append(row)
    return list(out.values())


@torch.no_grad()
def hc_by_hand(model, tokens, option):
    """Delta-basis weights [tokens, source] per row, unrolling the streams by hand; checks beta and the
    all-ones H_res against what the package hands to each HyperConnection's forward."""
    layers = model.attn_layers
    streams = layers.num_residual_streams
    inputs, forwards = {}, {}
    hooks = []
    for i, (_, _, hc) in enumerate(layers.layers):
        hooks.append((hc.norm, lambda a, k, i=i: inputs.__setitem__(i, a[0].double())))
        hooks.append((hc, lambda a, k, i=i: forwards.__setitem__(i, (a[1].double(), k["beta"].double()))))
    run_with_hooks(model, tokens, hooks)
    n_tok = tokens.numel()
    # stream s starts as embed + stream_emb[s]: sources embed, stream_emb.0..S-1
    coef = [torch.zeros(n_tok, 1 + streams, dtype=torch.float64) for _ in range(streams)]
    for s in range(streams):
        coef[s][:, 0] = 1
        coef[s][:, 1 + s] = 1
    out = {}
    for i, rows in enumerate(rows_by_layer(option)):
        hc, r = layers.layers[i][2], inputs[i]  # r [batch, pos, stream, d_model]
        normed = (r - r.mean(-1, keepdim=True)) / torch.sqrt(r.var(-1, unbiased=False, keepdim=True) + 1e-5)
        normed = normed * hc.norm.weight.double()
        v = len(rows)
        alpha = (
            normed @ hc.dynamic_alpha_fn.double() * float(hc.dynamic_alpha_scale) + hc.static_alpha.double()
        )
        pre = torch.sigmoid(alpha[..., :v]).reshape(n_tok, streams, v)
        dyn = torch.sigmoid(normed @ hc.dynamic_beta_fn.double()) * 2 * float(hc.dynamic_beta_scale)
        beta = torch.sigmoid(dyn + hc.static_beta.double()) * 2
        mixed, package_beta = forwards[i]
        torch.testing.assert_close(beta, package_beta, rtol=1e-5, atol=1e-6)
        # the defect: every stream handed on is the sum of all streams (H_res = ones)
        torch.testing.assert_close(mixed, r.sum(2, keepdim=True).expand_as(mixed), rtol=1e-5, atol=1e-4)
        for j, row in enumerate(rows):
            out[row] = sum(pre[:, s, j : j + 1] * coef[s] for s in range(streams))
        total = sum(coef)
        flat_beta = beta.reshape(n_tok, streams)
        coef = [torch.cat([total, flat_beta[:, t : t + 1]], -1) for t in range(streams)]
    out["readout"] = sum(coef)
    return out


def stream_rms(model, tokens):
    """RMS of the streams entering every HyperConnection and leaving the last one."""
    layers = model.attn_layers
    seen = []
    handles = [
        hc.norm.register_forward_pre_hook(lambda m, a: seen.append(a[0])) for _, _, hc in layers.layers
    ]
    handles.append(layers.layers[-1][2].register_forward_hook(lambda m, a, out: seen.append(out)))
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()
    return [float(x.pow(2).mean().sqrt()) for x in seen]


@torch.no_grad()
def states_by_hand(model, tokens, option):
    """Delta-basis weights per row from each integrator's inputs (x, the states h_0..h_i), by hand."""
    layers = model.attn_layers
    seen = {}
    hooks = [
        (m, lambda a, k, i=i: seen.__setitem__(i, torch.stack(list(a[1])).double()))
        for i, m in enumerate(layers.layer_integrators)
    ]
    run_with_hooks(model, tokens, hooks)
    out = {}
    for i, rows in enumerate(rows_by_layer(option)):
        m, h = layers.layer_integrators[i], seen[i]  # h [state, batch, pos, d_model]
        if option == "attnres":
            latest = h[-1]
            lora = m.to_query[1]
            delta = (
                rms(latest, m.to_query[0].weight) @ lora.down.weight.double().T @ lora.up.weight.double().T
            )
            q = rms(latest + delta, m.norm.weight)
            k = rms(h, m.to_keys.weight)
            w = torch.softmax((q * k).sum(-1) / math.sqrt(layers.dim), 0).unsqueeze(0)  # [view, state, b, n]
        else:
            norm, linear = m.to_weights[0], m.to_weights[1]
            x = h[-1]
            normed = (
                x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12) * math.sqrt(layers.dim) * norm.g.double()
            )
            logits = normed @ linear.weight.double().T + linear.bias.double()  # [b, n, (view state)]
            w = torch.softmax(logits.unflatten(-1, (len(rows), h.shape[0])), -1).permute(2, 3, 0, 1)
        flat = w.flatten(2).transpose(1, 2)  # [view, tokens, state]
        out.update({row: over_states(flat[j]) for j, row in enumerate(rows)})
        out[f"{rows[0]}:native"] = flat
    n_src = 1 + len(layers.layers)
    out["readout"] = torch.ones(tokens.numel(), n_src, dtype=torch.float64)
    return out


@pytest.mark.parametrize("option", list(OPTIONS))
def test_training_moves_the_mixing_parameters(trained, option):
    assert trained(option)[2] > 1e-3


@pytest.mark.parametrize("option", list(OPTIONS))
def test_mixing_matches_the_weights_recomputed_by_hand(trained, option, recwarn):
    model, tokens, _ = trained(option)
    trace = capture(model, tokens)
    hc = option.startswith("hc")
    expected = hc_by_hand(model, tokens, option) if hc else states_by_hand(model, tokens, option)
    assert list(trace.layer.values) == [*ROWS[option], "readout"]
    assert float(trace.residual_error.max()) < 1e-4
    np.testing.assert_allclose(trace.contribution_share.sum("source").values, 1.0, atol=1e-6)
    for label in [*ROWS[option], "readout"]:
        w = expected[label]
        row = trace.sel(layer=label)
        n = w.shape[1]
        scale = max(1.0, float(w.abs().max()))  # HC weights grow about 4-fold per sublayer
        np.testing.assert_allclose(row.mixing.values[:n], w.mean(0).numpy(), atol=1e-5 * scale, err_msg=label)
        np.testing.assert_allclose(
            row.mixing_std.values[:n], w.std(0, unbiased=False).numpy(), atol=1e-5 * scale
        )
        assert np.isnan(row.mixing.values[n:]).all()
    if not hc:  # the states' weights sum to 1, so the embedding's delta-basis weight is 1
        name = "attnres_alpha" if option == "attnres" else "lime_weight"
        np.testing.assert_allclose(trace.mixing.sel(source="embed").values, 1.0, atol=1e-6)
        np.testing.assert_allclose(trace[name].isel(layer=slice(0, -1)).sum("state").values, 1.0, atol=1e-6)
        last = ROWS[option][-1]
        native = expected[f"{last}:native"][0].mean(0).numpy()
        np.testing.assert_allclose(trace[name].sel(layer=last).values[: len(native)], native, atol=1e-5)


@pytest.mark.parametrize("option", ["hc", "hc-qkv"])
def test_hyper_connections_record_and_warn_the_h_res_defect(trained, option):
    model, tokens, _ = trained(option)
    with pytest.warns(UserWarning, match="H_res all ones"):
        trace = capture(model, tokens)
    assert trace.attrs["defect"] == family.DEFECT
    np.testing.assert_array_equal(trace.hc_res.sel(layer="1.mlp").values, np.ones((4, 4)))
    # every stream becomes the sum of all four: the stream RMS grows about 4x per sublayer
    norms = stream_rms(model, tokens)
    growth = np.array(norms[1:]) / np.array(norms[:-1])
    assert (growth > 3.0).all() and (growth < 5.0).all(), growth


@pytest.mark.parametrize("option", list(OPTIONS))
def test_detection_finds_the_option(trained, option):
    model, _, _ = trained(option)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the HC defect warning, asserted above
        ad = resolve(model)
    assert ad.family == family.NAME and family.detect(model)
    assert ad.attrs["scheme"] == option.split("-")[0]
    streams = [f"stream_emb.{s}" for s in range(4)] if option.startswith("hc") else []
    assert [s.label for s in ad.sources] == ["embed", *streams, "0.attn", "0.mlp", "1.attn", "1.mlp"]
    assert [c.label for c in ad.consumers] == [*ROWS[option], "readout"]


def test_unknown_models_and_mixed_options_are_refused():
    tokens = torch.randint(0, 64, (2, 16))
    plain = TransformerWrapper(**BASE, attn_layers=Decoder(**LAYERS))
    assert not family.detect(plain)
    with pytest.raises(DepthscopeError, match="no adapter knows it"):
        capture(plain, tokens)
    mixed = TransformerWrapper(
        **BASE, attn_layers=Decoder(**LAYERS, num_residual_streams=4, integrate_layers=True)
    )
    assert family.detect(mixed)
    with pytest.raises(DepthscopeError, match="hyper-connections combined with integrate_layers"):
        capture(mixed, tokens)


def test_another_package_version_warns(monkeypatch):
    model = TransformerWrapper(**BASE, attn_layers=Decoder(**LAYERS, integrate_layers=True))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.9")
    with pytest.warns(UserWarning, match="written for x-transformers 2.31.10, installed is 9.9.9"):
        ad = resolve(model)
    assert ad.attrs["label"] == "x-transformers 9.9.9: LIMe"
