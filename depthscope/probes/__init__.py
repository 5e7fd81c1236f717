"""Hooks and capture: a model (any family with an adapter) + tokens -> a trace (xarray.Dataset).

Reading, writing and stacking traces is the trace room's (``depthscope.trace``).
"""

from depthscope.probes.adapters.spec import ModelSpec
from depthscope.probes.capture import capture
from depthscope.probes.prompt import inspect

__all__ = ["ModelSpec", "capture", "inspect"]
