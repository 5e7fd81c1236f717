"""Stream-collapse measures on planted streams: one carrier, identical copies, orthogonal streams,
identity and permutation matrices, per-channel weights; the trace path against the per-token one."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from depthscope.analysis import streams as st

N, D, TOK = 4, 16, 30


def rng(seed=0):
    return np.random.default_rng(seed)


def measures(h, a=None, res=None):
    return st.stream_collapse(st.stream_statistics(h, a, res))


def test_one_stream_carries_everything():
    h = np.zeros((TOK, N, D))
    h[:, 2] = rng().normal(size=(TOK, D))
    m = measures(h)
    np.testing.assert_allclose(m.stream_share.values, [0, 0, 1, 0], atol=1e-15)
    assert float(m.participation_ratio) == pytest.approx(1.0, abs=1e-14)
    assert int(m.dominant_stream) == 2
    assert float(m.mean_cosine) == 0.0  # zero streams have cosine 0 with everything
    assert float(m.distinct_streams) == pytest.approx(1.0, rel=1e-14)


def test_identical_streams_count_n_and_have_cosine_one():
    x = rng(1).normal(size=(TOK, 1, D))
    m = measures(np.repeat(x, N, axis=1), rng(2).uniform(0.5, 1.5, size=(TOK, 1)).repeat(N, 1))
    np.testing.assert_allclose(m.stream_share.values, 1 / N, rtol=1e-14)
    assert float(m.participation_ratio) == pytest.approx(N, rel=1e-14)
    assert float(m.participation_ratio_norm) == pytest.approx(N, rel=1e-14)
    assert float(m.mean_cosine) == pytest.approx(1.0, rel=1e-14)
    assert float(m.distinct_streams) == pytest.approx(1.0, rel=1e-14)  # n even shares, one signal


def test_orthogonal_streams_of_equal_norm():
    # per token, n orthonormal directions (a random rotation's columns) scaled by one norm
    q = np.linalg.qr(rng(3).normal(size=(TOK, D, D)))[0][:, :, :N]  # [token, d_model, stream]
    h = np.swapaxes(q, 1, 2) * rng(4).uniform(0.5, 2.0, size=(TOK, 1, 1))
    m = measures(h)
    np.testing.assert_allclose(m.stream_share.values, 1 / N, rtol=1e-12)
    assert float(m.participation_ratio) == pytest.approx(N, rel=1e-12)
    assert abs(float(m.mean_cosine)) <= 1e-14
    np.testing.assert_allclose(m.stream_cosine.values, np.eye(N), atol=1e-14)
    assert float(m.distinct_streams) == pytest.approx(N, rel=1e-12)


def test_shares_sum_to_one_with_per_channel_weights():
    h, a = rng(5).normal(size=(TOK, N, D)), rng(6).normal(size=(TOK, N, D))
    m = measures(h, a)
    assert float(m.stream_share.sum()) == pytest.approx(1.0, abs=1e-13)
    assert float(m.norm_share.sum()) == pytest.approx(1.0, abs=1e-13)
    # against the definition, written out
    c = h * a
    y = c.sum(1)
    want = np.array([(c[:, s] * y).sum() for s in range(N)]) / (y**2).sum()
    np.testing.assert_allclose(m.stream_share.values, want, rtol=1e-12)
    assert float(m.participation_ratio) == pytest.approx(want.sum() ** 2 / (want**2).sum(), rel=1e-12)


def test_identity_and_permutation_distances():
    h = rng(7).normal(size=(TOK, N, D))
    eye = np.broadcast_to(np.eye(N), (TOK, N, N))
    assert float(measures(h, res=eye).res_distance) == 0.0
    # a permutation moving k of the n streams: |P - I|_F^2 = 2k (k ones off, k ones on the diagonal lost)
    perm = np.eye(N)[[1, 0, 3, 2]]  # swaps 0<->1 and 2<->3: k = 4
    swapped = measures(h, res=np.broadcast_to(perm, (TOK, N, N)))
    assert float(swapped.res_distance) == pytest.approx(np.sqrt(8), rel=1e-15)
    three_cycle = np.eye(N)[[1, 2, 0, 3]]  # k = 3
    assert st.identity_distance(three_cycle) == pytest.approx(np.sqrt(6), rel=1e-15)
    assert np.isnan(float(st.stream_collapse(st.stream_statistics(h, mixes=False)).res_distance))


def test_sums_over_batches_equal_one_pass():
    h, a = rng(8).normal(size=(TOK, N, D)), rng(9).uniform(size=(TOK, N))
    res = rng(10).uniform(size=(TOK, N, N))
    parts = [st.stream_statistics(h[s], a[s], res[s]) for s in (slice(0, 11), slice(11, None))]
    summed = xr.concat(parts, "part").sum("part", keep_attrs=True)
    one, two = st.stream_collapse(st.stream_statistics(h, a, res)), st.stream_collapse(summed)
    for name in ("stream_share", "participation_ratio", "mean_cosine", "distinct_streams", "res_distance"):
        np.testing.assert_allclose(two[name].values, one[name].values, rtol=1e-12)


def test_trace_distances_and_the_table():
    perm = np.eye(N)[[1, 0, 2, 3]]
    res = xr.DataArray(
        np.stack([np.eye(N), perm, np.full((N, N), np.nan)]),
        dims=("layer", st.FROM, st.TO),
        coords={"layer": ["0.attn", "0.mlp", "readout"]},
        name="hc_res",
    )
    got = st.trace_res_distance(xr.Dataset({"hc_res": res}))
    np.testing.assert_allclose(got.res_distance_of_mean.values, [0.0, 2.0, np.nan])
    assert float(got.composite_distance_of_mean) == pytest.approx(2.0)  # I @ perm = perm
    assert not st.trace_res_distance(xr.Dataset()).data_vars

    layers = []
    for k, label in enumerate(["0.attn", "readout"]):
        h = np.zeros((TOK, N, D))
        h[:, k] = 1.0
        s = st.stream_statistics(h, res=np.broadcast_to(perm, (TOK, N, N)) if k == 0 else None, mixes=k == 0)
        layers.append(s.expand_dims(layer=[label]))
    stats = xr.concat(layers, "layer")
    stats["composite_distance_sum"], stats["composite_tokens"] = 2.0 * TOK, float(TOK)
    stats["composite_uniform_distance_sum"] = np.sqrt(3.0) * TOK
    (row,) = st.stream_table({"planted": st.stream_collapse(stats)})
    assert row == {
        "model": "planted",
        "n_streams": N,
        "participation_ratio": 1.0,
        "dominant_stream": 1,
        "dominant_share": 1.0,
        "mean_cosine": 0.0,
        "distinct_streams": 1.0,
        "mean_res_distance": 2.0,
        "composite_distance": 2.0,
        "composite_uniform_distance": pytest.approx(np.sqrt(3.0), rel=1e-15),
    }
