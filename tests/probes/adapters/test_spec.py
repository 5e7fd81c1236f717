"""ModelSpec: models written as research code writes them (spec_models.py), read exactly from where
they write and where they read, against an oracle from plain hooks and the weights each model
really mixed with (recorded by the model itself during its forward)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from depthscope import DepthscopeError, ModelSpec
from depthscope.probes import capture
from depthscope.probes.adapters.spec import build_spec
from tests.probes.adapters.spec_models import CTX, MODELS, VOCAB, D, seeded

NANO = MODELS["nanogpt"].SPEC

# label pattern -> module path of each model's sources and consumer inputs, written out here, apart
# from the specs, so that the oracle does not read the model the way the adapter does
SOURCES = {
    "nanogpt": {
        "embed": "wte",
        "embed.wpe": "wpe",
        "{i}.attn": "blocks.{i}.attn",
        "{i}.mlp": "blocks.{i}.mlp",
    },
    "denseformer": {"embed": "wte", "embed.wpe": "wpe", "{i}.block": "blocks.{i}"},
    "attnres": {"embed": "wte", "{i}.attn": "blocks.{i}.attn.f", "{i}.mlp": "blocks.{i}.mlp.f"},
    "mhc": {"embed": "wte", "{i}.attn": "blocks.{i}.attn.sub.f", "{i}.mlp": "blocks.{i}.mlp.sub.f"},
    "mudd": {"embed": "wte", "{i}.attn": "blocks.{i}.attn", "{i}.block": "blocks.{i}"},
}
INPUTS = {
    "nanogpt": {"{i}.attn": "blocks.{i}.ln_1", "{i}.mlp": "blocks.{i}.ln_2"},
    "denseformer": {"{i}.block": "blocks.{i}"},
    "attnres": {"{i}.attn": "blocks.{i}.attn.norm", "{i}.mlp": "blocks.{i}.mlp.norm"},
    "mhc": {"{i}.attn": "blocks.{i}.attn.sub.norm", "{i}.mlp": "blocks.{i}.mlp.sub.norm"},
    "mudd": {
        "{i}.attn.q": "blocks.{i}.q_norm",
        "{i}.attn.k": "blocks.{i}.k_norm",
        "{i}.attn.v": "blocks.{i}.v_norm",
        "{i}.mlp": "blocks.{i}.ln_2",
    },
}
EXPECTED_WEIGHTS = {  # what each consumer's weights are, as the papers define them
    "nanogpt": "unit",
    "denseformer": "static",
    "attnres": "token",
    "mhc": "token",
    "mudd": "token",
}


def paths(model, table: dict[str, str]) -> dict[str, str]:
    n = len(model.blocks)
    return {k.format(i=i): v.format(i=i) for k, v in table.items() for i in range(n)}


def oracle(name: str, model, tokens: torch.Tensor) -> dict[str, dict[str, tuple[float, float]]]:
    """Per consumer, per source: (token-mean weight, contribution share) from plain hooks."""
    sources = paths(model, SOURCES[name])
    inputs = {**paths(model, INPUTS[name]), "readout": "ln_f"}
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for label, path in sources.items():
        hook = lambda m, a, out, label=label: seen.__setitem__(label, out.detach().double())  # noqa: E731
        handles.append(model.get_submodule(path).register_forward_hook(hook))
    for label, path in inputs.items():
        hook = lambda m, a, label=label: seen.__setitem__("in:" + label, a[0].detach().double())  # noqa: E731
        handles.append(model.get_submodule(path).register_forward_pre_hook(hook))
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()
    out = {}
    for label, (names, w) in model.mixed.items():
        h = seen["in:" + label]
        w = w.double().expand(*h.shape[:2], len(names)) if w.ndim == 1 else w.double()
        terms = [w[..., k, None] * torch.broadcast_to(seen[n], h.shape) for k, n in enumerate(names)]
        rebuilt = sum(terms)
        assert float((rebuilt - h).norm() / h.norm()) < 1e-5, label  # the oracle's own weights hold
        energy = float((h * h).sum())
        out[label] = {
            n: (float(w[..., k].mean()), float((t * h).sum()) / energy)
            for k, (n, t) in enumerate(zip(names, terms))
        }
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_spec_reads_research_code_exactly(name):
    model = seeded(name)
    tokens = torch.randint(0, VOCAB, (4, CTX), generator=torch.Generator().manual_seed(1))
    trace = capture(model, tokens, spec=type(model).SPEC, n_tokens=4 * CTX, ctx=CTX, skip_positions=0)
    assert float(trace["residual_error"].max()) < 1e-5
    want = oracle(name, model, tokens)
    assert sorted(map(str, trace.layer.values)) == sorted(want)
    for layer, row in want.items():
        for source, (weight, share) in row.items():
            cell = dict(layer=layer, source=source)
            # float32 forward: the per-token weights are solved from float32 values, 1e-7 relative
            # each, through systems of a few sources: 1e-5 is float32's bound with their conditioning
            assert float(trace["mixing"].sel(cell)) == pytest.approx(weight, abs=1e-5), (layer, source)
            assert float(trace["contribution_share"].sel(cell)) == pytest.approx(share, abs=1e-5), (
                layer,
                source,
            )
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-6)
    kinds = set(__import__("json").loads(trace.attrs["weights_found"]).values())
    assert EXPECTED_WEIGHTS[name] in kinds


def test_the_dense_weights_are_the_models_own():
    """DenseFormer's static weights are its DWA alphas (static: no spread over tokens)."""
    model = seeded("denseformer")
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(2))
    trace = capture(model, tokens, spec=model.SPEC, n_tokens=2 * CTX, ctx=CTX, skip_positions=0)
    dwa = model.dwa["1"]  # block 2's input: alpha over X_0 (both embeddings), X_2 (dilation 2)
    row = trace["mixing"].sel(layer="2.block")
    assert float(row.sel(source="embed")) == pytest.approx(float(dwa.alpha[0].detach()), rel=1e-5)
    assert float(row.sel(source="1.block")) == pytest.approx(float(dwa.alpha[1].detach()), rel=1e-5)
    assert float(row.sel(source="0.block")) == pytest.approx(0.0, abs=1e-6)
    assert float(trace["mixing_std"].sel(layer="2.block").max()) == 0.0


