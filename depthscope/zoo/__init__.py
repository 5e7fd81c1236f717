"""The bundled zoo: small checkpoints of every scheme, trained by depthscope itself.

``manifest.json`` lists each checkpoint with its scheme, config, training settings, validation
loss and digests, and for the models that keep one, the bundled training trajectory (a small
trace file under ``trajectories/``: captures at several steps of the same run). Which variants
each collection holds is curated here (``ZOO``: 8 blocks; ``DEEP``: 16 blocks, under ``deep/``);
``depthscope zoo build`` (``depthscope.pipelines.zoo``) retrains them with fixed seeds on the
default corpus, single-threaded, so the same machine and build reproduce the same weights bit for
bit; weights are stored in bfloat16 to keep the whole zoo under 10 MB.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthscope.errors import DepthscopeError

ZOO_DIR = Path(__file__).parent
MANIFEST = "manifest.json"
TRAJECTORY_DIR = "trajectories"  # bundled trajectory traces, one stacked trace file per model
TRACE_DIR = "traces"  # final traces of the runs of a several-seed collection, one per run
STEPS_DIR = "steps"  # intermediate checkpoints of a build (not bundled)

# Trajectory captures at these fractions of the run: steps 250, 500, 1000, 2000 (and the final
# model) at 4000 steps.
TRAJECTORY_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)


@dataclass(frozen=True)
class Entry:
    """One zoo model: its name (a variant label), scheme, options and whether it keeps a trajectory."""

    name: str
    scheme: str
    options: dict[str, Any] = field(default_factory=dict)
    trajectory: bool = False
    group: str | None = None  # the same scheme in another collection (default: its name)
    size: dict[str, int] = field(default_factory=dict)  # overrides of the collection's size

    @property
    def key(self) -> str:
        """Which models are one scheme across collections (depths): ``group``, else the name."""
        return self.group or self.name


@dataclass(frozen=True)
class Collection:
    """A set of zoo models trained alike: one size, one training budget, one directory."""

    name: str
    directory: Path
    size: dict[str, int]  # n_layers, d_model, n_heads, ctx
    steps: int
    entries: tuple[Entry, ...]
    batch: int = 16
    lr: float = 3e-3
    seed: int = 0
    seeds: tuple[int, ...] = ()  # several seeds per entry (default: ``seed`` alone)
    eval_every: int = 0  # validation loss along training every this many steps (0: at the end)
    kept_seeds: tuple[int, ...] | None = None  # seeds whose checkpoints are kept (None: all)

    def runs(self) -> list[tuple[Entry, int, str]]:
        """(entry, seed, run name) of every training run, seed-major within each entry: a run is
        named by its entry, and by ``{entry}.seed{k}`` where the collection has several seeds.
        """
        seeds = self.seeds or (self.seed,)
        return [
            (e, s, e.name if len(seeds) == 1 else f"{e.name}.seed{s}") for e in self.entries for s in seeds
        ]

    def names(self) -> list[str]:
        """The runs' names, in the collection's order."""
        return [name for _, _, name in self.runs()]

    def keeps(self, seed: int) -> bool:
        """Whether the checkpoint of a run with ``seed`` is kept (else only its trace and record)."""
        return self.kept_seeds is None or seed in self.kept_seeds


# The zoo: 8 blocks (16 sublayers) so that the depth pattern can show, 4000 steps of 16 x 128
# bytes (8.2 M tokens): 5x the first zoo's 800 steps, the budget at which full AttnRes and DCA were
# measured to form the input-and-recent pattern. The standard residual keeps a trajectory too: it
# is the baseline of every comparison at an intermediate step (the deep zoo's, at step 2000).
ZOO = Collection(
    name="zoo",
    directory=ZOO_DIR,
    size=dict(n_layers=8, d_model=64, n_heads=4, ctx=128),
    steps=4000,
    entries=(
        Entry("standard", "standard", {}, True),
        Entry("denseformer", "denseformer", {}, True),
        Entry("dca", "dca", {}, True),
        Entry("grn-v1", "dca", {"grn": "v1"}),
        Entry("attnres", "attnres", {}, True),
        Entry("attnres-block4", "attnres", {"blocks": 4}, True),
        Entry("hc", "hc", {}, True),
        Entry("mhc", "mhc", {}, True),
        Entry("ddl", "ddl", {}),
        Entry("shortswa", "shortswa", {}),
        Entry("shortswa-seq", "shortswa", {"axis": "sequence", "window": 16}),
    ),
)


def _deeper(e: Entry, factor: int) -> Entry:
    """Zoo entry ``e`` in a collection ``factor`` times as deep: Block AttnRes keeps its block size, so
    it has ``factor`` times the blocks (a new name, grouped with ``e``); any other entry is itself.
    """
    blocks = e.options.get("blocks")
    if not blocks:
        return e
    n = factor * blocks
    return Entry(f"{e.scheme}-block{n}", e.scheme, {**e.options, "blocks": n}, e.trajectory, group=e.key)


# The deep zoo (dilution versus depth): the zoo's entries that keep a trajectory, at 16 blocks,
# trained for 2000 steps, so that a model costs about what a zoo model at 4000 steps did (a step at
# 16 blocks costs about twice one at 8) and sees the tokens the zoo's models had seen at step 2000
# of their trajectories. Block AttnRes keeps the zoo's block size (S = 4 sublayers, two layers per
# block), so it has 8 blocks: the paper's N ~ 8 (arXiv 2603.15031 Sec. 3.2) and the S = 4 of its
# ablation (``_deeper``).
DEEP = Collection(
    name="deep",
    directory=ZOO_DIR / "deep",
    size=dict(n_layers=16, d_model=64, n_heads=4, ctx=128),
    steps=2000,
    entries=tuple(_deeper(e, 2) for e in ZOO.entries if e.trajectory),
)

# Seeds (the survey's questions with error bars): the zoo's size and recipe, shortened to 1000
# steps (2.0 M tokens) for every seed, seed 0 included, so that 3 seeds of 12 variants fit in a few
# hours of 2 cores: the zoo's 4000 steps would take ~4 h per seed. GRN-v1 and DDL are left out (their
# zoo models, one seed at 4000 steps, remain): the build had no time for them. Validation loss every 100 steps
# (steps to equal loss). The grown baselines are the standard residual a little deeper (9 blocks)
# and a little wider (width 72), which cost about what the schemes' extras cost. Checkpoints are
# kept for seed 0; every run keeps its final trace (``traces/``) and its manifest record.
SEEDS = Collection(
    name="seeds",
    directory=ZOO_DIR / "seeds",
    size=dict(n_layers=8, d_model=64, n_heads=4, ctx=128),
    steps=1000,
    seeds=(0, 1, 2),
    eval_every=100,
    kept_seeds=(0,),
    entries=(
        Entry("standard", "standard", {}),
        Entry("denseformer", "denseformer", {}),
        Entry("dca", "dca", {}),
        Entry("hc", "hc", {}),
        Entry("mhc", "mhc", {}),
        Entry("muddformer", "muddformer", {}),
        Entry("attnres", "attnres", {}),
        Entry("shortswa-seq", "shortswa", {"axis": "sequence", "window": 16}),
        Entry("shortswa", "shortswa", {}),
        Entry("attnres-block4", "attnres", {"blocks": 4}),
        Entry("standard-9blocks", "standard", {}, size=dict(n_layers=9), group="standard"),
        Entry("standard-w72", "standard", {}, size=dict(d_model=72), group="standard"),
        # the 2026 wave (issue 40): depth mixing inside attention, and mHC's spectral rival
        Entry("shc", "shc", {}),
        Entry("moda", "moda", {}),
        Entry("moda-post", "moda", {"norm": "post"}),
        Entry("depth-attention", "depth-attention", {}),
        Entry("value-residual", "value-residual", {}),
        Entry("value-residual-x0", "value-residual", {"mode": "x0"}),
        Entry("frac", "frac", {}),
    ),
)

COLLECTIONS = {c.name: c for c in (ZOO, DEEP, SEEDS)}

# the zoo's size and budget, as names (kept for readers of the first zoo)
SIZE = ZOO.size
STEPS, BATCH, LR, SEED = ZOO.steps, ZOO.batch, ZOO.lr, ZOO.seed


def collection(name: str) -> Collection:
    """The zoo collection called ``name`` (``zoo``, ``deep`` or ``seeds``)."""
    if name not in COLLECTIONS:
        raise DepthscopeError(f"unknown zoo collection {name!r} (known: {', '.join(COLLECTIONS)})")
    return COLLECTIONS[name]


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
    if not isinstance(c.get("options"), dict) or not all(
        type(c.get(k)) is int for k in ("n_layers", "d_model")
    ):
        return False
    t = m.get("trajectory")
    return t is None or (
        isinstance(t, dict)
        and isinstance(t.get("file"), str)
        and isinstance(t.get("steps"), list)
        and all(type(x) is int for x in t["steps"])
        and type(t.get("tokens", 0)) is int
    )


def checkpoints(directory: str | Path = ZOO_DIR) -> list[Path]:
    """Paths of the zoo's checkpoints, in manifest order (runs that keep only a trace left out)."""
    return [Path(directory) / m["file"] for m in read_manifest(directory) if m["file"]]


def traces(directory: str | Path) -> list[Path]:
    """Paths of the final traces of a several-seed collection's runs, in manifest order."""
    return [Path(directory) / m["trace"]["file"] for m in read_manifest(directory) if m.get("trace")]


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
