"""Several traces along a ``model`` dimension: stacking, selecting one model, splitting a stack.

One entry per analysed model, labelled by its trace's ``label``; what was an attr of one trace
(``scheme``, ``variant``, ``family``, ``checkpoint``, ``config``, ``step`` ...) becomes a coordinate
along ``model``, and ``select_model`` gives one trace back.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthscope.errors import TraceError
from depthscope.trace.format import GLOBAL_ATTRS, REQUIRED, STACK, TRACE_FORMAT, VARIABLES, with_blocks
from depthscope.trace.labels import READOUT

BLOCK_COORDS = ("layer_block", "source_block")  # derived from the labels: recomputed after a union


def _merge_order(traces: list[xr.Dataset], dim: str) -> list[str]:
    """Labels of ``dim`` over all traces, in an order consistent with every trace's own order.

    A topological merge of the traces' label sequences (each trace is in execution order), ties
    broken by depth and then first appearance; the read-out always closes the order. So a scheme
    with an extra sublayer kind (``0.swa`` before ``0.attn``) interleaves correctly with others.
    """
    first: dict[str, tuple[bool, int, int]] = {}
    after: dict[str, set[str]] = {}
    indegree: dict[str, int] = {}
    for t in traces:
        labels = [str(x) for x in t[dim].values]
        depths = t[f"{dim}_depth"].values
        for i, label in enumerate(labels):
            if label not in first:
                first[label] = (label == READOUT, int(depths[i]), len(first))
                after[label], indegree[label] = set(), 0
        for a, b in zip(labels, labels[1:]):
            if b not in after[a]:
                after[a].add(b)
                indegree[b] += 1
    ready = sorted((k for k, n in indegree.items() if n == 0), key=first.get)
    order = []
    while ready:
        label = ready.pop(0)
        order.append(label)
        for b in after[label]:
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
        ready.sort(key=first.get)
    if len(order) < len(first):  # traces disagree on an order: fall back to depth order
        order = sorted(first, key=first.get)
    return order


def _per_model_coords(traces: list[xr.Dataset], dim: str, labels: list[str]) -> dict[str, tuple]:
    """``{dim}_depth`` and ``{dim}_kind`` as (model, dim) coordinates: -1 / "" where absent."""
    index = {label: i for i, label in enumerate(labels)}
    depth = np.full((len(traces), len(labels)), -1, dtype=np.int64)
    kind = np.full((len(traces), len(labels)), "", dtype=object)
    for k, t in enumerate(traces):
        cols = [index[str(x)] for x in t[dim].values]
        depth[k, cols] = t[f"{dim}_depth"].values
        kind[k, cols] = t[f"{dim}_kind"].values
    return {f"{dim}_depth": ((STACK, dim), depth), f"{dim}_kind": ((STACK, dim), kind)}


def _attr_array(values: list) -> np.ndarray:
    """One per-model attr as a coordinate: integers, floats, or text (missing: -1, NaN, "")."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, (bool, int, np.integer)) and not isinstance(v, bool) for v in present):
        return np.array([-1 if v is None else int(v) for v in values], dtype=np.int64)
    if present and all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in present
    ):
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    return np.array(["" if v is None else str(v) for v in values], dtype=object)


def stack_traces(traces: list[xr.Dataset]) -> xr.Dataset:
    """Concatenate traces along a ``model`` dimension (labels from each trace's ``label``).

    Consumers and sources are the union over traces, in an order consistent with each trace's
    execution order; a trace's missing rows and columns are NaN. Depth and kind coordinates become
    (model, layer) / (model, source) arrays (-1 and "" where a trace lacks the label), and every
    per-trace attr (scheme, variant, config, checkpoint, corpus, tokens, seed, ...) a coordinate
    along ``model``. A stacked trace contributes each of its models. ``select_model`` gives one
    trace back.
    """
    traces = [m for t in traces for m in (split_models(t) if STACK in t.dims else [t])]
    if not traces:
        raise TraceError("no traces to stack")
    # which variables each model has: the stack holds the union, NaN where a model has none
    traces = [t.assign_attrs({VARIABLES: ",".join(sorted(map(str, t.data_vars)))}) for t in traces]
    labels, counts = [], {}
    for t in traces:
        base = str(t.attrs.get("label", t.attrs.get("scheme", "trace")))
        counts[base] = counts.get(base, 0) + 1
        labels.append(base if counts[base] == 1 else f"{base}#{counts[base]}")
    layers, srcs = _merge_order(traces, "layer"), _merge_order(traces, "source")
    coords = {**_per_model_coords(traces, "layer", layers), **_per_model_coords(traces, "source", srcs)}
    traces = [t.drop_vars([c for c in BLOCK_COORDS if c in t.coords]) for t in traces]
    variables = {}
    for t in traces:
        for name, var in t.data_vars.items():
            variables.setdefault(name, var)
    padded = _unindexed_sizes(traces)
    aligned = []
    for t in traces:
        t = t.drop_vars([c for c in coords if c in t.coords])
        t = t.reindex(layer=np.array(layers, dtype=object), source=np.array(srcs, dtype=object))
        # dims without labels (``component`` of spectra of different widths, a native quantity's
        # streams) are padded with NaN at the end to the largest size
        t = t.pad({d: (0, n - t.sizes[d]) for d, n in padded.items() if d in t.dims and t.sizes[d] < n})
        for name, var in variables.items():
            if name not in t:
                t[name] = _missing(t, var, padded)
        aligned.append(t.drop_attrs())
    out = xr.concat(
        aligned, dim=STACK, join="outer", combine_attrs="drop", coords="minimal", compat="override"
    )
    keys = [
        k for k in dict.fromkeys(k for t in traces for k in t.attrs) if k not in GLOBAL_ATTRS and k != "label"
    ]
    per_model = {k: (STACK, _attr_array([t.attrs.get(k) for t in traces])) for k in keys}
    out = out.assign_coords({STACK: np.array(labels, dtype=object), **coords, **per_model})
    for name in variables:
        out[name].attrs = dict(variables[name].attrs)
    return with_blocks(out).assign_attrs(
        trace_format=TRACE_FORMAT, depthscope_version=traces[0].attrs.get("depthscope_version", "")
    )


