"""Ctrl-C at random moments: start-up, imports, loading, the capture, writing a partial, shutdown.

The README promises exit 130, the one line ``interrupted`` and nothing written half or wrong at
every moment. This standing test interrupts a long capture (a partial file written after every
batch) at moments drawn at random, one per stratum of the first seconds, so that the interpreter's
imports of torch and transformers (about the first 3-6 s here), the model's loading and the work
are all hit on every run. The draw changes with every run of the suite (the seed is printed on
failure), so over many runs every moment is tried.

The one window that no program can cover is the interpreter's own start-up before the first line of
``depthscope`` runs (``site`` and the editable install's finder, about 30-40 ms here): a Ctrl-C there
ends Python's way (a traceback, or death by the signal). The moments start at 0.2 s, several times
that window.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from depthscope.cli import main
from depthscope.probes.partial import arrays_of, digest, partial_path
from tests.test_fail_closed import SMALL, cli_process

# (earliest, latest) second of each interrupt: dense over start-up and imports, then the work
STRATA = [(0.2, 0.5), (0.5, 1.0), (1.0, 1.7), (1.7, 2.5), (2.5, 3.5), (3.5, 4.5), (4.5, 6.0), (6.0, 9.0)]
SEED = int(os.environ.get("DEPTHSCOPE_INTERRUPT_SEED", time.time_ns() % 2**31))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "m.safetensors"
    assert main(["train", "--steps", "2", "--out", str(path), *SMALL]) == 0
    return path


def moments() -> list[float]:
    rng = random.Random(SEED)
    return [round(rng.uniform(lo, hi), 3) for lo, hi in STRATA]


def assert_partial_whole(path: Path) -> None:
    """A partial left by the interrupt is a whole file whose digest matches what it holds."""
    with np.load(path, allow_pickle=False) as f:
        saved = {k: f[k] for k in f.files}
    meta = json.loads(str(saved["meta"]))
    assert meta["digest"] == digest(arrays_of(saved), meta)


@pytest.mark.parametrize("stratum", range(len(STRATA)))
def test_ctrl_c_at_a_random_moment_is_exit_130_and_one_line(ckpt, tmp_path, stratum):
    at = moments()[stratum]
    out = tmp_path / "t.nc"
    args = ["capture", ckpt, "--out", out, "--checkpoint-every", "1", "--tokens", "10000000"]
    proc = cli_process([*args, "--batch-size", "1", "--ctx", "32", "--quiet"], tmp_path)
    time.sleep(at)
    assert proc.poll() is None, f"finished before {at} s: {proc.stderr.read()}"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    why = f"interrupted at {at} s (DEPTHSCOPE_INTERRUPT_SEED={SEED}): exit {proc.returncode}, stderr {err!r}"
    assert proc.returncode == 130 and err == "interrupted\n", why
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not out.exists() and set(left) <= {partial_path(out).name}, f"{why}; left {left}"
    if left:
        assert_partial_whole(partial_path(out))
