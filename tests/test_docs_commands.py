"""Every command the docs show exists and runs: each `depthscope` line of a shell block in README.md
and docs/*.md names a command of the CLI with only options that command has (the command tree is
walked as the CLI itself resolves it, ``depthscope rank PATH`` included), and is run here, as written,
in a directory holding the files it names (a small checkpoint ``m.safetensors`` with its step
checkpoints, its trace ``m.nc``, a Hugging Face directory ``DIR``: ``WORKSPACE``).

What changes from the line as written, and only this: optional parts ``[...]`` are all given,
placeholders (``NAME``) are filled, and options that only make the run shorter are appended
(``CHEAPER``, by command: fewer tokens, steps and tasks; a later option wins over an earlier one;
``zoo build`` writes to the working directory, not over the bundled zoo). A positional argument
with a ``/`` is a path into the repository and is read from the repository root (the run itself
happens in a temporary directory); one without is a file of ``WORKSPACE`` or a model name. A glob
must match (a glob matching nothing would drop the argument, and a command without inputs runs its
default instead), and takes its first ``GLOBBED`` matches (the docs' report of every bundled
trajectory, 14 runs, is cut to 2 runs at each depth, as tests/pipelines/test_report.py's report of
runs at two depths is). The lines that are not run say why in ``NOT_RUN`` (the two make targets are
this suite and the demo; torchrun needs 8 GPUs); the torchrun line's ``depthscope`` command is
checked like any other. A new command in the docs is run as soon as it is shown; a command or option
the CLI lacks, or a path that names nothing, fails the fast tests here before anything runs. The
notebooks run in test_notebooks.py.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.main import get_command

from depthscope.cli import app, main
from depthscope.inputs import SHORT_NAMES, zoo_names
from tests.helpers import tiny_llama

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SMALL = ["--layers", "2", "--d-model", "16", "--heads", "2", "--ctx", "256", "--batch-size", "2"]
CLI = get_command(app)

# appended to a command (by its path in the command tree) so that it runs in seconds
CHEAPER = {
    "train": ["--steps", "2", "--save-every", "1", *SMALL, "--quiet"],
    "capture": ["--tokens", "512", "--quiet"],
    "report": ["--tokens", "256", "--quiet"],
    "zoo build": ["--steps", "2", "--out", "zoo-here", "--quiet"],  # never over the bundled zoo
    "rank theory": ["--variant", "v1", "--tasks", "1"],
    "rank identity": ["--steps", "20"],
    "rank sweep": ["--steps", "2", "--tokens", "256", "--layers", "1"],
    "rank measure": ["--tokens", "256", "--quiet"],  # `depthscope rank PATH`
}
GLOBBED = 2
FILL = {"NAME": "standard"}  # placeholders of the docs, as run here
# the files the workspace fixture makes: the names a shown command may read from its directory
WORKSPACE = ("m.safetensors", "m.step-000001.safetensors", "m.nc", "other.nc", "DIR")
NOT_RUN = {
    "make demo": "the demo: `depthscope report --out report` over the zoo, run by CI's make demo",
    "make test": "this suite",
    "torchrun": "8 CUDA GPUs; its depthscope command is checked to exist with its options",
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


def cli_words(command: str) -> list[str] | None:
    """The words after ``depthscope`` of a shown line, optional parts ``[...]`` given and placeholders
    filled; the depthscope part of a torchrun line; None for a line that runs no depthscope command.
    """
    words = [FILL.get(w, w) for w in shlex.split(re.sub(r"\[([^\]]*)\]", r"\1", command))]
    if words[0] == "depthscope":
        return words[1:]
    if words[0] == "torchrun":
        at = words.index("-m")
        assert words[at + 1] == "depthscope", command
        return words[at + 2 :]
    return None


@dataclass
class Parsed:
    path: str  # the command's path in the tree: "capture", "zoo build", "rank measure"
    options: list[str]  # the option words given ("--out", "--rank")
    unknown: list[str]  # options the command does not have
    args: list[int]  # indices (into the words) of the positional arguments


def parse(words: list[str]) -> Parsed:
    """``words`` (after ``depthscope``) as the CLI reads them: the command each word selects, walking
    the groups as they resolve (``rank PATH`` is ``rank measure``), and which later words are
    options, their values and positional arguments. A command the CLI lacks is a LookupError.
    """
    command, names, at = CLI, [], 0
    while hasattr(command, "commands") and at < len(words) and not words[at].startswith("-"):
        ctx = command.context_class(command, info_name=" ".join(["depthscope", *names]))
        try:
            name, command, rest = command.resolve_command(ctx, words[at:])
        except Exception as err:  # noqa: BLE001 - click's usage error: no such command
            raise LookupError(f"depthscope {' '.join(words)}: no such command ({err})") from None
        names.append(name)
        at = len(words) - len(rest)  # `rank PATH` leaves PATH to its `measure` command
    options = {o: p for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
    given, unknown, args = [], [], []
    while at < len(words):
        word = words[at]
        if word.startswith("-") and len(word) > 1 and not re.fullmatch(r"-\d.*", word):
            name = word.split("=", 1)[0]
            given.append(name)
            param = options.get(name)
            if param is None and name != "--help":
                unknown.append(name)
            elif param is not None and not (param.is_flag or param.count) and "=" not in word:
                at += param.nargs
        else:
            args.append(at)
        at += 1
    return Parsed(" ".join(names), given, unknown, args)


def known_name(word: str) -> bool:
    """Whether a positional argument without a ``/`` names a file of the workspace or a model."""
    return any(fnmatch.fnmatchcase(f, word) for f in WORKSPACE) or word in SHORT_NAMES or word in zoo_names()


def runnable(command: str, cwd: Path) -> list[str]:
    """The argv run for a shown command: optional parts given, placeholders filled, CHEAPER added,
    repository paths read from the repository root and globs expanded (each must match).
    """
    words = cli_words(command)
    assert words is not None, command
    parsed = parse(words)
    words = [*words, *CHEAPER.get(parsed.path, [])]
    argv = []
    for i, word in enumerate(words):
        if i not in parsed.args:
            argv.append(word)
            continue
        base = ROOT if "/" in word else cwd
        if "*" in word:
            found = sorted(str(p) for p in base.glob(word))
            assert found, f"{command}: {word} matches nothing in {base}"
            argv.extend(found[:GLOBBED])
        else:
            assert "/" not in word or (ROOT / word).exists(), f"{command}: the repository has no {word}"
            argv.append(str(ROOT / word) if "/" in word else word)
    return argv


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The files the docs' commands name (``WORKSPACE``): m.safetensors (attnres, with m.step-*),
    m.nc, other.nc, DIR.
    """
    d = tmp_path_factory.mktemp("docs")
    args = ["train", "--scheme", "attnres", "--out", str(d / "m.safetensors"), "--steps", "2"]
    assert main([*args, "--save-every", "1", *SMALL, "--quiet"]) == 0
    assert (
        main(["capture", str(d / "m.safetensors"), "--out", str(d / "m.nc"), "--tokens", "256", "--quiet"])
        == 0
    )
    shutil.copy(d / "m.nc", d / "other.nc")
    tiny_llama_dir(d / "DIR")
    assert sorted(p.name for p in d.iterdir()) == sorted(WORKSPACE)
    return d


