"""One entry point for every model a user has on disk: ``load_model(path)`` (``depthscope.load``).

Detected from the content, not the name:

* a depthscope ``.safetensors`` checkpoint -> a ``DepthModel``;
* a local Hugging Face model directory (``config.json`` + weights) -> a TransformerBridge,
  loaded offline.

``input_kind`` tells checkpoints, traces and model directories apart for the commands that take
either.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from depthscope.errors import DepthscopeError


def input_kind(path: str | Path) -> str:
    """'checkpoint', 'trace' or 'model-dir', from the file's content; DepthscopeError otherwise."""
    path = Path(path)
    if path.is_dir() and (path / "config.json").is_file():
        return "model-dir"
    if path.is_file():
        with path.open("rb") as f:
            head = f.read(9)
        if head[:3] == b"CDF" or head[:4] == b"\x89HDF":  # netCDF3 / netCDF4 (HDF5)
            return "trace"
        if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size:
            return "checkpoint"  # safetensors: 8-byte header length, then a JSON header
    elif not path.exists():
        raise DepthscopeError(f"{path}: no such file or directory")
    raise DepthscopeError(
        f"{path}: neither a checkpoint (.safetensors), a trace (.nc) nor a Hugging Face model directory"
    )


def load_model(path: str | Path) -> Any:
    """A depthscope checkpoint (.safetensors file) or a local Hugging Face model directory."""
    from depthscope.schemes import load_checkpoint as load

    path = Path(path)
    return load_bridge(path) if path.is_dir() else load(path)


def load_bridge(directory: str | Path) -> Any:
    """Wrap a local Hugging Face model directory in a TransformerBridge, offline."""
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise DepthscopeError(f"{path}: not a Hugging Face model directory (no config.json)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformer_lens import TransformerBridge

    try:
        return TransformerBridge.boot_transformers(str(path))
    except Exception as err:  # transformers raises many types for unsupported or broken models
        raise DepthscopeError(
            f"{path}: cannot load as a TransformerBridge ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]})"
        ) from None
