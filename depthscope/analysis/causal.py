"""Weight against effect, and how far back a consumer reads: pure functions of traces.

* ``weight_effect``: every available (consumer, source) cell with its contribution share, its
  row-normalised weight and its ablation effect (``ablation_effect_cell``, the loss increase when
  the source is removed from that consumer alone), one row per cell along ``cell``;
* ``weight_effect_correlation``: Spearman's rank correlation of the effect with the share and with
  the weight, per model: does the largest routing mass have the largest causal effect?
  (``cell_correlation``: the same from the cells);
* ``read_depth``: per consumer, the mass-weighted mean lag over its sources (lag = consumer depth -
  source depth, in sublayers; mass = the row-normalised weight |M|) and the mass on the embedding:
  how far back a consumer reads;
* ``views``: those two for the views of multi-input consumers (DCA's q, k and v) by block.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from scipy.stats import spearmanr

from depthscope.analysis.dilution import row_normalized
from depthscope.trace import STACK, split_models
from depthscope.trace.labels import EMBED


def weight_effect(trace: xr.Dataset) -> xr.Dataset:
    """One row per available cell (dim ``cell``): ``share``, ``weight`` (row-normalised |M|),
    ``effect`` (the cell's ablation effect), with ``layer`` and ``source`` coordinates.
    """
    if "ablation_effect_cell" not in trace:
        raise ValueError("the trace has no ablation_effect_cell: capture it with ablate='cells'")
    table = xr.Dataset(
        {
            "share": trace["contribution_share"],
            "weight": row_normalized(trace),
            "effect": trace["ablation_effect_cell"],
        }
    )
    flat = table.stack(cell=("layer", "source"))
    keep = np.flatnonzero(flat["effect"].notnull().values & flat["share"].notnull().values)
    return flat.isel(cell=keep)


def weight_effect_correlation(trace: xr.Dataset) -> xr.Dataset:
    """Spearman's rho of the cell effects with the shares and with the weights (per model)."""
    if STACK in trace.dims:
        rows = [weight_effect_correlation(t) for t in split_models(trace)]
        return xr.concat(rows, dim=xr.DataArray(trace[STACK].values, dims=STACK, name=STACK))
    return cell_correlation(weight_effect(trace))


def cell_correlation(cells: xr.Dataset) -> xr.Dataset:
    """``weight_effect_correlation`` of one model's cells (``weight_effect``'s output)."""
    out = {}
    for name in ("share", "weight"):
        x, y = cells[name].values, cells["effect"].values
        out[f"rho_{name}"] = float(spearmanr(x, y).statistic) if len(x) > 2 and np.ptp(x) > 0 else np.nan
    out["cells"] = cells.sizes["cell"]
    ds = xr.Dataset({k: ((), v) for k, v in out.items()})
    ds["rho_share"].attrs.update(
        long_name="Spearman rho: contribution share vs cell ablation effect", units="1"
    )
    ds["rho_weight"].attrs.update(
        long_name="Spearman rho: row-normalised weight vs cell ablation effect", units="1"
    )
    return ds


def read_depth(trace: xr.Dataset) -> xr.Dataset:
    """Per consumer: ``mean_lag`` (sublayers back, weighted by the row-normalised |M|) and
    ``embed_mass`` (the row-normalised |M| on the embedding source(s)).
    """
    p = row_normalized(trace)
    lag = trace["layer_depth"] - trace["source_depth"]
    out = xr.Dataset(
        {
            "mean_lag": (p * lag).sum("source", min_count=1),
            "embed_mass": p.where(trace["source_kind"] == EMBED).sum("source", min_count=1),
        }
    )
    out["mean_lag"].attrs.update(
        long_name="mass-weighted mean lag over sources (sublayers)", units="sublayers"
    )
    out["embed_mass"].attrs.update(long_name="row-normalised weight on the embedding", units="fraction")
    return out


def views(trace: xr.Dataset) -> xr.Dataset:
    """``read_depth`` of the views of multi-input consumers (labels ``{block}.attn.{view}``), with
    dims (block, view); empty (no ``view`` entries) when the model has no such consumer.
    """
    labels = [str(x) for x in trace["layer"].values]
    rows = [(i, lab.split(".")) for i, lab in enumerate(labels) if lab.count(".") == 2]
    depth = read_depth(trace)
    blocks = sorted({int(parts[0]) for _, parts in rows})
    names = list(dict.fromkeys(parts[2] for _, parts in rows))
    data = {v: np.full((len(blocks), len(names)), np.nan) for v in depth.data_vars}
    for i, parts in rows:
        b, _, view = parts
        for v in depth.data_vars:
            data[v][blocks.index(int(b)), names.index(view)] = float(depth[v].isel(layer=i))
    out = xr.Dataset(
        {v: (("block", "view"), a) for v, a in data.items()},
        coords={"block": np.array(blocks, dtype=np.int64), "view": np.array(names, dtype=object)},
    )
    for v in depth.data_vars:
        out[v].attrs = depth[v].attrs
    return out
