"""Every command the docs show runs: each `depthscope` line of a shell block in README.md and
docs/*.md is run here, as written, in a directory holding the files it names (a small checkpoint
``m.safetensors`` with its step checkpoints, its trace ``m.nc``, a Hugging Face directory ``DIR``).

What changes from the line as written, and only this: optional parts ``[...]`` are all given,
placeholders (``NAME``) are filled, and options that only make the run shorter are appended
(``CHEAPER``: fewer tokens, steps and tasks; a later option wins over an earlier one; ``zoo build``
writes to the working directory, not over the bundled zoo), and a glob takes its first ``GLOBBED``
matches (the docs' report of every bundled trajectory, 14 runs, is cut to 2 runs at each depth,
as tests/pipelines/test_report.py's report of runs at two depths is). The lines
that are not run say why in ``NOT_RUN`` (the two make targets are this suite and the demo; torchrun
needs 8 GPUs): their options are checked to exist instead. A new command in the docs fails
``test_every_shown_command_is_known`` until it is given here. The notebooks run in test_notebooks.py.
"""

from __future__ import annotations

import glob
import re
import shlex
import shutil
from pathlib import Path

import pytest

from depthscope.cli import main
from tests.helpers import tiny_llama

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SMALL = ["--layers", "2", "--d-model", "16", "--heads", "2", "--ctx", "256", "--batch-size", "2"]

# appended to a command (by its first one or two words) so that it runs in seconds
CHEAPER = {
    "train": ["--steps", "2", "--save-every", "1", *SMALL, "--quiet"],
    "capture": ["--tokens", "512", "--quiet"],
    "report": ["--tokens", "256", "--quiet"],
    "zoo build": ["--steps", "2", "--out", "zoo-here", "--quiet"],  # never over the bundled zoo
    "rank theory": ["--variant", "v1", "--tasks", "1"],
    "rank identity": ["--steps", "20"],
    "rank sweep": ["--steps", "2", "--tokens", "256", "--layers", "1"],
    "rank m.safetensors": ["--tokens", "256", "--quiet"],
}
GLOBBED = 2
FILL = {"NAME": "standard"}  # placeholders of the docs, as run here
NOT_RUN = {
    "make demo": "the demo: `depthscope report --out report` over the zoo, run by CI's make demo",
    "make test": "this suite",
    "torchrun": "8 CUDA GPUs; its capture options are checked to exist",
}


def shown_commands() -> list[tuple[str, str]]:
    """(file, command) of every command line in the docs' shell blocks, comments removed."""
    out = []
    for path in DOCS:
        for lang, block in re.findall(r"```(\w*)\n(.*?)```", path.read_text(), flags=re.S):
            if lang not in ("bash", "sh", "shell", "console", ""):
                continue
            for line in block.splitlines():
                line = line.split(" # ")[0].split("  #")[0].strip()
                if re.match(r"(depthscope|torchrun|make) ", line):
                    out.append((path.name, " ".join(line.split())))
    return out


def runnable(command: str) -> list[str]:
    """The argv run for a shown command: optional parts given, placeholders filled, CHEAPER added."""
    words = shlex.split(re.sub(r"\[([^\]]*)\]", r"\1", command))[1:]
    words = [FILL.get(w, w) for w in words]
    extra = CHEAPER.get(" ".join(words[:2]), CHEAPER.get(words[0], []))
    return [*words, *extra]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The files the docs' commands name: m.safetensors (attnres, with m.step-*), m.nc, other.nc, DIR."""
    d = tmp_path_factory.mktemp("docs")
    args = ["train", "--scheme", "attnres", "--out", str(d / "m.safetensors"), "--steps", "2"]
    assert main([*args, "--save-every", "1", *SMALL, "--quiet"]) == 0
    assert (
        main(["capture", str(d / "m.safetensors"), "--out", str(d / "m.nc"), "--tokens", "256", "--quiet"])
        == 0
    )
    shutil.copy(d / "m.nc", d / "other.nc")
    tiny_llama_dir(d / "DIR")
    return d


def tiny_llama_dir(path: Path) -> Path:
    """A Hugging Face model directory of a one-layer Llama (random weights, byte-level tokens)."""
    tiny_llama(0).save_pretrained(path)
    return path


COMMANDS = shown_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20, COMMANDS


def test_every_shown_command_is_known():
    """Each shown command either runs below or says in NOT_RUN why it does not."""
    for name, command in COMMANDS:
        skipped = [k for k in NOT_RUN if command.startswith(k)]
        if skipped:
            continue
        assert command.startswith("depthscope "), f"{name}: {command}"


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted({c for _, c in COMMANDS}))
def test_a_shown_command_runs(command, workspace, tmp_path, monkeypatch):
    if any(command.startswith(k) for k in NOT_RUN):
        if command.startswith("torchrun"):  # what it would run: `depthscope capture` with these options
            from typer.main import get_command

            from depthscope.cli import app

            capture = get_command(app).commands["capture"]
            names = {o for p in capture.params for o in p.opts}
            assert {w for w in command.split() if w.startswith("--") and w != "--nproc-per-node"} <= names
        return
    for f in workspace.iterdir():
        (shutil.copytree if f.is_dir() else shutil.copy)(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    argv = [w2 for w in runnable(command) for w2 in (sorted(glob.glob(w))[:GLOBBED] if "*" in w else [w])]
    assert main(argv) == 0, f"depthscope {' '.join(argv)}"
