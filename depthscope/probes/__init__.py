"""Hooks and capture: a model + tokens -> a trace (xarray.Dataset)."""

from depthscope.probes.capture import capture, layout, token_windows
from depthscope.probes.trace import TRACE_FORMAT, load_trace, save_trace

__all__ = ["TRACE_FORMAT", "capture", "layout", "load_trace", "save_trace", "token_windows"]
