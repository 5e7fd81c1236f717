"""Data in: the one place figures turn what they are given into models (labels, schemes, parts).

* ``traces_by_model``: (label, trace) per model of a trace, a stack or a list of traces, for the
  wrappers that take traces (``*_figure``), which call the estimators;
* ``by_model``: (label, scheme, that model's part) along the ``model`` dimension of an estimator's
  output (or the one model its attrs name), for the primitives (``plot_*``), which only draw;
* ``unpadded``: one model's part of a stack without the consumers and sources it lacks;
* ``colors``: the colour of each model, by its ``scheme`` (``style.model_colors``);
* ``run_label``: the name of a run whose checkpoints are the models (its ``variant``).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthscope.errors import DepthscopeError
from depthscope.figures.style import model_colors
from depthscope.trace import STACK, select_model

Data = xr.DataArray | xr.Dataset


def trace_label(trace: Data) -> str:
    """A trace's display label: attrs ``label``, else ``scheme``, else ``trace``."""
    return str(trace.attrs.get("label", trace.attrs.get("scheme", "trace")))


def traces_by_model(data) -> list[tuple[str, xr.Dataset]]:
    """(label, trace) per model from a trace, a trace stacked along ``model`` (padding dropped by
    ``select_model``) or a list of traces (labels deduplicated as ``stack_traces`` does).
    """
    if isinstance(data, xr.Dataset):
        if STACK not in data.dims:
            return [(trace_label(data), data)]
        return [(str(m), select_model(data, str(m))) for m in data[STACK].values]
    if isinstance(data, xr.DataArray):
        raise DepthscopeError("expected a trace Dataset (or a list of them), got a DataArray")
    out, counts = [], {}
    for t in data:
        if not isinstance(t, xr.Dataset):
            raise DepthscopeError(f"expected trace Datasets, got {type(t).__name__}")
        base = trace_label(t)
        counts[base] = counts.get(base, 0) + 1
        out.append((base if counts[base] == 1 else f"{base}#{counts[base]}", t))
    if not out:
        raise DepthscopeError("no traces to plot")
    return out


def by_model(data: Data) -> list[tuple[str, str, Data]]:
    """(label, scheme, part) per entry of the ``model`` dimension (labels from the ``model``
    coordinate, schemes from the ``scheme`` coordinate), or the one model of ``data`` (attrs
    ``label`` and ``scheme``, "" where absent).
    """
    if not isinstance(data, (xr.DataArray, xr.Dataset)):
        raise DepthscopeError(f"expected a DataArray or a Dataset, got {type(data).__name__}")
    if STACK not in data.dims:
        return [(str(data.attrs.get("label", "")), str(data.attrs.get("scheme", "")), data)]
    n = data.sizes[STACK]
    labels = data[STACK].values if STACK in data.coords else [str(i) for i in range(n)]
    schemes = data["scheme"].values if "scheme" in data.coords else [""] * n
    return [(str(labels[i]), str(schemes[i]), data.isel({STACK: i})) for i in range(n)]


def colors(data: Data) -> dict[str, str]:
    """Label -> colour of every model of ``data`` (``by_model``), distinct within the figure."""
    return model_colors((label, scheme) for label, scheme, _ in by_model(data))


def unpadded(part: Data) -> Data:
    """A model's part of a stack without the rows and columns it lacks (depth < 0, or NaN where
    an estimator's results were aligned): what ``select_model`` keeps.
    """
    for dim in ("layer", "source"):
        depth = part.coords.get(f"{dim}_depth")
        if dim in part.dims and depth is not None and depth.dims == (dim,):
            part = part.isel({dim: np.flatnonzero(np.asarray(depth.values, dtype=float) >= 0)})
    return part


def run_label(trajectory: Data) -> str:
    """The run whose checkpoints a trajectory stacks: its ``variant`` coordinate (the label of a
    checkpoint is ``variant@step``), else the first model's label.
    """
    if "variant" in trajectory.coords and str(trajectory["variant"].values.flat[0]):
        return str(trajectory["variant"].values.flat[0])
    return str(trajectory[STACK].values[0])
