"""Native weights: what a scheme's own parametrisation says beyond the delta-basis matrix.

* ``stream_composite``: the product over depth of a multi-stream model's token-mean
  stream-mixing matrices (HC/mHC ``hc_res``, DeepSeek-V4 ``comb``; dims stream_from, stream_to),
  in the source-row convention of the trace (h_final = C^T h_0);
* ``max_row_sum``: the largest sum of |C| over the target streams, the gain a composite can put
  on one stream (1 for a doubly stochastic one).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

FROM, TO = "stream_from", "stream_to"


def stream_composite(res: xr.DataArray) -> xr.DataArray:
    """Product over ``layer`` of the stream-mixing matrices (consumers without one skipped)."""
    res = res.dropna("layer", how="all").transpose("layer", FROM, TO)
    composite = np.eye(res.sizes[FROM])
    for i in range(res.sizes["layer"]):
        composite = composite @ res.isel(layer=i).values
    out = xr.DataArray(composite, dims=(FROM, TO), name=f"{res.name}_composite")
    out.attrs.update(long_name=f"composite of {res.name} over depth (source-row convention)", units="1")
    return out


def max_row_sum(composite: xr.DataArray) -> float:
    """The largest sum over target streams of |composite| (1 for a doubly stochastic matrix)."""
    return float(abs(composite).sum(TO).max())
