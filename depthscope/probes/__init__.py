"""Hooks and capture: a model (any family with an adapter) + tokens -> a trace (xarray.Dataset)."""

from depthscope.probes.capture import capture
from depthscope.probes.trace import (
    TRACE_FORMAT,
    load_trace,
    save_trace,
    select_model,
    split_models,
    stack_traces,
)

__all__ = [
    "TRACE_FORMAT",
    "capture",
    "load_trace",
    "save_trace",
    "select_model",
    "split_models",
    "stack_traces",
]
