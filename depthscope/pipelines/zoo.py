"""``depthscope zoo build``: train the bundled zoo, incrementally and reproducibly.

Each entry of a zoo collection (curated in ``depthscope.zoo``: ``ZOO``, 8 blocks; ``DEEP``, 16
blocks) is trained with the collection's size, steps, batch, learning rate and seed on the default
corpus, single-threaded (same thread count, same reductions: the same machine and build give the
same weights, bit for bit), and written in bfloat16. The build is incremental and resumable: a
model whose checkpoint matches its manifest entry (config, training settings, file digest) is
skipped, the manifest is rewritten after every model, and an interrupted model leaves no file
(writes are atomic), so a build killed halfway continues where it stopped.

Models that keep a trajectory (``Entry.trajectory``) also save intermediate checkpoints at
``zoo.trajectory_steps(steps)`` under ``steps/`` (not bundled), and the build captures them and
the final model into one small trace file per model under ``trajectories/`` (bundled: a report
shows the trajectory without training anything). A trajectory is captured when its trace is
missing or ``recapture`` is set, from the step checkpoints of the same build; an up-to-date model
that should keep a trajectory but has neither the trace nor its step checkpoints is retrained
(reproducibly, so its weights come out the same) to get them.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from depthscope import zoo
from depthscope._version import __version__
from depthscope.atomic import atomic_path
from depthscope.corpus import load_corpus
from depthscope.errors import DepthscopeError
from depthscope.pipelines.trajectory import capture_trajectory
from depthscope.probes.settings import CaptureSettings
from depthscope.schemes import ModelConfig
from depthscope.trace import save_trace
from depthscope.train import TrainConfig, train

# each trajectory step is captured like a report's model: 8192 tokens, with the sources' spectra
# (collective rank over training)
TRAJECTORY = CaptureSettings(n_tokens=8192, rank=True)


def _spec(coll: zoo.Collection, e: zoo.Entry, steps: int) -> dict[str, Any]:
    """What an entry's checkpoint must have been built from to count as up to date."""
    cfg = ModelConfig(scheme=e.scheme, options=e.options, **coll.size)
    tcfg = TrainConfig(steps=steps, batch_size=coll.batch, lr=coll.lr, seed=coll.seed)
    return {
        "name": e.name,
        "scheme": e.scheme,
        "config": cfg.to_dict(),
        "train": asdict(tcfg),
        "steps": steps,
        "seed": coll.seed,
    }


def up_to_date(out: Path, entry: dict[str, Any] | None, spec: dict[str, Any]) -> bool:
    """Whether ``entry`` (from the manifest in ``out``) describes a checkpoint built from ``spec``."""
    if entry is None or any(entry.get(k) != v for k, v in spec.items()):
        return False
    path = out / entry.get("file", "")
    return path.is_file() and zoo.sha256(path) == entry.get("sha256")


def step_path(out: Path, name: str, step: int) -> Path:
    """Entry ``name``'s checkpoint at ``step`` in the build at ``out`` (in its ``steps/`` directory)."""
    return out / zoo.STEPS_DIR / f"{name}.step-{step:06d}.safetensors"


