"""Checkpoints: one .safetensors file per model, the full config as JSON in its metadata.

Metadata key ``depthscope_config`` holds
``{"format": 1, "depthscope_version": ..., "model": ModelConfig.to_dict(), "training": {...}}``.
Tensors may be stored in 16 bits (the bundled zoo does); they load as float32.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from depthscope.atomic import atomic_path
from depthscope.errors import CheckpointError, DepthscopeError

FORMAT = 1
META_KEY = "depthscope_config"


def save(model, path: str | Path, *, dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` to ``path`` atomically; ``dtype`` (e.g. torch.bfloat16) shrinks the file."""
    from depthscope import __version__

    path = Path(path)
    meta = {
        "format": FORMAT,
        "depthscope_version": __version__,
        "model": model.cfg.to_dict(),
        "training": model.training_summary,
    }
    tensors = {
        k: (v.detach().to(dtype) if dtype is not None and v.is_floating_point() else v.detach())
        .contiguous()
        .cpu()
        for k, v in model.state_dict().items()
    }
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta, sort_keys=True)})
    return path


def step_checkpoint(path: str | Path, step: int) -> Path:
    """Where an intermediate checkpoint of the run saved at ``path`` goes: ``NAME.step-000500.safetensors``."""
    path = Path(path)
    return path.with_name(f"{path.name.removesuffix('.safetensors')}.step-{step:06d}.safetensors")


def read_header(path: Path) -> dict[str, Any]:
    """Parse and check a safetensors header without loading tensors."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: not a safetensors file (only {size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100_000_000:
            raise CheckpointError(f"{path}: not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CheckpointError(f"{path}: not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (header is not a JSON object)")
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v]
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise CheckpointError(f"{path}: truncated file ({size} bytes, header says {need})")
    return header


def read_meta(path: str | Path) -> dict[str, Any]:
    """The depthscope metadata of a checkpoint, validated (format version, config present)."""
    path = Path(path)
    header = read_header(path)
    meta_raw = (header.get("__metadata__") or {}).get(META_KEY)
    if meta_raw is None:
        raise CheckpointError(f"{path}: no {META_KEY} metadata (not a depthscope checkpoint)")
    try:
        meta = json.loads(meta_raw)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: invalid {META_KEY} JSON ({err.msg})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
        raise CheckpointError(f"{path}: invalid {META_KEY}: no model config")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('format')!r}, this depthscope reads {FORMAT}")
    return meta


def load(path: str | Path):
    """Load a depthscope checkpoint; returns the model in eval mode (float32).

    Raises CheckpointError naming the file and the problem for a missing file, a file that is
    not safetensors or is truncated, missing/invalid config, an unknown scheme, missing or
    misshapen tensors, and NaN or Inf weights.
    """
    from depthscope.schemes.base import ModelConfig
    from depthscope.schemes.model import DepthModel

    path = Path(path)
    meta = read_meta(path)
    try:
        cfg = ModelConfig.from_dict(meta["model"])
    except DepthscopeError as err:
        raise CheckpointError(f"{path}: {err}") from None
    except TypeError as err:
        raise CheckpointError(f"{path}: invalid model config ({err})") from None
    try:
        tensors = load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for corrupt data
        raise CheckpointError(f"{path}: unreadable tensors ({err})") from None
    model = DepthModel(cfg, training=meta.get("training"))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(f"{path}: missing tensors: {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{path}: unexpected tensors: {', '.join(extra[:5])}")
    for key, ref in expected.items():
        t = tensors[key]
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(f"{path}: tensor {key} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{path}: tensor {key} holds NaN or Inf values")
        tensors[key] = t.to(ref.dtype)
    model.load_state_dict(tensors)
    return model.eval()