def test_a_position_embedding_of_shape_pos_d_is_a_source():
    model = seeded("nanogpt")
    ad = build_spec(model, model.SPEC)
    assert [s.label for s in ad.sources[:3]] == ["embed", "embed.wpe", "0.attn"]
    assert ad.ctx == CTX and ad.vocab == VOCAB


def test_embeddings_named_by_label_read_as_by_position():
    """``embed={"embed": "wte", "pos_embed": "wpe"}`` labels the sources and changes nothing else:
    the same capture, the position embedding's row under its new name."""
    model = seeded("nanogpt")
    named = ModelSpec({"embed": "wte", "pos_embed": "wpe"}, model.SPEC.writes, model.SPEC.reads)
    assert [s.label for s in build_spec(model, named).sources[:3]] == ["embed", "pos_embed", "0.attn"]
    ids = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(0))
    a = capture(model, ids, spec=model.SPEC, skip_positions=0, progress=False)
    b = capture(model, ids, spec=named, skip_positions=0, progress=False)
    np.testing.assert_array_equal(a["contribution_share"].values, b["contribution_share"].values)
    assert [str(x) for x in b.source.values[:2]] == ["embed", "pos_embed"]


def test_a_read_that_is_not_a_combination_of_the_writes_is_refused():
    """Naming only the attention writes: the MLP's input holds an unnamed write; one line says so."""
    model = seeded("nanogpt")
    spec = ModelSpec(embed=["wte", "wpe"], writes={"attn": "blocks.*.attn"}, reads={"mlp": "blocks.*.ln_2"})
    with pytest.raises(DepthscopeError, match=r"consumer 1\.mlp .* not a scalar combination"):
        build_spec(model, spec)


@pytest.mark.parametrize(
    "spec, message",
    [
        (ModelSpec(embed=["wte"], writes={"attn": "blocks.*.atn"}, reads={}), "no module"),
        (ModelSpec(embed=["wte"], writes={"conv": "blocks.*.attn"}, reads={}), "not a kind"),
        (ModelSpec(embed=[], writes={"attn": "blocks.*.attn"}, reads={}), "at least one embedding"),
        (
            ModelSpec({"pos_embed": "wpe", "embed": "wte"}, {"attn": "blocks.*.attn"}, {}),
            "first labelled 'embed'",
        ),
        (ModelSpec({"embed": "blocks.*.attn"}, {"attn": "blocks.*.attn"}, {}), "names one module"),
        (ModelSpec(["blocks.0:inside"], {"attn": "blocks.*.attn"}, {}), "after ':' comes 'in'"),
        (dataclasses.replace(NANO, static={"9.attn": [1.0]}), r"static= names 9\.attn: no such consumer"),
        (dataclasses.replace(NANO, static=[1.0]), "static= maps consumer labels to weights"),
        (dataclasses.replace(NANO, static={"0.attn": [1.0, 1.0, 1.0]}), "give 1 to 2 finite numbers"),
        (dataclasses.replace(NANO, static={"0.attn": [1.0, float("nan")]}), "give 1 to 2 finite numbers"),
        # given weights that do not rebuild the input: the probe's check refuses them, naming it
        (dataclasses.replace(NANO, static={"0.mlp": [1.0, 1.0, 0.5]}), r"0\.mlp .* with its static weights"),
    ],
)
def test_a_wrong_spec_is_one_clear_error(spec, message):
    """Each mistake is refused in one line that says which (the given static weights too)."""
    with pytest.raises(DepthscopeError, match=message):
        build_spec(seeded("nanogpt"), spec)


