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


def write_split(trace: xr.Dataset) -> xr.DataArray | None:
    """Each part's share of an attention's write, for schemes that attend over depth (MoDA,
    Depth-Attention, the value residual): sum over tokens of <part, write> over the sum of
    |write|^2, by layer (the attention consumer) and depth (the block the part came through). Each
    row sums to 1: the parts add up to the write, checked on every batch. None without the rows.
    """
    if "depth_write" not in trace:
        return None
    out = trace["depth_write"] / trace["depth_write_total"]
    out.name = "write_split"
    out.attrs.update(
        long_name="share of an attention's write that came through each block's memory", units="1"
    )
    return out


def routed_shares(trace: xr.Dataset, layer: str = "readout") -> xr.DataArray:
    """The shares of consumer ``layer``'s input by block (``embed``, then blocks 0, 1, ...),
    counting what reached it through attention as well as through the stream.

    Through the stream, a block's share is the sum of its sources' contribution shares. An
    attention that attends over depth (``write_split``) passes its own share on to the blocks
    whose memory its write came through, in proportion to their parts of the write. The shares
    still sum to 1. A first-order bookkeeping: a part is credited to the block whose keys and
    values carried it, not traced further back through that block's own input.
    """
    from depthscope.trace.format import with_blocks

    trace = with_blocks(trace)
    share = trace["contribution_share"].sel(layer=layer).fillna(0.0)
    blocks = [str(b) for b in trace["source_block"].values]
    order = list(dict.fromkeys(blocks))
    out = dict.fromkeys(order, 0.0)
    split = write_split(trace)
    for source, block, s in zip(trace["source"].values, blocks, share.values):
        row = None if split is None or source not in split["layer"] else split.sel(layer=source)
        if row is None or not bool(row.notnull().any()):
            out[block] += float(s)
            continue
        for j, p in enumerate(row.values):
            if np.isfinite(p):
                out[str(j)] += float(s) * float(p)
    da = xr.DataArray(list(out.values()), dims="block", coords={"block": order}, name="routed_share")
    da.attrs.update(
        long_name=f"share of {layer}'s input by block, through the stream and through attention over depth",
        units="fraction",
    )
    return da