def _missing(t: xr.Dataset, var: xr.DataArray, padded: dict[str, int]) -> xr.DataArray:
    """``var`` all NaN, for a model that lacks it: on this model's dims where it has them; a dim it
    lacks keeps the holder's labels (the concat's outer join unites them with other depths'), or
    without labels takes the stack's padded size.
    """
    labelled = {d: var[d].values for d in var.dims if d not in t.dims and d in var.indexes}
    shape = [
        t.sizes.get(d, len(labelled[d]) if d in labelled else padded.get(d, var.sizes[d])) for d in var.dims
    ]
    return xr.DataArray(np.full(shape, np.nan), dims=var.dims, coords=labelled)


def _unindexed_sizes(traces: list[xr.Dataset]) -> dict[str, int]:
    """The largest size of every dimension that has no coordinate, over ``traces``."""
    sizes: dict[str, int] = {}
    for t in traces:
        for d, n in t.sizes.items():
            if d not in t.indexes and d not in ("layer", "source"):
                sizes[d] = max(sizes.get(d, 0), n)
    return sizes


def _attr_value(v):
    """A coordinate value back as an attr (the numeric missing markers of ``_attr_array``, -1 and
    NaN, dropped; text comes back as it is, "" included).
    """
    v = v.item() if hasattr(v, "item") else v
    return None if (isinstance(v, int) and v == -1) or (isinstance(v, float) and v != v) else v


def select_model(stacked: xr.Dataset, label: str) -> xr.Dataset:
    """One trace out of a stack, without the padding rows/columns, with its attrs restored."""
    if STACK not in stacked.dims:
        raise TraceError("not a stack of traces (no 'model' dimension)")
    if label not in set(str(m) for m in stacked[STACK].values):
        raise TraceError(
            f"no model {label!r} in the stack (models: {', '.join(map(str, stacked[STACK].values))})"
        )
    t = stacked.sel({STACK: label})
    rows, cols = t["layer_depth"].values >= 0, t["source_depth"].values >= 0  # present in this trace
    t = t.isel(layer=np.flatnonzero(rows), source=np.flatnonzero(cols))
    per_model = [c for c, v in t.coords.items() if v.dims == () and c != STACK]
    attrs = {c: _attr_value(t[c].values) for c in per_model}
    t = t.drop_vars([STACK, *per_model])
    own = attrs.pop(VARIABLES, None)
    if own is not None:  # the variables of other models in the stack: not this model's
        t = t.drop_vars([v for v in t.data_vars if v not in set(str(own).split(","))])
    else:  # a stack that does not say (format 1): another model's variable is all NaN in this one's row
        t = t.drop_vars([v for v in t.data_vars if v not in REQUIRED and not bool(t[v].notnull().any())])
    for d in _unindexed_sizes([t]):  # the padding of a narrower trace: trailing all-NaN entries
        data = [v for v in t.data_vars.values() if d in v.dims]
        present = np.zeros(t.sizes[d], dtype=bool)
        for v in data:
            present |= (
                v.notnull().any([x for x in v.dims if x != d]).values if v.ndim > 1 else v.notnull().values
            )
        keep = int(np.flatnonzero(present)[-1]) + 1 if present.any() else t.sizes[d]
        t = t.isel({d: slice(0, keep)})
    return t.assign_attrs(
        {**stacked.attrs, **{k: v for k, v in attrs.items() if v is not None}, "label": label}
    )


def split_models(trace: xr.Dataset) -> list[xr.Dataset]:
    """The traces of a stack (one per model, in order), or ``[trace]`` for a single trace."""
    if STACK not in trace.dims:
        return [trace]
    return [select_model(trace, str(m)) for m in trace[STACK].values]
