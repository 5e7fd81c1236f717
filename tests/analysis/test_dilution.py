"""The dilution estimators on planted traces whose every value is known by hand."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from depthscope.analysis import dilution as est
from depthscope.trace import stack_traces, with_blocks

NAN = np.nan


def planted(
    mixing, share, layers, sources, layer_kinds=None, source_kinds=None, label="planted", mixing_abs=None
):
    """A trace with the given (layer, source) mixing and contribution shares."""
    mixing = np.asarray(mixing, dtype=float)
    share = np.asarray(share, dtype=float)
    n_l = len(layers)
    layer_kinds = layer_kinds or ["attn" if i % 2 == 0 else "mlp" for i in range(n_l - 1)] + ["readout"]
    source_kinds = source_kinds or ["embed"] + [
        "attn" if i % 2 == 0 else "mlp" for i in range(len(sources) - 1)
    ]
    layer_depth = [
        next(j for j in range(len(sources), 0, -1) if np.isfinite(mixing[i, j - 1])) for i in range(n_l)
    ]
    data = {
        "mixing": (("layer", "source"), mixing),
        "mixing_abs": (
            ("layer", "source"),
            np.abs(mixing) if mixing_abs is None else np.asarray(mixing_abs, float),
        ),
        "mixing_std": (("layer", "source"), np.where(np.isfinite(mixing), 0.0, NAN)),
        "contribution_share": (("layer", "source"), share),
        "norm_share": (("layer", "source"), share),
        "source_rms": (("source",), np.ones(len(sources))),
        "input_rms": (("layer",), np.ones(n_l)),
        "residual_error": (("layer",), np.zeros(n_l)),
    }
    coords = {
        "layer": np.array(layers, dtype=object),
        "source": np.array(sources, dtype=object),
        "layer_depth": ("layer", np.array(layer_depth)),
        "layer_kind": ("layer", np.array(layer_kinds, dtype=object)),
        "source_depth": ("source", np.arange(len(sources))),
        "source_kind": ("source", np.array(source_kinds, dtype=object)),
    }
    return xr.Dataset(data, coords=coords, attrs={"label": label, "trace_format": 2})


# A 4-source model: embed, 0.attn, 0.mlp, 1.attn; consumers 0.attn, 0.mlp, 1.attn, 1.mlp (readout-like last)
LAYERS = ["0.attn", "0.mlp", "1.attn", "readout"]
SOURCES = ["embed", "0.attn", "0.mlp", "1.attn"]
MIX = [
    [1.0, NAN, NAN, NAN],
    [2.0, 1.0, NAN, NAN],
    [1.0, -1.0, 2.0, NAN],
    [3.0, 1.0, 1.0, 3.0],
]
SHARE = [
    [1.0, NAN, NAN, NAN],
    [0.25, 0.75, NAN, NAN],
    [0.1, 0.3, 0.6, NAN],
    [0.4, 0.1, 0.2, 0.3],
]


@pytest.fixture
def trace():
    return planted(MIX, SHARE, LAYERS, SOURCES)


def test_baseline_and_dilution_index(trace):
    np.testing.assert_allclose(est.n_available(trace), [1, 2, 3, 4])
    np.testing.assert_allclose(est.baseline(trace), [1.0, 0.5, 1 / 3, 0.25])
    di = est.dilution_index(trace)
    np.testing.assert_allclose(di.sel(layer="0.mlp").dropna("source"), [0.5, 1.5])
    np.testing.assert_allclose(di.sel(layer="readout"), [1.6, 0.4, 0.8, 1.2])
    # a share equal to 1/n is an index of exactly 1
    uniform = planted(
        MIX, [[1, NAN, NAN, NAN], [0.5, 0.5, NAN, NAN], [1 / 3] * 3 + [NAN], [0.25] * 4], LAYERS, SOURCES
    )
    np.testing.assert_allclose(est.dilution_index(uniform).values[np.isfinite(MIX)], 1.0)


def test_row_normalized_is_magnitude_over_row_sum(trace):
    rn = est.row_normalized(trace)
    np.testing.assert_allclose(rn.sel(layer="1.attn").dropna("source"), [0.25, 0.25, 0.5])  # |-1| counts as 1
    np.testing.assert_allclose(rn.sel(layer="readout"), [3 / 8, 1 / 8, 1 / 8, 3 / 8])
    np.testing.assert_allclose(rn.sum("source"), 1.0)


def test_shares_of_embed_first_and_latest(trace):
    np.testing.assert_allclose(est.share_of(trace, "embed"), [1.0, 0.25, 0.1, 0.4])
    latest = est.share_of(trace, "latest")
    assert np.isnan(latest.values[0])  # only the embedding before it: no latest layer
    np.testing.assert_allclose(latest.values[1:], [0.75, 0.6, 0.3])
    first = est.share_of(trace, "first")
    assert np.isnan(first.values[0])  # no sublayer source yet
    np.testing.assert_allclose(first.values[1:], [0.75, 0.3, 0.1])
    with pytest.raises(ValueError):
        est.share_of(trace, "middle")


def test_pattern_score_by_hand(trace):
    # k = 1: I = embedding + the last source. readout: |M| = 3, 1, 1, 3 -> mass 6/8 over |I|/n = 2/4
    ps = est.pattern_score(trace, k=1)
    assert np.isnan(ps.values[:2]).all()  # n <= |I|: nothing to compare
    np.testing.assert_allclose(ps.sel(layer="1.attn"), (1 + 2) / 4 / (2 / 3))
    np.testing.assert_allclose(ps.sel(layer="readout"), (6 / 8) / (2 / 4))
    # magnitude comes from mixing_abs: per-feature signs that cancel in the mean do not hide the weight
    cancel = planted(MIX, SHARE, LAYERS, SOURCES, mixing_abs=np.where(np.isfinite(MIX), 1.0, NAN))
    np.testing.assert_allclose(est.pattern_score(cancel, k=1).sel(layer="readout"), 1.0)
    with pytest.raises(ValueError):
        est.pattern_score(trace, k=-1)


def test_retention_by_lag(trace):
    r = est.retention(trace)
    # source 0.attn (depth 1): lag 1 is 0.mlp (0.75), lag 2 is 1.attn (0.3), lag 3 is the read-out (0.1)
    np.testing.assert_allclose(r.sel(source="0.attn").dropna("lag"), [0.75, 0.3, 0.1])
    np.testing.assert_allclose(r.sel(source="embed").dropna("lag"), [1.0, 0.25, 0.1, 0.4])
    rel = est.relative_retention(trace)
    np.testing.assert_allclose(rel.sel(source="0.attn").dropna("lag"), [0.75 / 0.5, 0.3 * 3, 0.1 * 4])


def test_summary_groups_and_views():
    """DCA's three q/k/v rows of one attention input count once: averaged before the group mean."""
    layers = ["0.attn", "0.mlp", "1.attn.q", "1.attn.k", "1.attn.v", "1.mlp", "readout"]
    sources = ["embed", "0.attn", "0.mlp", "1.attn", "1.mlp"]
    mix = np.full((7, 5), NAN)
    share = np.full((7, 5), NAN)
    for i, n in enumerate([1, 2, 3, 3, 3, 4, 5]):
        mix[i, :n] = 1.0
        share[i, :n] = 1.0 / n
    share[2, :3] = [0.6, 0.2, 0.2]  # q
    share[3, :3] = [0.0, 0.5, 0.5]  # k
    share[4, :3] = [0.3, 0.3, 0.4]  # v
    kinds = ["attn", "mlp", "attn", "attn", "attn", "mlp", "readout"]
    t = planted(mix, share, layers, sources, layer_kinds=kinds)
    s = est.summary(t, k=1)
    # attention inputs: 0.attn (embed share 1) and 1.attn (the views' mean: 0.3) -> 0.65, not (1 + 0.9) / 4
    np.testing.assert_allclose(s["embed_share"].sel(group="attn"), (1.0 + 0.3) / 2)
    np.testing.assert_allclose(s["embed_share"].sel(group="mlp"), (0.5 + 0.25) / 2)
    np.testing.assert_allclose(s["embed_share"].sel(group="sublayers"), (1.0 + 0.5 + 0.3 + 0.25) / 4)
    np.testing.assert_allclose(s["embed_share"].sel(group="readout"), 0.2)
    # a uniform |M| has pattern score 1 wherever it is defined
    np.testing.assert_allclose(s["pattern_score"].sel(group=["sublayers", "attn", "mlp", "readout"]), 1.0)
    assert np.isnan(s["pattern_score"].sel(group="swa"))  # no such inputs
    # a stack is summarised model by model
    other = t.assign_attrs(label="other")
    both = est.summary(stack_traces([t, other]), k=1)
    assert list(both["model"].values) == ["planted", "other"]
    xr.testing.assert_allclose(both.sel(model="other").drop_vars("model"), s)