def test_a_modules_input_as_a_source_and_its_output_as_a_read():
    """``blocks.0:in`` (the stream entering the first block: both embeddings summed) is one source and
    ``blocks.2:out`` (the last block's output) the read-out: each consumer's share of that source is
    the sum of its shares of the two embeddings read apart (shares add), the rest the same."""
    model = seeded("nanogpt")
    apart = dataclasses.replace(type(model).SPEC, ctx=16)
    reads = {**apart.reads, "readout": "blocks.2:out"}
    taps = dataclasses.replace(apart, embed="blocks.0:in", reads=reads, vocab=VOCAB)  # no Embedding named
    ids = torch.randint(2, VOCAB, (4, 16), generator=torch.Generator().manual_seed(1))
    kw = {"skip_positions": 0, "progress": False}
    a, b = capture(model, ids, spec=apart, **kw), capture(model, ids, spec=taps, **kw)
    assert list(b.source.values) == ["embed"] + list(a.source.values[2:])
    share_a, share_b = a["contribution_share"], b["contribution_share"]
    summed = share_a.sel(source="embed") + share_a.sel(source="embed.wpe")
    np.testing.assert_allclose(share_b.sel(source="embed").values, summed.values, rtol=1e-5, atol=1e-7)
    rest = list(a.source.values[2:])
    np.testing.assert_allclose(share_b.sel(source=rest).values, share_a.sel(source=rest).values, atol=1e-6)
    assert float(b["residual_error"].max()) < 1e-5


def test_a_nanogpt_needs_no_spec():
    """Discovery reads a plain module shaped like a pre-norm decoder: the same trace as its spec."""
    model = seeded("nanogpt")
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(3))
    found = capture(model, tokens, n_tokens=2 * CTX, ctx=CTX, skip_positions=0)
    named = capture(model, tokens, spec=model.SPEC, n_tokens=2 * CTX, ctx=CTX, skip_positions=0)
    assert found.attrs["spec_origin"] == "discovered"
    for var in ("mixing", "contribution_share", "norm_share", "input_rms"):
        np.testing.assert_array_equal(found[var].values, named[var].values)


def test_a_model_discovery_cannot_read_is_refused_with_what_to_write():
    """Per-feature weights: discovery's guess (in the model's own names) is refused in one line that
    says why and points to `depthscope spec`."""
    from tests.probes.adapters.spec_models import PerFeature

    with pytest.raises(DepthscopeError, match=r"read as ModelSpec\(embed=\['wte', 'wpe'\]") as err:
        capture(PerFeature().eval(), torch.zeros(1, CTX, dtype=torch.long), n_tokens=CTX, ctx=CTX)
    message = str(err.value)
    assert "\n" not in message and "depthscope spec MODEL" in message and "blocks.*.ln_1" in message
    assert "not a scalar combination" in message and "docs/reference.md#modelspec" in message


def test_discovery_reads_q_k_v_views_from_three_norms():
    """MUDD's blocks read three norms before one attention: discovery names them as the query, key and
    value views and reads the model in the increment basis, every input rebuilt exactly."""
    model = seeded("mudd")
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(3))
    trace = capture(model, tokens, n_tokens=2 * CTX, ctx=CTX, skip_positions=0, progress=False)
    assert trace.attrs["spec_origin"] == "discovered"
    assert [str(x) for x in trace.layer.values[:4]] == ["0.attn.q", "0.attn.k", "0.attn.v", "0.mlp"]
    assert float(trace["residual_error"].max()) < 1e-5
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-9)


def per_feature_spec(model, **extra) -> ModelSpec:
    return ModelSpec(
        embed=["wte", "wpe"],
        writes={"block": "blocks.*"},
        reads={"block": "blocks.*", "readout": "ln_f"},
        **extra,
    )


def test_per_feature_weights_are_refused_unless_given():
    """GRN-like per-feature weights: no scalar combination rebuilds the input, so the spec is refused
    naming the consumer; given as a function, they are read exactly (mixing: their feature mean)."""
    from tests.probes.adapters.spec_models import PerFeature

    torch.manual_seed(0)
    model = PerFeature().eval()
    with pytest.raises(
        DepthscopeError, match=r"consumer 0\.block .* not a scalar combination.*weights="
    ) as err:
        build_spec(model, per_feature_spec(model))
    assert "\n" not in str(err.value)

    def weights(i, sources, h):  # over embed, embed.wpe (both X_0), then X_1 .. X_i
        b = model.b[i].detach()
        return torch.cat([b[:1], b]) if i is not None else None

    spec = per_feature_spec(model, weights={"block": weights})
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(4))
    trace = capture(model, tokens, spec=spec, n_tokens=2 * CTX, ctx=CTX, skip_positions=0)
    assert float(trace["residual_error"].max()) < 1e-5
    b = model.b[2].detach().double()
    row = trace["mixing"].sel(layer="2.block")
    np.testing.assert_allclose(
        row.sel(source=["embed", "embed.wpe", "0.block", "1.block"]),
        [*b.mean(-1)[:1], *b.mean(-1)],
        rtol=1e-6,
    )
    assert __import__("json").loads(trace.attrs["weights_found"])["2.block"] == "declared"
    wrong = per_feature_spec(model, weights={"block": lambda i, s, h: torch.ones(s.shape[0], D)})
    with pytest.raises(DepthscopeError, match="do not rebuild its input"):
        build_spec(model, wrong)
