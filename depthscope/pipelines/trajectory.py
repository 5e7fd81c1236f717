"""Training trajectories: several checkpoints of one run, captured and stacked in step order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.trace import stack_traces
from depthscope.schemes.checkpoint import load


def capture_trajectory(paths: list[Path], *, n_tokens: int = 8192, seed: int = 0, progress: bool = False) -> xr.Dataset:
    """Capture every checkpoint of one run and stack the traces in step order.

    Each checkpoint's metadata gives its ``step``, ``train_tokens`` and ``val_loss``; they become
    coordinates along the stacking dimension.
    """
    traces, steps = [], []
    for path in paths:
        model = load(path)
        s = model.training_summary
        step = int(s.get("step", s.get("steps", 0)))
        t = capture(model, None, n_tokens=n_tokens, seed=seed, checkpoint=str(path))
        t.attrs["label"] = f"{t.attrs['label']}@{step}"
        traces.append(t)
        steps.append((step, int(s.get("train_tokens", 0)), float(s.get("val_loss", np.nan))))
    if len({s for s, _, _ in steps}) != len(steps):
        raise DepthscopeError("a trajectory needs checkpoints at distinct steps")
    order = np.argsort([s for s, _, _ in steps])
    stacked = stack_traces([traces[i] for i in order])
    dim = "scheme"
    return stacked.assign_coords(
        step=(dim, np.array([steps[i][0] for i in order])),
        train_tokens=(dim, np.array([steps[i][1] for i in order])),
        val_loss=(dim, np.array([steps[i][2] for i in order])),
    )
