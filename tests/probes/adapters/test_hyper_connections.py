"""The hyper-connections adapter (lucidrains hyper-connections 0.4.11) on small user-written
transformers: HC (dynamic), mHC v1 and mHCv2 modules around attention and MLP branches, trained a
few steps, saved and reloaded as a user would, captured, and compared with an unrolling written
here from plain forward hooks on the package's own modules (weights recomputed from their
parameters and the hooked norm outputs, the package's own Sinkhorn)."""

from __future__ import annotations

import copy

import hyper_connections
import hyper_connections.manifold_constrained_hyper_connections as manifold
import hyper_connections.mHCv2 as mhcv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.adapters import hyper_connections as adapter
from depthscope.probes.adapters import resolve

VOCAB, DIM, STREAMS, HEADS = 64, 32, 4, 4
VARIANTS = {
    # variant: constructor arguments of the network (what each one exercises)
    "hc": dict(variant="hc", depth=3, style="branch"),  # branch= wrapped, dynamic HC with tanh
    "mhc": dict(variant="mhc", depth=2, style="call", log_domain=True, proposals=2),  # add_residual fn
    "mhcv2": dict(variant="mhcv2", depth=2, style="split", stream_embed=True),  # registration != execution
}


class Attention(nn.Module):
    """Pre-norm causal self-attention."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).unflatten(-1, (3, HEADS, -1)).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).flatten(-2))


class FeedForward(nn.Module):
    """Pre-norm MLP."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(DIM), nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM)
        )

    def forward(self, x):
        return self.net(x)


def stream_functions(variant, stream_embed, **kwargs):
    """init_hyper_conn, expand_stream, reduce_stream of the variant's own module file."""
    if variant == "hc":
        return hyper_connections.get_init_and_expand_reduce_stream_functions(
            STREAMS, dim=DIM, add_stream_embed=stream_embed
        )
    fns = (
        hyper_connections.mc_get_init_and_expand_reduce_stream_functions
        if variant == "mhc"
        else mhcv2.get_init_and_expand_reduce_stream_functions
    )
    return fns(STREAMS, dim=DIM, add_stream_embed=stream_embed, **kwargs)


class Net(nn.Module):
    """embedding -> expand_stream -> blocks of (attention, MLP) behind the package's modules ->
    reduce_stream -> norm -> unembed. ``style``: "branch" (modules wrap their branch), "call" (the
    module returns the branch input and an add_residual function), "split" (the attention and MLP
    modules registered in two lists, so registration order is not execution order).
    """

    def __init__(self, variant, depth, style, stream_embed=False, log_domain=False, proposals=1):
        super().__init__()
        extra = (
            {}
            if variant == "hc"
            else dict(log_domain_sinkhorn=log_domain, num_dynamic_alpha_proposals=proposals)
        )
        if variant == "mhcv2":
            extra["mix_streams_before_norm"] = True
        init, self.expand_stream, self.reduce_stream = stream_functions(variant, stream_embed, **extra)
        self.style = style
        self.embed = nn.Embedding(VOCAB, DIM)
        attn = [Attention() for _ in range(depth)]
        ff = [FeedForward() for _ in range(depth)]
        if style == "branch":
            self.layers = nn.ModuleList(
                nn.ModuleList([init(branch=a, layer_index=2 * i), init(branch=f, layer_index=2 * i + 1)])
                for i, (a, f) in enumerate(zip(attn, ff))
            )
        else:
            self.attn, self.ff = nn.ModuleList(attn), nn.ModuleList(ff)
            self.attn_hc = nn.ModuleList(init(layer_index=2 * i) for i in range(depth))
            self.ff_hc = nn.ModuleList(init(layer_index=2 * i + 1) for i in range(depth))
        self.norm = nn.RMSNorm(DIM)
        self.unembed = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.expand_stream(self.embed(tokens))
        if self.style == "branch":
            for attn_hc, ff_hc in self.layers:
                x = ff_hc(attn_hc(x))
        else:
            for attn, ff, attn_hc, ff_hc in zip(self.attn, self.ff, self.attn_hc, self.ff_hc):
                for branch, hc in ((attn, attn_hc), (ff, ff_hc)):
                    branch_input, add_residual = hc(x)
                    x = add_residual(branch(branch_input))
        return self.unembed(self.norm(self.reduce_stream(x)))


