"""The bundled zoo: small checkpoints of every scheme, trained by depthscope itself.

``manifest.json`` lists each checkpoint with its scheme, config, training settings and validation
loss. ``depthscope zoo build`` retrains them from ``ZOO`` with fixed seeds on the default corpus
(single-threaded, so the same machine reproduces the same weights bit for bit); weights are
stored in bfloat16 to keep the whole zoo under 10 MB.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from depthscope.errors import DepthscopeError

ZOO_DIR = Path(__file__).parent
MANIFEST = "manifest.json"

# One model size for every scheme: 8 blocks (16 sublayers) so that the depth pattern can show.
SIZE = dict(n_layers=8, d_model=64, n_heads=4, ctx=128)
STEPS, BATCH, LR, SEED = 800, 16, 3e-3, 0
# (name, scheme, options): one entry per scheme, plus the variants whose mixing differs in kind
ZOO: list[tuple[str, str, dict[str, Any]]] = [
    ("standard", "standard", {}),
    ("denseformer", "denseformer", {}),
    ("dca", "dca", {}),
    ("grn-v1", "dca", {"grn": "v1"}),
    ("attnres", "attnres", {}),
    ("attnres-block4", "attnres", {"blocks": 4}),
    ("hc", "hc", {}),
    ("mhc", "mhc", {}),
    ("ddl", "ddl", {}),
    ("shortswa", "shortswa", {}),
    ("shortswa-seq", "shortswa", {"axis": "sequence", "window": 16}),
]


def read_manifest(directory: str | Path = ZOO_DIR) -> list[dict[str, Any]]:
    """The manifest entries of a zoo directory (the bundled one by default)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise DepthscopeError(f"{path}: no zoo manifest (build one with `depthscope zoo build`)")
    try:
        return json.loads(path.read_text())["models"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise DepthscopeError(f"{path}: unreadable zoo manifest ({err})") from None


def checkpoints(directory: str | Path = ZOO_DIR) -> list[Path]:
    """Paths of the zoo's checkpoints, in manifest order."""
    return [Path(directory) / m["file"] for m in read_manifest(directory)]


def sha256(path: Path) -> str:
    """Digest of the whole file (it also covers the recorded training throughput)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def weights_sha256(path: Path) -> str:
    """Digest of the tensors alone (names, dtypes, shapes, bytes): equal for a reproduced build,
    whose file differs only in the wall-clock throughput recorded in its metadata."""
    import torch
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(str(path)).items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def build(
    out: str | Path = ZOO_DIR,
    *,
    steps: int = STEPS,
    only: list[str] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Train the zoo into ``out`` and (re)write its manifest; returns the manifest entries.

    ``only`` rebuilds a subset and keeps the other entries of an existing manifest.
    """
    import torch

    from depthscope.corpus import load_corpus
    from depthscope.schemes import ModelConfig
    from depthscope.train import TrainConfig, train

    names = [name for name, _, _ in ZOO]
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise DepthscopeError(f"unknown zoo entries: {', '.join(unknown)} (known: {', '.join(names)})")
    out = Path(out)
    try:
        existing = {m["name"]: m for m in read_manifest(out)} if only else {}
    except DepthscopeError:
        existing = {}
    torch.set_num_threads(1)  # reproducible weights: same thread count, same reductions
    corpus = load_corpus()
    entries = []
    for name, scheme, options in ZOO:
        if only and name not in only:
            if name in existing:
                entries.append(existing[name])
            continue
        cfg = ModelConfig(scheme=scheme, options=options, **SIZE)
        tcfg = TrainConfig(steps=steps, batch_size=BATCH, lr=LR, seed=SEED)
        model = train(cfg, tcfg, corpus, progress=progress, label=f"zoo {name}")
        path = model.save(out / f"{name}.safetensors", dtype=torch.bfloat16)
        s = model.training_summary
        entries.append(
            {
                "name": name,
                "file": path.name,
                "scheme": scheme,
                "config": cfg.to_dict(),
                "train": asdict(tcfg),
                "steps": steps,
                "seed": SEED,
                "val_loss": s["val_loss"],
                "final_loss": s["final_loss"],
                "corpus": s["corpus"],
                "params": model.n_params(),
                "bytes": path.stat().st_size,
                "sha256": sha256(path),
                "weights_sha256": weights_sha256(path),
            }
        )
        _write_manifest(out, entries)
    return entries


def _write_manifest(out: Path, entries: list[dict[str, Any]]) -> None:
    from depthscope import __version__
    from depthscope.atomic import atomic_path

    with atomic_path(out / MANIFEST) as tmp:
        tmp.write_text(json.dumps({"depthscope_version": __version__, "models": entries}, indent=1) + "\n")
