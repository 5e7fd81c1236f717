"""The bundled zoo: small checkpoints of every scheme, trained by depthscope itself.

``manifest.json`` lists each checkpoint with its scheme, config, training settings, validation
loss and digests, and for the models that keep one, the bundled training trajectory (a small
trace file under ``trajectories/``: captures at several steps of the same run). Which variants
the zoo holds is declared by each scheme (``Scheme.zoo``, ``Scheme.trajectories``);
``depthscope zoo build`` (``depthscope.pipelines.zoo``) retrains them with fixed seeds on the
default corpus, single-threaded, so the same machine and build reproduce the same weights bit for
bit; weights are stored in bfloat16 to keep the whole zoo under 10 MB.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from depthscope.errors import DepthscopeError

ZOO_DIR = Path(__file__).parent
MANIFEST = "manifest.json"
TRAJECTORY_DIR = "trajectories"  # bundled trajectory traces, one stacked trace file per model
STEPS_DIR = "steps"  # intermediate checkpoints of a build (not bundled)

# One model size for every scheme: 8 blocks (16 sublayers) so that the depth pattern can show.
SIZE = dict(n_layers=8, d_model=64, n_heads=4, ctx=128)
# 4000 steps of 16 x 128 bytes (8.2 M tokens): 5x the first zoo's 800 steps, the budget at which
# full AttnRes and DCA were measured to form the input-and-recent pattern.
STEPS, BATCH, LR, SEED = 4000, 16, 3e-3, 0
# Trajectory captures at these fractions of the run: steps 250, 500, 1000, 2000 (and the final
# model) at 4000 steps.
TRAJECTORY_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)


def trajectory_steps(steps: int) -> list[int]:
    """The intermediate steps whose checkpoints a run of ``steps`` keeps for its trajectory."""
    return sorted({round(f * steps) for f in TRAJECTORY_FRACTIONS} - {0, steps})


def read_manifest(directory: str | Path = ZOO_DIR) -> list[dict[str, Any]]:
    """The manifest entries of a zoo directory (the bundled one by default)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise DepthscopeError(f"{path}: no zoo manifest (build one with `depthscope zoo build`)")
    try:
        models = json.loads(path.read_text())["models"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise DepthscopeError(f"{path}: unreadable zoo manifest ({err})") from None
    if not isinstance(models, list):
        raise DepthscopeError(f"{path}: unreadable zoo manifest (models is not a list)")
    for i, m in enumerate(models):
        if not _valid_entry(m):
            raise DepthscopeError(
                f"{path}: unreadable zoo manifest (entry {i} lacks its fields or has odd types)"
            )
    return models


# the fields of a manifest entry that readers use, and their JSON types
ENTRY_FIELDS = {
    "name": str,
    "scheme": str,
    "file": str,
    "config": dict,
    "params": int,
    "bytes": int,
    "steps": int,
    "seed": int,
    "val_loss": (int, float),
}


def _valid_entry(m: Any) -> bool:
    if not isinstance(m, dict) or not all(isinstance(m.get(k), t) for k, t in ENTRY_FIELDS.items()):
        return False
    c = m["config"]
    return isinstance(c.get("options"), dict) and all(type(c.get(k)) is int for k in ("n_layers", "d_model"))


def checkpoints(directory: str | Path = ZOO_DIR) -> list[Path]:
    """Paths of the zoo's checkpoints, in manifest order."""
    return [Path(directory) / m["file"] for m in read_manifest(directory)]


def trajectories(directory: str | Path = ZOO_DIR) -> list[Path]:
    """Paths of the zoo's bundled trajectory traces, in manifest order."""
    return [
        Path(directory) / m["trajectory"]["file"] for m in read_manifest(directory) if m.get("trajectory")
    ]


def sha256(path: Path) -> str:
    """Digest of the whole file (for a checkpoint it also covers the recorded training throughput)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def weights_sha256(path: Path) -> str:
    """Digest of the tensors alone (names, dtypes, shapes, bytes): equal for a reproduced build,
    whose file differs only in the wall-clock throughput recorded in its metadata.
    """
    import torch
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(str(path)).items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