def build(
    out: str | Path | None = None,
    *,
    collection: zoo.Collection = zoo.ZOO,
    steps: int | None = None,
    only: list[str] | None = None,
    recapture: bool = False,
    progress: bool = True,
    log=print,
) -> list[dict[str, Any]]:
    """Train a zoo collection into ``out`` (default: its bundled directory), skipping up-to-date
    models, and rewrite its manifest.

    ``steps`` overrides the collection's training steps; ``only`` restricts the work to some
    entries (the manifest keeps every other entry it holds). Returns the manifest entries.
    """
    import torch

    names = collection.names()
    steps = collection.steps if steps is None else steps
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise DepthscopeError(f"unknown zoo entries: {', '.join(unknown)} (known: {', '.join(names)})")
    if steps < 1:
        raise DepthscopeError(f"zoo steps must be at least 1, got {steps}")
    out = Path(collection.directory if out is None else out)
    try:
        existing = {m["name"]: m for m in zoo.read_manifest(out)}
    except DepthscopeError:
        existing = {}
    torch.set_num_threads(1)  # reproducible weights: same thread count, same reductions
    corpus = None
    current = dict(existing)
    for e in collection.entries:
        name = e.name
        if only and name not in only:
            continue
        old = existing.get(name)
        want = _spec(collection, e, steps)
        snapshots = zoo.trajectory_steps(steps) if e.trajectory else []
        if up_to_date(out, old, want) and not _needs_steps(out, old, snapshots):
            log(f"zoo {name}: up to date, skipped")
            entry = old
        else:
            corpus = corpus or load_corpus()

            def save_snapshot(model, step: int, name: str = name) -> None:
                model.save(step_path(out, name, step), dtype=torch.bfloat16)

            model = train(
                _config(want),
                TrainConfig(**want["train"]),
                corpus,
                progress=progress,
                label=f"zoo {name}",
                snapshots=snapshots,
                on_snapshot=save_snapshot,
            )
            path = model.save(out / f"{name}.safetensors", dtype=torch.bfloat16)
            s = model.training_summary
            entry = {
                **want,
                "file": path.name,
                "val_loss": s["val_loss"],
                "final_loss": s["final_loss"],
                "corpus": s["corpus"],
                "params": model.n_params(),
                "bytes": path.stat().st_size,
                "sha256": zoo.sha256(path),
                "weights_sha256": zoo.weights_sha256(path),
            }
            log(f"zoo {name}: trained, validation loss {s['val_loss']:.4f} nats/byte")
        if snapshots:
            entry = _trajectory(out, entry, snapshots, recapture or not entry.get("trajectory"), log, e.key)
        current[name] = entry
        _write_manifest(out, [current[n] for n in names if n in current])
    return [current[n] for n in names if n in current]


def _needs_steps(out: Path, entry: dict[str, Any], snapshots: list[int]) -> bool:
    """Whether a trajectory is wanted that neither exists nor can be captured from kept steps."""
    wanted = bool(snapshots) and not entry.get("trajectory")
    return wanted and not all(step_path(out, entry["name"], s).is_file() for s in snapshots)


def _config(spec: dict[str, Any]):

    return ModelConfig.from_dict(spec["config"])


def _trajectory(
    out: Path, entry: dict[str, Any], snapshots: list[int], capture_now: bool, log, group: str
) -> dict[str, Any]:
    """Capture the entry's trajectory (step checkpoints + final) into one trace file, if asked."""
    if not capture_now:
        return entry
    paths = [step_path(out, entry["name"], s) for s in snapshots]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        log(
            f"zoo {entry['name']}: no trajectory (missing {missing[0].name}; rebuild the model to keep its "
            "steps)"
        )
        return entry
    trace = capture_trajectory([*paths, out / entry["file"]], TRAJECTORY, progress=False)
    trace = trace.assign_coords(zoo_group=("model", np.array([group] * trace.sizes["model"], dtype=object)))
    target = save_trace(trace, out / zoo.TRAJECTORY_DIR / f"{entry['name']}.nc")
    log(f"zoo {entry['name']}: trajectory captured at steps {[*snapshots, entry['steps']]}")
    return {
        **entry,
        "trajectory": {
            "file": f"{zoo.TRAJECTORY_DIR}/{target.name}",
            "steps": [*snapshots, entry["steps"]],
            "tokens": TRAJECTORY.n_tokens,
            "sha256": zoo.sha256(target),
        },
    }


def _write_manifest(out: Path, entries: list[dict[str, Any]]) -> None:

    with atomic_path(out / zoo.MANIFEST) as tmp:
        tmp.write_text(json.dumps({"depthscope_version": __version__, "models": entries}, indent=1) + "\n")
