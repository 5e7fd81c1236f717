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
from depthscope.pipelines.claims import MULTI_STREAM, stream_summary, write_costs
from depthscope.pipelines.trajectory import capture_trajectory
from depthscope.probes import capture
from depthscope.probes.settings import CaptureSettings
from depthscope.schemes import ModelConfig, load_checkpoint
from depthscope.trace import save_trace
from depthscope.train import TrainConfig, train

# each trajectory step is captured like a report's model: 8192 tokens, with the sources' spectra
# (collective rank over training)
TRAJECTORY = CaptureSettings(n_tokens=8192, rank=True)


def _spec(coll: zoo.Collection, e: zoo.Entry, steps: int, seed: int | None = None) -> dict[str, Any]:
    """What a run's checkpoint must have been built from to count as up to date (``seed``: the
    run's, default the collection's).
    """
    seed = coll.seed if seed is None else seed
    cfg = ModelConfig(scheme=e.scheme, options=e.options, **{**coll.size, **e.size})
    tcfg = TrainConfig(steps=steps, batch_size=coll.batch, lr=coll.lr, seed=seed, eval_every=coll.eval_every)
    train_spec = asdict(tcfg)
    if not tcfg.eval_every:  # the records of collections built before validation curves existed
        del train_spec["eval_every"]
    return {
        "name": e.name if len(coll.seeds or (coll.seed,)) == 1 else f"{e.name}.seed{seed}",
        "scheme": e.scheme,
        "config": cfg.to_dict(),
        "train": train_spec,
        "steps": steps,
        "seed": seed,
    }