def tiny_llama_dir(path: Path) -> Path:
    """A Hugging Face model directory of a one-layer Llama (random weights, byte-level tokens)."""
    tiny_llama(0).save_pretrained(path)
    return path


COMMANDS = shown_commands()
RUN = sorted({c for _, c in COMMANDS if not any(c.startswith(k) for k in NOT_RUN)})


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20, COMMANDS
    assert any(c.startswith("torchrun") for _, c in COMMANDS) and any(
        c.startswith("make") for _, c in COMMANDS
    )


def test_every_shown_command_is_known():
    """Each shown line is a depthscope command the CLI has, given only options that command has
    (optional ``[--options]`` included), or is one of NOT_RUN's make targets.
    """
    wrong = []
    for name, command in COMMANDS:
        words = cli_words(command)
        if words is None:
            if not any(command.startswith(k) for k in NOT_RUN):
                wrong.append(f"{name}: {command}: neither depthscope nor in NOT_RUN")
            continue
        try:
            parsed = parse(words)
        except LookupError as err:
            wrong.append(f"{name}: {err}")
            continue
        if not parsed.path:
            wrong.append(f"{name}: {command}: no command")
        if parsed.unknown:
            wrong.append(f"{name}: {command}: `depthscope {parsed.path}` has no {', '.join(parsed.unknown)}")
    assert not wrong, "\n".join(wrong)


def test_every_shown_input_exists():
    """A positional argument with a ``/`` is a file (or a glob that matches) of the repository; one
    without is a file the workspace makes or a model name (zoo, short names).
    """
    wrong = []
    for name, command in COMMANDS:
        words = cli_words(command)
        if words is None:
            continue
        for i in parse(words).args:
            word = words[i]
            if "/" in word:
                if not (list(ROOT.glob(word)) if "*" in word else (ROOT / word).exists()):
                    wrong.append(f"{name}: {command}: the repository has no {word}")
            elif not known_name(word):
                wrong.append(f"{name}: {command}: {word} is neither a file of WORKSPACE nor a model name")
    assert not wrong, "\n".join(wrong)


def test_cheaper_options_exist():
    """CHEAPER's commands and options are the CLI's (a typo there would fail every run, or none)."""
    for path, extra in CHEAPER.items():
        parsed = parse([*path.split(), *extra])
        assert parsed.path == path and not parsed.unknown and not parsed.args, (path, parsed)


def test_the_parser_reads_as_the_cli_does():
    """What the checks above rely on: unknown commands and options are found, values are skipped."""
    p = parse(["rank", "m.nc", "--kappa", "0.5", "--bogus"])
    assert p.path == "rank measure" and p.unknown == ["--bogus"] and p.args == [1]
    p = parse(["capture", "m.safetensors", "--out", "m.nc", "--rank", "--ablate", "sources"])
    assert p.path == "capture" and not p.unknown and p.args == [1]
    p = parse(["zoo", "build", "--only", "standard"])
    assert p.path == "zoo build" and not p.unknown and not p.args
    with pytest.raises(LookupError, match="no such command"):
        parse(["zoo", "bild"])


@pytest.mark.slow
@pytest.mark.parametrize("command", RUN)
def test_a_shown_command_runs(command, workspace, tmp_path, monkeypatch):
    for f in workspace.iterdir():
        (shutil.copytree if f.is_dir() else shutil.copy)(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    argv = runnable(command, tmp_path)
    assert main(argv) == 0, f"depthscope {' '.join(argv)}"