def test_estimators_keep_the_model_dimension(trace):
    other = planted(np.where(np.isfinite(MIX), 1.0, NAN), SHARE, LAYERS, SOURCES, label="uniform")
    stacked = stack_traces([trace, other])
    ps = est.pattern_score(stacked, k=1)
    assert set(ps.dims) == {"model", "layer"}
    np.testing.assert_allclose(ps.sel(model="uniform").sel(layer="readout"), 1.0)
    np.testing.assert_allclose(
        est.share_of(stacked, "first").sel(model="planted").values[1:], [0.75, 0.3, 0.1]
    )


# --- curves per consumer depth, and estimators of a stack model by model -----------------------


def _views_trace():
    """A DCA-like layout: 1.attn has q, k and v rows at one depth (3)."""
    layers = ["0.attn", "0.mlp", "1.attn.q", "1.attn.k", "1.attn.v", "1.mlp", "readout"]
    sources = ["embed", "0.attn", "0.mlp", "1.attn", "1.mlp"]
    mix = np.full((7, 5), NAN)
    share = np.full((7, 5), NAN)
    for i, n in enumerate([1, 2, 3, 3, 3, 4, 5]):
        mix[i, :n] = 1.0
        share[i, :n] = 1.0 / n
    share[2, :3] = [0.6, 0.2, 0.2]  # q
    share[3, :3] = [0.0, 0.5, 0.5]  # k
    share[4, :3] = [0.3, 0.3, 0.4]  # v
    kinds = ["attn", "mlp", "attn", "attn", "attn", "mlp", "readout"]
    return planted(mix, share, layers, sources, layer_kinds=kinds, label="views")