def up_to_date(out: Path, entry: dict[str, Any] | None, spec: dict[str, Any]) -> bool:
    """Whether ``entry`` (from the manifest in ``out``) describes a run built from ``spec``: its
    checkpoint, or where the checkpoint is not kept (``file`` empty) its final trace, is there with
    the recorded digest.
    """
    if entry is None or any(entry.get(k) != v for k, v in spec.items()):
        return False
    kept = entry.get("file") or (entry.get("trace") or {}).get("file", "")
    path = out / kept if kept else None
    digest = entry.get("sha256") if entry.get("file") else (entry.get("trace") or {}).get("sha256")
    return path is not None and path.is_file() and zoo.sha256(path) == digest


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
    runs, and rewrite its manifest after each run.

    ``steps`` overrides the collection's training steps; ``only`` restricts the work to some
    entries or runs (an entry's name selects all its seeds; the manifest keeps every other entry
    it holds). Several builds of one directory may run at once (one per core, with different
    ``only``): each merges its runs into the manifest under a lock. Returns the manifest entries.
    """
    import torch

    runs = collection.runs()
    names = [name for _, _, name in runs]
    steps = collection.steps if steps is None else steps
    unknown = sorted(set(only or []) - set(names) - {e.name for e in collection.entries})
    if unknown:
        raise DepthscopeError(f"unknown zoo entries: {', '.join(unknown)} (known: {', '.join(names)})")
    if steps < 1:
        raise DepthscopeError(f"zoo steps must be at least 1, got {steps}")
    out = Path(collection.directory if out is None else out)
    existing = _read(out)
    torch.set_num_threads(1)  # reproducible weights: same thread count, same reductions
    corpus = None
    for e, seed, name in runs:
        if only and name not in only and e.name not in only:
            continue
        old = existing.get(name)
        want = _spec(collection, e, steps, seed)
        snapshots = zoo.trajectory_steps(steps) if e.trajectory else []
        keep = collection.keeps(seed)
        if up_to_date(out, old, want) and not _needs_steps(out, old, snapshots):
            log(f"zoo {name}: up to date, skipped")
            entry = old
            if collection.seeds and e.scheme in MULTI_STREAM and "streams" not in entry:
                corpus = corpus or load_corpus()
                entry = _streams(out, entry, corpus)
        else:
            corpus = corpus or load_corpus()
            entry, path = _trained(out, name, want, snapshots, keep, corpus, progress)
            if collection.seeds:
                entry = _final_trace(out, entry, path, log)
                entry = _streams(out, entry, corpus)
            log(f"zoo {name}: trained, validation loss {entry['val_loss']:.4f} nats/byte")
        if snapshots:
            entry = _trajectory(out, entry, snapshots, recapture or not entry.get("trajectory"), log, e.key)
        existing = _merge_manifest(out, entry, names)
    if collection.seeds and not only:  # every run is there: the variants' costs, side by side
        configs = {e.name: _spec(collection, e, steps)["config"] for e in collection.entries}
        write_costs(out, configs, log)
    return [existing[n] for n in names if n in existing]


def _trained(out: Path, name: str, want: dict, snapshots: list[int], keep: bool, corpus, progress: bool):
    """Train one run as ``want`` describes it (its snapshots saved on the way): its manifest entry
    and the checkpoint's path.
    """
    import torch

    def save_snapshot(model, step: int) -> None:
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
    # a run whose checkpoint is not kept is written (for its trace) where steps go: not bundled
    path = model.save((out if keep else out / zoo.STEPS_DIR) / f"{name}.safetensors", dtype=torch.bfloat16)
    s = model.training_summary
    entry = {
        **want,
        "file": path.name if keep else "",
        "val_loss": s["val_loss"],
        "final_loss": s["final_loss"],
        "corpus": s["corpus"],
        "params": model.n_params(),
        "bytes": path.stat().st_size,
        "sha256": zoo.sha256(path),
        "weights_sha256": zoo.weights_sha256(path),
        "step_seconds": s["step_seconds"],
        **({"val_curve": s["val_curve"]} if "val_curve" in s else {}),
    }
    return entry, path


def _read(out: Path) -> dict[str, dict[str, Any]]:
    try:
        return {m["name"]: m for m in zoo.read_manifest(out)}
    except DepthscopeError:
        return {}


def _streams(out: Path, entry: dict[str, Any], corpus, model=None) -> dict[str, Any]:
    """Record a multi-stream run's stream-collapse numbers (``streams``) in its entry, from the
    model in hand or its checkpoint (kept, or under ``steps/`` where the build left it).
    """
    if entry["scheme"] not in MULTI_STREAM:
        return entry
    if model is None:
        path = out / entry["file"] if entry["file"] else out / zoo.STEPS_DIR / f"{entry['name']}.safetensors"
        if not path.is_file():
            return entry
        model = load_checkpoint(path)
    return {**entry, "streams": stream_summary(model, corpus)}


def _final_trace(out: Path, entry: dict[str, Any], path: Path, log) -> dict[str, Any]:
    """Capture a run's final model into its own trace file (a several-seed collection's record)."""
    trace = capture(load_checkpoint(path), None, TRAJECTORY, checkpoint=str(path), progress=False)
    trace.attrs["label"] = entry["name"]
    target = save_trace(trace, out / zoo.TRACE_DIR / f"{entry['name']}.nc")
    log(f"zoo {entry['name']}: final trace captured")
    return {
        **entry,
        "trace": {
            "file": f"{zoo.TRACE_DIR}/{target.name}",
            "tokens": TRAJECTORY.n_tokens,
            "sha256": zoo.sha256(target),
        },
    }


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


def _merge_manifest(out: Path, entry: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any]]:
    """Put ``entry`` into the manifest in ``out`` as it is on disk now (another build of the same
    directory may have added runs since this one started), under an exclusive lock, in the
    collection's order; returns the manifest's entries by name.
    """
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".manifest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = {**_read(out), entry["name"]: entry}
        # the collection's order; runs this build does not know (a newer build's) kept after them
        _write_manifest(
            out, [current[n] for n in [*names, *(n for n in current if n not in names)] if n in current]
        )
    return current


def _write_manifest(out: Path, entries: list[dict[str, Any]]) -> None:

    with atomic_path(out / zoo.MANIFEST) as tmp:
        tmp.write_text(json.dumps({"depthscope_version": __version__, "models": entries}, indent=1) + "\n")
