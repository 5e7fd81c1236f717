"""Training trajectories: several checkpoints of one run, captured and stacked in step order."""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.settings import CaptureSettings
from depthscope.schemes import load_checkpoint as load
from depthscope.trace import stack_traces


def capture_trajectory(paths: list[Path], settings: CaptureSettings, *, progress: bool = True) -> xr.Dataset:
    """Capture every checkpoint of one run with ``settings`` and stack the traces in step order
    (labels ``variant@step``).

    Each checkpoint's metadata gives its ``step``, ``train_tokens`` and ``val_loss``, which become
    coordinates along ``model``.
    """
    traces = []
    for path in paths:
        t = capture(load(path), None, settings, checkpoint=str(path), progress=progress)
        t.attrs["label"] = f"{t.attrs['variant']}@{t.attrs['step']}"
        traces.append(t)
    steps = [t.attrs["step"] for t in traces]
    if len(set(steps)) != len(steps):
        raise DepthscopeError("a trajectory needs checkpoints at distinct steps")
    return stack_traces(sorted(traces, key=lambda t: t.attrs["step"]))