def test_by_depth_averages_the_views_of_one_input_and_keeps_the_others():
    t = _views_trace()
    curve = est.by_depth(est.share_of(t, "embed"))
    assert curve.dims == ("layer_depth",)
    assert list(curve["layer_depth"].values) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(curve.values, [1.0, 0.5, (0.6 + 0.0 + 0.3) / 3, 0.25, 0.2])
    # one consumer per depth: the values are the consumers' own, exactly
    plain = planted(MIX, SHARE, LAYERS, SOURCES)
    np.testing.assert_array_equal(
        est.by_depth(plain["contribution_share"].sel(source="embed")).values, [1.0, 0.25, 0.1, 0.4]
    )


def test_dilution_curves_are_share_of_and_baseline_by_depth(trace):
    c = est.dilution_curves(trace)
    for which in ("embed", "first", "latest"):
        xr.testing.assert_identical(c[f"{which}_share"], est.by_depth(est.share_of(trace, which)))
    np.testing.assert_allclose(c["baseline"].values, [1.0, 1 / 2, 1 / 3, 1 / 4])
    assert c.attrs == {"label": "planted"}  # a single trace's result is named after it


def test_estimators_of_a_stack_equal_each_models_own(trace):
    """per_model: each model's numbers are those of its trace alone (no padding in them), the
    results are aligned by label (a shorter model gets NaN), and per-model coordinates stay."""
    short = planted(
        [[1.0, NAN], [0.5, 0.5]],
        [[1.0, NAN], [0.4, 0.6]],
        ["0.attn", "readout"],
        ["embed", "0.attn"],
        layer_kinds=["attn", "readout"],
        label="short",
    )
    stacked = stack_traces(
        [trace.assign_attrs(scheme="attnres", step=7), short.assign_attrs(scheme="dca", step=9)]
    )
    for estimator in (
        est.dilution_curves,
        lambda t: est.pattern_curves(t, k=1),
        est.mean_retention,
        est.relative_retention,
    ):
        both = estimator(stacked)
        assert list(both["model"].values) == ["planted", "short"]
        assert list(both["scheme"].values) == ["attnres", "dca"] and list(both["step"].values) == [7, 9]
        for label, t in (("planted", trace), ("short", short)):
            own = estimator(with_blocks(t))  # a stack's models carry their block coordinates
            mine = both.sel(model=label).drop_vars(["model", "scheme", "step"])
            xr.testing.assert_allclose(mine.reindex_like(own), own)
    # the shorter model's missing depths are NaN, never 0
    c = est.dilution_curves(stacked)
    assert np.isnan(c["embed_share"].sel(model="short", layer_depth=[3, 4])).all()


