"""An instant command line: help, the version and the refusals that need no model import no torch,
transformers, xarray or numpy (torch alone takes seconds to import), so they answer within about a
second of Python's start. The heavy libraries are imported where a command first needs them.

Each case runs the real entry point in a fresh interpreter and records, as it exits, which heavy
modules it imported: a count of modules, not a time, so the test holds on any machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from depthscope._version import __version__

ROOT = Path(__file__).parent.parent
HEAVY = ("torch", "transformers", "xarray", "numpy", "matplotlib", "scipy")


def command_paths() -> list[str]:
    """Every command and group of the app, as typed ("zoo build"), hidden ones included (``rank
    PATH``'s ``rank measure``): walked from the app, so a new command is covered without a list here.
    """
    from typer.main import get_command

    from depthscope.cli import app

    def walk(command, path: tuple[str, ...]) -> list[str]:
        found = [" ".join(path)] if path else []
        for name, sub in getattr(command, "commands", {}).items():
            found += walk(sub, (*path, name))
        return found

    return walk(get_command(app), ())


COMMANDS = command_paths()

PROBE = """
import atexit, json, sys
_record = sys.argv.pop(1)
def _heavy():
    with open(_record, "w") as f:
        json.dump(sorted(m for m in {heavy!r} if m in sys.modules), f)
atexit.register(_heavy)
sys.argv[0] = "depthscope"
from depthscope.__main__ import run
run()
"""


def started(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``depthscope args`` in a fresh interpreter (``env`` added to the environment); its result and
    the heavy modules it imported.
    """
    record = tmp_path / "heavy.json"
    res = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), str(record), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return res, json.loads(record.read_text())


def test_help_imports_nothing_heavy(tmp_path):
    res, heavy = started(["--help"], tmp_path)
    assert res.returncode == 0 and "capture" in res.stdout and "report" in res.stdout, res.stderr
    assert heavy == []


def test_version_imports_nothing_heavy(tmp_path):
    res, heavy = started(["--version"], tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == f"depthscope {__version__}", res.stderr
    assert heavy == []


def test_the_commands_are_walked_from_the_app():
    assert {"train", "capture", "report", "claims", "zoo", "zoo list", "zoo build", "rank"} <= set(COMMANDS)
    assert {"rank threshold", "rank theory", "rank identity", "rank sweep", "rank measure"} <= set(COMMANDS)
    assert len(COMMANDS) == len(set(COMMANDS)) >= 18, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_help_imports_nothing_heavy(command, tmp_path):
    res, heavy = started([*command.split(), "--help"], tmp_path)
    assert res.returncode == 0 and f"Usage: depthscope {command}" in res.stdout, res.stderr
    assert heavy == []


MISTAKES = {
    "a missing checkpoint": (
        ["capture", "nothing.safetensors", "--out", "t.nc", "--quiet"],
        "nothing.safetensors",
    ),
    "a missing report input": (["report", "nothing.nc", "--out", "rep", "--quiet"], "nothing.nc"),
    "a missing trace": (["dilution", "nothing.nc"], "nothing.nc"),
    "a missing rank input": (["rank", "nothing.nc"], "nothing.nc"),
    "an unknown model name": (["capture", "no-such-model", "--out", "t.nc", "--quiet"], "no-such-model"),
    "an unknown name, with where to look": (
        ["capture", "gpt5", "--out", "t.nc", "--quiet"],
        "depthscope zoo list",
    ),
    "a misspelt zoo name": (["capture", "denseformr", "--out", "t.nc"], "did you mean denseformer or"),
    "a revision of a zoo model": (
        ["capture", "denseformer", "--revision", "v2", "--out", "t.nc", "--quiet"],
        "--revision",
    ),
    "tokens out of range": (["capture", "nothing.safetensors", "--tokens", "0"], "--tokens"),
    "a negative width": (["train", "--d-model", "-3"], "--d-model"),
    "kappa out of range": (["rank", "threshold", "--d", "4", "--kappa", "2"], "--kappa"),
    "an unknown option": (["capture", "x", "--no-such-option"], "--no-such-option"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_mistakes_that_need_no_model_are_one_line_without_heavy_imports(mistake, tmp_path):
    args, word = MISTAKES[mistake]
    res, heavy = started(args, tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert word in lines[0]
    assert heavy == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heavy.json"]  # nothing written


def test_a_hub_id_missing_from_the_cache_offline_is_one_line_without_heavy_imports(
    tmp_path, tmp_path_factory
):
    cache = tmp_path_factory.mktemp("empty-hf-cache")
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    res, heavy = started(["capture", "acme/nothing", "--out", "t.nc", "--quiet"], tmp_path, env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "acme/nothing" in lines[0] and str(cache) in lines[0] and "offline" in lines[0]
    assert heavy == []  # huggingface_hub looked in the cache; torch was never imported
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heavy.json"]
    assert not list(cache.iterdir())
