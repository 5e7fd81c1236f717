"""Estimators of a stack: a one-trace estimator applied model by model, along ``model``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import xarray as xr

from depthscope.trace import STACK, VARIABLES, split_models

Result = TypeVar("Result", xr.DataArray, xr.Dataset)

_VALUE = "__value__"  # the name a DataArray result travels under while results are concatenated


def per_model(trace: xr.Dataset, estimator: Callable[[xr.Dataset], Result]) -> Result:
    """``estimator`` of each model of a stack along ``model``, or of one trace.

    Each model is estimated on its own trace (``split_models``: no padding), so a stack gives every
    model exactly the numbers its trace alone gives. The results are aligned by label (NaN where a
    model lacks an entry; labels in order of first appearance); coordinates that differ per model
    (a source's depth) become per-model coordinates, and the stack's own per-model coordinates
    (``scheme``, ``variant``, ``step``, ``val_loss`` ...) are kept, so a figure can name, colour and
    place every model. One trace's result gets the trace's ``label`` and ``scheme`` as attrs,
    for the same reason.
    """
    if STACK not in trace.dims:
        named = {k: trace.attrs[k] for k in ("label", "scheme") if k in trace.attrs}
        return estimator(trace).assign_attrs(named)
    results = [estimator(t) for t in split_models(trace)]
    array = isinstance(results[0], xr.DataArray)
    sets = [r.to_dataset(name=_VALUE) if array else r for r in results]
    coords = list(dict.fromkeys(c for s in sets for c in s.coords if c not in s.indexes))
    # coordinates travel as variables, so that each model keeps its own (concat keeps only one)
    out = xr.concat(
        [s.reset_coords() for s in sets],
        dim=STACK,
        data_vars="all",
        coords="different",
        compat="equals",
        join="outer",
        combine_attrs="drop_conflicts",
    ).set_coords(coords)
    out = out.reindex({d: _first_appearance(sets, d) for d in out.indexes})
    along = [c for c, v in trace.coords.items() if v.dims == (STACK,) and c not in (STACK, VARIABLES)]
    out = out.assign_coords({STACK: trace[STACK].values, **{c: (STACK, trace[c].values) for c in along}})
    return out[_VALUE].rename(results[0].name) if array else out


def _first_appearance(sets: list[xr.Dataset], dim: str) -> list:
    """The labels of ``dim`` over all results, in order of first appearance (an outer join sorts
    a union of labels, and "10.attn" < "2.attn").
    """
    return list(dict.fromkeys(v for s in sets if dim in s.indexes for v in s.indexes[dim].values))