def test_relative_retention_of_a_stack_keeps_each_models_source_depths():
    a = planted(MIX, SHARE, LAYERS, SOURCES, label="a")
    b = planted(MIX, SHARE, LAYERS, ["embed", "0.swa", "0.attn", "0.mlp"], label="b")
    r = est.relative_retention(stack_traces([a, b]))
    assert r["source_depth"].dims == ("model", "source")
    np.testing.assert_array_equal(r["source_depth"].sel(model="b", source=["0.swa", "0.attn"]), [1, 2])
    np.testing.assert_array_equal(r["source_depth"].sel(model="a", source="0.attn"), 1)
    assert list(r["source"].values) == ["embed", "0.attn", "0.mlp", "1.attn", "0.swa"]  # not sorted


def test_pattern_curves_mean_is_the_summary(trace):
    c = est.pattern_curves(trace, k=1)
    assert c.attrs["k"] == 1
    np.testing.assert_allclose(
        c["mean_pattern_score"], est.summary(trace, k=1)["pattern_score"].sel(group="sublayers")
    )
    xr.testing.assert_identical(c["pattern_score"], est.by_depth(est.pattern_score(trace, k=1)))


def test_mean_retention_leaves_the_embedding_out(trace):
    r = est.relative_retention(trace)
    expected = r.sel(source=["0.attn", "0.mlp", "1.attn"]).mean("source")
    np.testing.assert_allclose(est.mean_retention(trace).values, expected.values)
    assert not np.allclose(
        expected.values, r.mean("source").values, equal_nan=True
    )  # the embedding would count


def test_summary_of_a_stack_keeps_the_per_model_coordinates(trace):
    steps = [trace.assign_attrs(label=f"run@{s}", step=s, val_loss=1.0 / s, variant="run") for s in (10, 20)]
    s = est.summary(stack_traces(steps))
    assert list(s["step"].values) == [10, 20] and list(s["variant"].values) == ["run", "run"]
    np.testing.assert_allclose(s["val_loss"].values, [0.1, 0.05])
    assert "data_variables" not in s.coords  # the stack's own bookkeeping stays behind


def test_the_embedding_group_is_one_source_against_its_own_uniform_share():
    """GPT-2 / nanoGPT: a token and a position embedding. A consumer reading only them (100% of its
    input) is exactly at the uniform share of the group (index 1, not 2), the read-out's index is
    the group's share over 2/n, and the latest source is the latest layer, never the position
    embedding."""
    layers = ["0.attn", "0.mlp", "readout"]
    sources = ["embed", "embed.wpe", "0.attn", "0.mlp"]
    kinds = ["embed", "embed", "attn", "mlp"]
    mix = [[1.0, 1.0, NAN, NAN], [1.0, 1.0, 1.0, NAN], [1.0, 1.0, 1.0, 1.0]]
    share = [[0.7, 0.3, NAN, NAN], [0.5, 0.1, 0.4, NAN], [0.2, 0.3, 0.1, 0.4]]
    t = planted(mix, share, layers, sources, source_kinds=kinds)
    table = est.consumer_table(t)
    np.testing.assert_allclose(table["embed_share"], [1.0, 0.6, 0.5])
    np.testing.assert_allclose(table["embed_index"], [1.0, 0.6 / (2 / 3), 0.5 / (2 / 4)])
    latest = table["latest_share"].values
    assert np.isnan(latest[0])  # at 0.attn no layer has written yet
    np.testing.assert_allclose(latest[1:], [0.4, 0.4])
    np.testing.assert_allclose(table["latest_index"].values[1:], [0.4 * 3, 0.4 * 4])
    assert est.unit_weights(t)


