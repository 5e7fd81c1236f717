"""The checkpoint format: one .safetensors file per model, the full config as JSON in its metadata.

Reading and writing the format lives here; ``schemes.model`` builds models from it
(``DepthModel.save``, ``load_checkpoint``).

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
from safetensors.torch import save_file

from depthscope._version import __version__
from depthscope.atomic import atomic_path
from depthscope.errors import CheckpointError

FORMAT = 1
META_KEY = "depthscope_config"


def write(
    path: str | Path,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    *,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``tensors`` and the metadata ``meta`` (the ``model`` and ``training`` parts) atomically;
    ``dtype`` (e.g. torch.bfloat16) shrinks floating-point tensors.
    """
    path = Path(path)
    meta = {"format": FORMAT, "depthscope_version": __version__, **meta}
    tensors = {
        k: (v.detach().to(dtype) if dtype is not None and v.is_floating_point() else v.detach())
        .contiguous()
        .cpu()
        for k, v in tensors.items()
    }
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta, sort_keys=True)})
    return path


def step_checkpoint(path: str | Path, step: int) -> Path:
    """Path of an intermediate checkpoint of the run saved at ``path``: ``NAME.step-000500.safetensors``."""
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
    for key, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if key != "__metadata__" and not (
            isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)
        ):
            raise CheckpointError(
                f"{path}: not a safetensors file (tensor {key[:60]!r} has no valid data_offsets)"
            )
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise CheckpointError(f"{path}: truncated file ({size} bytes, header says {need})")
    return header


def read_meta(path: str | Path) -> dict[str, Any]:
    """The depthscope metadata of a checkpoint, validated (format version, config present)."""
    path = Path(path)
    header = read_header(path)
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: not a safetensors file (__metadata__ is not a JSON object)")
    meta_raw = metadata.get(META_KEY)
    if meta_raw is None:
        raise CheckpointError(f"{path}: no {META_KEY} metadata (not a depthscope checkpoint)")
    if not isinstance(meta_raw, str):
        raise CheckpointError(f"{path}: invalid {META_KEY}: not a JSON string")
    try:
        meta = json.loads(meta_raw)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: invalid {META_KEY} JSON ({err.msg})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
        raise CheckpointError(f"{path}: invalid {META_KEY}: no model config")
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {meta.get('format')!r}, this depthscope reads {FORMAT}"
        )
    _check_training(path, meta.get("training"))
    return meta


def _check_training(path: Path, training: Any) -> None:
    """A checkpoint's training metadata, if any: counts that are counts and a loss that is a number."""
    if training is None:
        return
    if not isinstance(training, dict):
        raise CheckpointError(f"{path}: invalid {META_KEY}: training is not a JSON object")
    for key in ("step", "steps", "train_tokens"):  # these become trace attrs and coordinates
        if training.get(key) is not None and not _count(training[key]):
            raise CheckpointError(
                f"{path}: invalid {META_KEY}: training {key} {training[key]!r:.40} is not a count"
            )
    loss = training.get("val_loss")
    if loss is not None and type(loss) not in (int, float):
        raise CheckpointError(f"{path}: invalid {META_KEY}: training val_loss {loss!r:.40} is not a number")


def _count(x: Any) -> bool:
    """A JSON integer that fits int64 and is not negative (bool is not one)."""
    return type(x) is int and 0 <= x < 2**63
