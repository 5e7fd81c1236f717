"""Native weights: the stream composite is the product of the matrices over depth."""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthscope.analysis.native import max_row_sum, stream_composite


def test_stream_composite_is_the_product_over_depth_skipping_consumers_without_one():
    rng = np.random.default_rng(0)
    mats = rng.normal(size=(4, 3, 3))
    mats[1] = np.nan  # a consumer without stream mixing
    res = xr.DataArray(
        mats,
        dims=("layer", "stream_from", "stream_to"),
        coords={"layer": ["a", "b", "c", "d"]},
        name="hc_res",
    )
    c = stream_composite(res)
    assert c.dims == ("stream_from", "stream_to") and c.name == "hc_res_composite"
    np.testing.assert_allclose(c.values, mats[0] @ mats[2] @ mats[3])
    # dims are read by name: a transposed input is the same composite
    np.testing.assert_allclose(
        stream_composite(res.transpose("stream_to", "layer", "stream_from")).values, c.values
    )


def test_max_row_sum_of_a_doubly_stochastic_matrix_is_one():
    permutation = np.eye(3)[[2, 0, 1]]
    perm = xr.DataArray(
        0.5 * permutation + 0.5 / 3, dims=("stream_from", "stream_to")
    )  # rows and columns sum to 1
    assert abs(max_row_sum(perm) - 1.0) < 1e-12
    scaled = perm * xr.DataArray([1.0, 2.0, 1.0], dims="stream_from")
    assert abs(max_row_sum(scaled) - 2.0) < 1e-12