def test_the_findings_read_the_embedding_group_against_k_over_n():
    """``depthscope dilution``'s conclusion on the GPT-2 layout above: at the read-out the two
    embeddings hold 0.5 of 4 sources' input, exactly their uniform share 2/4 (index 1, not 2); of the
    two writes, 0.attn (0.1 < 1/4) is below the uniform share and the most diluted, 0.mlp above."""
    layers = ["0.attn", "0.mlp", "readout"]
    sources = ["embed", "embed.wpe", "0.attn", "0.mlp"]
    kinds = ["embed", "embed", "attn", "mlp"]
    mix = [[1.0, 1.0, NAN, NAN], [1.0, 1.0, 1.0, NAN], [1.0, 1.0, 1.0, 1.0]]
    share = [[0.7, 0.3, NAN, NAN], [0.5, 0.1, 0.4, NAN], [0.2, 0.3, 0.1, 0.4]]
    f = est.findings(planted(mix, share, layers, sources, source_kinds=kinds))
    assert (f["layer"], f["n_sources"], f["writes"], f["below"], f["negative"]) == ("readout", 4, 2, 1, 0)
    assert (f["embed_sources"], f["most_diluted"], f["least_diluted"]) == (2, "0.attn", "0.mlp")
    assert f["embed_share"] == pytest.approx(0.5, rel=1e-12)
    assert f["embed_index"] == pytest.approx(1.0, rel=1e-12)
    assert f["most_diluted_index"] == pytest.approx(0.4, rel=1e-12)  # 0.1 over 1/4
    assert f["least_diluted_index"] == pytest.approx(1.6, rel=1e-12)


def test_unit_weights_are_told_apart_from_learned_ones(trace):
    assert not est.unit_weights(trace)  # planted weights 2, -1, 3 ...
    ones = trace.assign(mixing=trace["mixing"] * 0 + 1)
    assert est.unit_weights(ones)
    spread = ones.assign(mixing_std=ones["mixing_std"] + 0.1)
    assert not est.unit_weights(spread)  # per-token weights whose mean is 1 are still learned


def test_findings_of_the_read_out_by_hand():
    """The read-out of a 4-source model: shares 0.4 (embed), -0.05, 0.1, 0.55 over n = 4, so the
    uniform share is 1/4; 2 of the 3 writes are below it, one of them negative; the most diluted
    (smallest |index|) is 0.attn (-0.2), the least 1.attn (2.2); the embedding's index 1.6."""
    mix = [[1.0, NAN, NAN, NAN], [1.0, 1.0, NAN, NAN], [1.0, 1.0, 1.0, NAN], [1.0, 1.0, 1.0, 1.0]]
    share = [[1.0, NAN, NAN, NAN], [0.5, 0.5, NAN, NAN], [0.2, 0.3, 0.5, NAN], [0.4, -0.05, 0.1, 0.55]]
    t = planted(mix, share, LAYERS, SOURCES)
    f = est.findings(t)
    assert (f["n_sources"], f["writes"], f["below"], f["negative"]) == (4, 3, 2, 1)
    assert f["most_diluted"] == "0.attn" and f["most_diluted_index"] == pytest.approx(-0.2)
    assert f["least_diluted"] == "1.attn" and f["least_diluted_index"] == pytest.approx(2.2)
    assert f["embed_sources"] == 1 and f["embed_index"] == pytest.approx(1.6)
    view = est.sources_at(t, "1.attn")
    np.testing.assert_allclose(view["index"], [0.6, 0.9, 1.5])