def connections(model):
    classes = (
        hyper_connections.HyperConnections,
        hyper_connections.ManifoldConstrainedHyperConnections,
        mhcv2.ManifoldConstrainedHyperConnections,
    )
    return [m for m in model.modules() if isinstance(m, classes)]


def tokens(n=2, pos=16, seed=0):
    return torch.randint(0, VOCAB, (n, pos), generator=torch.Generator().manual_seed(seed))


def train(model, steps=10, seed=1):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        t = tokens(4, 16, seed + step)
        loss = F.cross_entropy(model(t)[:, :-1].flatten(0, 1), t[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


MIXING = ("static_alpha", "dynamic_alpha_fn", "static_beta", "dynamic_beta_fn")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each variant trained and saved as state_dict + constructor arguments, with its initial parameters."""
    out = {}
    for name, args in VARIANTS.items():
        torch.manual_seed(0)
        model = Net(**args)
        before = copy.deepcopy(model.state_dict())
        train(model)
        path = tmp_path_factory.mktemp(name) / "model.pt"
        torch.save({"args": args, "state_dict": model.state_dict()}, path)
        out[name] = (path, before)
    return out


def reload(path):
    blob = torch.load(path, weights_only=True)
    model = Net(**blob["args"])
    model.load_state_dict(blob["state_dict"])
    return model.eval()


# --- the independent reading: plain forward hooks, the package's parameters, a hand unrolling ----


def recompute(m, normed):
    """(H_pre [b, p, s], H_res [b, p, s, s], H_post [b, p, s]) of module ``m`` from its norm output."""
    s = m.num_residual_streams
    x = normed.reshape(*normed.shape[:2], s, -1).double()
    if isinstance(m, hyper_connections.HyperConnections):
        alpha = torch.tanh(x @ m.dynamic_alpha_fn.double()) * m.dynamic_alpha_scale + m.static_alpha.double()
        beta = torch.tanh(x @ m.dynamic_beta_fn.double()) * m.dynamic_beta_scale + m.static_beta.double()
        return alpha[..., 0], alpha[..., 1:], beta
    pre, res = [], []
    for fn in m.dynamic_alpha_fn.double():  # each proposal
        dyn = x @ fn
        logits = torch.cat([dyn[..., :1] * m.pre_branch_scale, dyn[..., 1:] * m.residual_scale], -1)
        logits = logits + m.static_alpha.double()
        pre.append(logits[..., 0].sigmoid())
        res.append(m.residual_mix_constraint_fn(logits[..., 1:]).double())  # the package's own Sinkhorn
    static_beta = m.static_beta.double().reshape(s)
    beta = 2 * ((x @ m.dynamic_beta_fn.double().reshape(-1)) * m.h_post_scale + static_beta).sigmoid()
    return torch.stack(pre).mean(0), torch.stack(res).mean(0), beta


def hooked_forward(model, t):
    """One forward with plain hooks: the embedding, each module's norm output (execution order),
    each branch's actual input and output, the stream embedding, the read-out.
    """
    seen = {"normed": [], "order": [], "branch_in": [], "branch_out": []}
    branches = [m for m in model.modules() if isinstance(m, Attention | FeedForward)]

    def keep(key, what=lambda mod, args, out: out):
        def hook(mod, args, out):  # returns None: the forward is left as it is
            seen.setdefault(key, []).append(what(mod, args, out))

        return hook

    handles = [
        model.embed.register_forward_hook(keep("embed")),
        model.reduce_stream.register_forward_hook(keep("readout")),
    ]
    for hc in connections(model):
        handles += [
            hc.norm.register_forward_hook(keep("normed")),
            hc.norm.register_forward_hook(keep("order", lambda *_, hc=hc: hc)),
        ]
    for b in branches:
        handles += [
            b.register_forward_hook(keep("branch_in", lambda mod, args, out: args[0])),
            b.register_forward_hook(keep("branch_out")),
        ]
    try:
        with torch.no_grad():
            model(t)
    finally:
        for h in handles:
            h.remove()
    return seen


@torch.no_grad()
def unrolled(model, t):
    """Per-token delta-basis weights of every consumer, the native matrices and the rebuild
    error of every input, by hand.
    """
    seen = hooked_forward(model, t)
    b, p = t.shape
    embed = getattr(model.expand_stream, "stream_embed", None)
    coef = torch.ones(b, p, STREAMS, 1, dtype=torch.float64)
    values = [seen["embed"][0].double()]
    if embed is not None:
        coef = torch.cat([coef, torch.eye(STREAMS, dtype=torch.float64).expand(b, p, -1, -1)], -1)
        values += [e.double().expand(b, p, -1) for e in embed]
    weights, natives, errors = [], [], []
    for k, (hc, normed) in enumerate(zip(seen["order"], seen["normed"])):
        pre, res, post = recompute(hc, normed)
        w = torch.einsum("bps,bpsn->bpn", pre, coef)
        rebuilt = torch.einsum("bpn,nbpd->bpd", w, torch.stack(values))
        actual = seen["branch_in"][k].double()
        errors.append(float((rebuilt - actual).norm() / actual.norm()))
        weights.append(w)
        natives.append((pre, res, post))
        coef = torch.cat([torch.einsum("bpst,bpsn->bptn", res, coef), post.unsqueeze(-1)], -1)
        values.append(seen["branch_out"][k].double())
    w = coef.sum(2)
    rebuilt = torch.einsum("bpn,nbpd->bpd", w, torch.stack(values))
    readout = seen["readout"][0].double()
    errors.append(float((rebuilt - readout).norm() / readout.norm()))
    weights.append(w)
    return weights, natives, errors


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VARIANTS))
def test_training_moved_the_mixing_parameters(name, saved):
    path, before = saved[name]
    after = torch.load(path, weights_only=True)["state_dict"]
    keys = [k for k in after if k.rpartition(".")[2] in MIXING]
    assert len(keys) == 4 * 2 * VARIANTS[name]["depth"]
    for k in keys:
        # (at least 1e-4: a first module's H_res gets almost no gradient while the streams are
        # still identical copies of the embedding, so its share of dynamic_alpha_fn barely moves)
        assert float((after[k] - before[k]).abs().max()) > 1e-4, k


@pytest.mark.parametrize("name", list(VARIANTS))
def test_capture_matches_an_independent_unrolling(name, saved):
    model = reload(saved[name][0])
    t = tokens()
    trace = capture(model, t, batch_size=1)
    depth = VARIANTS[name]["depth"]
    branches = [f"{i}.{kind}" for i in range(depth) for kind in ("attn", "mlp")]
    initial = ["embed"] + ([f"stream_embed.{s}" for s in range(STREAMS)] if name == "mhcv2" else [])
    assert list(trace.layer.values) == [*branches, "readout"]
    assert list(trace.source.values) == initial + branches
    assert list(trace.layer_kind.values) == ["attn", "mlp"] * depth + ["readout"]

    weights, natives, errors = unrolled(model, t)
    assert max(errors) < 1e-5  # the hand unrolling rebuilds every actual input
    for i, w in enumerate(weights):
        n = w.shape[-1]
        row = trace.isel(layer=i)
        np.testing.assert_allclose(row["mixing"].values[:n], w.mean((0, 1)).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            row["mixing_std"].values[:n], w.std((0, 1), correction=0).numpy(), rtol=1e-4, atol=1e-6
        )
        assert np.isnan(row["mixing"].values[n:]).all()
    assert float(trace["mixing_std"].max()) > 1e-3  # the weights depend on the token
    assert float(trace["residual_error"].max()) < 1e-4
    np.testing.assert_allclose(trace["contribution_share"].sum("source").values, 1.0, atol=1e-5)

    for var, j in (("hc_pre", 0), ("hc_res", 1), ("hc_post", 2)):
        want = np.stack([nat[j].mean((0, 1)).numpy() for nat in natives])
        got = trace[var].sel(layer=branches).values
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert trace["hc_res"].dims == ("layer", "stream_from", "stream_to")
    assert trace["hc_pre"].dims == trace["hc_post"].dims == ("layer", "stream")
    assert np.isnan(trace["hc_pre"].sel(layer="readout")).all()
    if name != "hc":  # Sinkhorn: every target stream's weights sum to 1
        np.testing.assert_allclose(trace["hc_res"].sel(layer=branches).sum("stream_from"), 1.0, atol=1e-6)

    assert trace.attrs["family"] == "hyper-connections"
    assert trace.attrs["scheme"] == ("hc" if name == "hc" else "mhc")
    assert trace.attrs["variant"] == name
    assert trace.attrs["label"] == f"hyper-connections 0.4.11: {adapter.TITLES[name]}"
    assert trace.attrs["execution_order"] == "probe forward"


def test_detection_finds_the_modules_in_execution_order_anywhere_in_the_tree(saved):
    inner = reload(saved["mhcv2"][0])  # attention and MLP modules registered in two lists

    class Wrapper(nn.Module):  # the user's network one level further down
        def __init__(self):
            super().__init__()
            self.backbone = nn.ModuleDict({"lm": inner})

        def forward(self, t):
            return self.backbone["lm"](t)

    model = Wrapper()
    assert adapter.detect(model) and resolve(model).family == "hyper-connections"
    plan = adapter.plan(model)
    paths = [c.path for c in plan.connections]
    assert paths == [f"backbone.lm.{kind}_hc.{i}" for i in range(2) for kind in ("attn", "ff")]
    registered = [p for p, m in model.named_modules() if m in [c.module for c in plan.connections]]
    assert registered != paths  # registration order differs: the probe forward found the order
    assert plan.readout == "backbone.lm.reduce_stream" and plan.stream_embed is inner.expand_stream
    assert not any("width_connection" in m.__dict__ for m in inner.modules())  # nothing left behind


def test_a_model_called_another_way_falls_back_to_registration_order(saved):
    base = reload(saved["hc"][0])

    class Masked(nn.Module):  # cannot be called as model(tokens): no probe forward
        def __init__(self):
            super().__init__()
            self.net = base

        def forward(self, t, *, mask):
            return self.net(t)

    model = Masked()
    t = tokens()
    trace = capture(model, t, batch_size=2, forward=lambda x: model(x, mask=None))
    assert trace.attrs["execution_order"] == "registration"
    plain = capture(base, t, batch_size=2)
    np.testing.assert_allclose(trace["mixing"].values, plain["mixing"].values, rtol=1e-6)


def test_modules_that_run_out_of_the_registration_order_are_refused_without_a_probe(saved):
    base = reload(saved["mhcv2"][0])  # attention and MLP modules registered in two lists

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = base

        def forward(self, t, *, mask):
            return self.net(t)

    model = Masked()
    with pytest.raises(DepthscopeError, match=r"net.ff_hc.0 ran out of the order found at build time"):
        capture(model, tokens(), batch_size=2, forward=lambda x: model(x, mask=None))
    assert not any(k in m.__dict__ for m in model.modules() for k in ("width_connection", "depth_connection"))


@pytest.mark.parametrize("module", [manifold, mhcv2], ids=["mhc", "mhcv2"])
@pytest.mark.parametrize("iters", [0, 3, 20])
@pytest.mark.parametrize("log_domain", [False, True])
def test_the_sinkhorn_is_the_packages(module, iters, log_domain):
    logits = torch.randn(5, 4, 4, generator=torch.Generator().manual_seed(iters)) * 2
    theirs = (module.log_domain_sinkhorn_knopps if log_domain else module.sinkhorn_knopps)(
        logits, iters=iters
    )
    ours = adapter.sinkhorn(logits.double(), iters, log_domain, raw_without_iters=module is mhcv2)
    torch.testing.assert_close(ours.float(), theirs, rtol=1e-5, atol=1e-6)


def test_branches_that_are_neither_attention_nor_mlp_get_neutral_labels():
    init, expand, reduce = mhcv2.get_init_and_expand_reduce_stream_functions(
        STREAMS, dim=DIM, sinkhorn_iters=5
    )
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(VOCAB, DIM), expand, init(branch=nn.Linear(DIM, DIM)), init(branch=nn.Tanh()), reduce
    )
    trace = capture(model, tokens(), batch_size=2)
    assert list(trace.layer.values) == ["0.branch", "1.branch", "readout"]
    assert list(trace.source_kind.values) == ["embed", "block", "block"]
    assert float(trace["residual_error"].max()) < 1e-4
    # each Sinkhorn round ends normalising over the target stream: the embedding reaches the sum of
    # the 4 streams with weight 4 exactly
    np.testing.assert_allclose(trace["mixing"].sel(layer="readout", source="embed"), 4.0, rtol=1e-6)


def test_unknown_and_unsupported_models_are_refused():
    plain = nn.Sequential(nn.Embedding(VOCAB, DIM), nn.Linear(DIM, VOCAB))
    assert not adapter.detect(plain)
    with pytest.raises(DepthscopeError, match="no adapter knows it"):
        capture(plain, tokens())
