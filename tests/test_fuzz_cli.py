"""Fuzzing the CLI (hypothesis): bad option values and wrong files for every command and subcommand.

Each generated command line holds at least one value the CLI must refuse before any work starts
(an option value typer rejects, an unknown option, or a missing or wrong-kind file that is
checked first), so nothing slow ever runs; odd values that do parse (huge numbers, empty paths,
an existing directory as the output) only appear beside a value typer rejects. Every case must exit
2 with exactly one line ``error: ...`` on stderr, no traceback, and leave no file behind.

Values that parse but must still be refused, one command line each, follow the fuzz.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depthscope.cli import main
from depthscope.probes import capture
from depthscope.trace import save_trace
from tests.helpers import build, tiny

HUGE = "9" * 30
NOT_INT = ("abc", "", "1.5", "nan", "1e3", "0x10", " ", "--")
NOT_FLOAT = ("abc", "", "nan", "NaN", "-nan", "1,5", "0x1p-2j")
NOT_UNIT = ("0", "-0.5", "1.5", "1e9", "inf", "-inf", *NOT_FLOAT)
BAD_FILES = ("{missing}", "{dir}", "{text}", "{empty}", "{binary}")  # where a checkpoint or trace goes
BAD_CORPUS = ("{missing}", "{empty_dir}", "{text}", "{empty}")  # missing, no text, too short
FLAG_VALUE = ("yes",)  # a value after a flag becomes an unexpected extra argument


@dataclass(frozen=True)
class Slot:
    """One option (``flag``) or positional argument (``flag=None``) of a command.

    ``valid``: cheap values that parse; ``refused``: values typer rejects while parsing;
    ``early``: values depthscope refuses before any work (missing or wrong files, unknown names,
    out-of-range for the model); ``odd``: values that parse and reach the command (huge numbers,
    empty paths), drawn only beside a refused value. A ``flag_only`` slot takes no value.
    """

    flag: str | None
    valid: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    early: tuple[str, ...] = ()
    odd: tuple[str, ...] = ()
    required: bool = False
    flag_only: bool = False
    repeat: int = 1


def count(flag, lo: int, valid=("1", "2"), odd=(HUGE,), **kw) -> Slot:
    """An integer option with ``min=lo``."""
    below = tuple(str(v) for v in (lo - 1, -5) if v < lo)
    return Slot(flag, valid=valid, refused=below + NOT_INT, odd=odd, **kw)


def flag(name: str) -> Slot:
    return Slot(name, flag_only=True, refused=FLAG_VALUE)


SEED = Slot("--seed", valid=("0", "3"), refused=NOT_INT, odd=("-1", HUGE, "-" + HUGE))
QUIET = flag("--quiet")
JSON = flag("--json")
CORPUS = Slot("--corpus", early=BAD_CORPUS, odd=("", "{dir}"))
UNKNOWN = Slot("--no-such-option", refused=("1",))

COMMANDS: dict[str, tuple[list[str], list[Slot], bool]] = {
    # name: (words, slots, slow: valid settings would start long work)
    "train": (
        ["train"],
        [
            Slot("--scheme", valid=("standard", "attnres"), early=("resnext", "", "STANDARD", "<script>")),
            Slot("--out", valid=("{work}/m.safetensors",), odd=("", "{dir}", "{work}")),
            count("--layers", 1, valid=("1",)),
            Slot("--d-model", valid=("8",), refused=("0", "-8", *NOT_INT), odd=(HUGE,)),
            Slot("--heads", valid=("1",), refused=("0", *NOT_INT), early=("3",), odd=(HUGE,)),
            count("--ctx", 1, valid=("8",)),
            count("--steps", 0, valid=("0", "1")),
            count("--batch-size", 1, valid=("2",)),
            Slot("--lr", valid=("0.001",), refused=("0", "-1", "-inf", *NOT_FLOAT), odd=("1e308",)),
            SEED,
            CORPUS,
            Slot("--set", early=("blocks", "=2", "colour=red", "blocks=many"), repeat=2),
            flag("--half"),
            count("--save-every", 0, valid=("0",)),
            QUIET,
            UNKNOWN,
        ],
        True,
    ),
    "schemes": (["schemes"], [Slot(None, refused=("extra", "")), UNKNOWN], False),
    "adapters": (["adapters"], [Slot(None, refused=("extra",)), UNKNOWN], False),
    "report": (
        ["report"],
        [
            Slot(
                None,
                valid=("{ckpt}", "{trace}"),
                early=(*BAD_FILES, "{trace}.missing"),
                required=True,
                repeat=2,
            ),
            Slot("--out", valid=("{work}/report",), odd=("", "{text}", "{work}")),
            Slot("--corpus", odd=(*BAD_CORPUS, "")),  # read only for checkpoints: never refused alone
            count("--tokens", 1, valid=("64",)),
            count("--batch-size", 1, valid=("4",)),
            SEED,
            count("--k", 0, valid=("0", "2")),
            Slot("--ctx", valid=("8",), refused=("0", "-1", *NOT_INT), odd=("1000", HUGE)),
            Slot("--skip-positions", valid=("0",), refused=("-1", *NOT_INT), odd=("1000", HUGE)),
            flag("--trajectory"),
            Slot("--step", refused=("-1", *NOT_INT), odd=("5", HUGE), repeat=3),
            Slot("--revision", early=("main", "")),  # no input here is a hub id
            flag("--trust-remote-code"),
            QUIET,
            UNKNOWN,
        ],
        False,
    ),
    "capture": (
        ["capture"],
        [
            Slot(None, valid=("{ckpt}",), early=(*BAD_FILES, "{trace}"), required=True),
            Slot("--out", valid=("{work}/t.nc",), odd=("", "{dir}", "{work}"), required=True),
            CORPUS,
            count("--tokens", 1, valid=("64",)),
            count("--batch-size", 1, valid=("4",)),
            SEED,
            Slot("--ctx", valid=("8",), refused=("0", "-1", *NOT_INT), early=("9", "1000"), odd=(HUGE,)),
            Slot("--skip-positions", valid=("0", "1"), refused=("-1", *NOT_INT), early=("8",), odd=(HUGE,)),
            flag("--rank"),
            flag("--logits"),
            Slot("--ablate", valid=("sources",), refused=("everything", "", "SOURCES", "cell")),
            flag("--ablate-mean"),
            QUIET,
            count("--workers", 1, valid=("1",), odd=("2", HUGE)),
            count("--checkpoint-every", 0, valid=("0",)),
            flag("--resume"),
            Slot("--device", valid=("cpu",), early=("nonsense", "", "cpu:x:y"), odd=("cuda:99", "meta")),
            Slot("--dtype", valid=("float32",), refused=("float64", "", "int8", "FLOAT32")),
            Slot("--device-map", early=("auto", "{{not json", "[1, 2]"), odd=("{text}",)),
            Slot("--revision", early=("main", "")),  # no input here is a hub id
            flag("--trust-remote-code"),
            UNKNOWN,
        ],
        False,
    ),
    "dilution": (
        ["dilution"],
        [
            Slot(None, valid=("{trace}",), early=(*BAD_FILES, "{ckpt}"), required=True),
            count("--k", 0, valid=("0", "2")),
            UNKNOWN,
        ],
        False,
    ),
    "zoo list": (
        ["zoo", "list"],
        [
            Slot("--dir", early=("{missing}", "{text}", "{empty_dir}", "")),
            Slot("--collection", valid=("zoo", "deep"), early=("nope", "")),
            Slot(None, refused=("extra",)),
            UNKNOWN,
        ],
        False,
    ),
    "zoo build": (
        ["zoo", "build"],
        [
            Slot("--out", valid=("{work}/zoo",), required=True),  # never the bundled zoo
            Slot("--steps", refused=("0", "-1", *NOT_INT), odd=(HUGE,)),
            Slot("--only", early=("resnext", "", "<script>"), odd=("standard",), repeat=2),
            flag("--recapture"),
            QUIET,
            UNKNOWN,
        ],
        True,
    ),
    "rank": (
        ["rank"],
        [
            Slot(
                None, valid=("{trace}",), early=(*BAD_FILES, "{ckpt}.missing"), odd=("{ckpt}",), required=True
            ),
            Slot("--kappa", valid=("0.5", "1"), refused=NOT_UNIT),
            Slot("--variant", valid=("v1", "v2"), refused=("v3", "", "V1", "grn")),
            count("--tokens", 1, valid=("64",)),
            Slot("--energy", valid=("0.9", "1"), refused=NOT_UNIT),
            Slot("--corpus", odd=(*BAD_CORPUS, "")),  # read only for checkpoints
            Slot("--revision", early=("main", "")),  # no input here is a hub id
            flag("--trust-remote-code"),
            JSON,
            QUIET,
            UNKNOWN,
        ],
        False,
    ),
    "rank threshold": (
        ["rank", "threshold"],
        [
            Slot("--d", valid=("2", "4"), refused=("1", "0", "-5", *NOT_INT), odd=(HUGE,), required=True),
            Slot("--kappa", valid=("0.5",), refused=NOT_UNIT, required=True),
            Slot("--variant", valid=("v1", "v2"), refused=("v3", "", "V1")),
            count("--tasks", 1, valid=("1",)),
            SEED,
            JSON,
            UNKNOWN,
        ],
        True,
    ),
    "rank theory": (
        ["rank", "theory"],
        [
            Slot("--out", valid=("{work}/theory",), odd=("", "{text}"), required=True),
            Slot("--variant", valid=("v1",), refused=("v3", "", "V2"), repeat=2),
            count("--tasks", 1, valid=("1",)),
            SEED,
            JSON,
            UNKNOWN,
        ],
        True,
    ),
    "rank identity": (
        ["rank", "identity"],
        [
            Slot("--out", valid=("{work}/identity",), odd=("", "{text}"), required=True),
            count("--steps", 1, valid=("1",)),
            flag("--no-sweep"),
            JSON,
            UNKNOWN,
        ],
        True,
    ),
    "rank sweep": (
        ["rank", "sweep"],
        [
            Slot("--out", valid=("{work}/sweep",), odd=("", "{text}"), required=True),
            Slot(
                "--width",
                valid=("32",),
                refused=("16", "0", "-32", *NOT_INT),
                early=("40",),
                odd=(HUGE,),
                repeat=2,
            ),
            Slot("--scheme", valid=("standard",), early=("resnext", "", "<script>"), repeat=2),
            count("--layers", 1, valid=("1",)),
            count("--steps", 1, valid=("1",)),
            count("--tokens", 1, valid=("64",)),
            JSON,
            QUIET,
            UNKNOWN,
        ],
        True,
    ),
}


@st.composite
def picks(draw, name: str) -> dict[int, list[tuple[str, str]]]:
    """{slot index: [(kind, value), ...]} for a command line of ``name`` that holds at least one
    value refused before any work starts (for a slow command: one that typer rejects).
    """
    _, slots, slow = COMMANDS[name]
    chosen_by_slot: dict[int, list[tuple[str, str]]] = {}
    for i, slot in enumerate(slots):
        kinds = [k for k in ("valid", "refused", "early") if getattr(slot, k)]
        if slot.flag_only:
            kinds = ["flag", "refused"]
        if not slot.required:
            kinds.append("omit")
        kind = draw(st.sampled_from(kinds), label=f"{slot.flag or 'argument'} kind")
        if kind == "omit":
            continue
        n = draw(st.integers(1, slot.repeat)) if slot.repeat > 1 else 1
        chosen_by_slot[i] = [
            (kind, "" if kind == "flag" else draw(st.sampled_from(getattr(slot, kind)))) for _ in range(n)
        ]
    blocking = ("refused",) if slow else ("refused", "early")
    if not any(kind in blocking for chosen in chosen_by_slot.values() for kind, _ in chosen):
        candidates = [i for i, s in enumerate(slots) if any(getattr(s, k) for k in blocking)]
        i = draw(st.sampled_from(candidates), label="forced invalid")
        kind = draw(st.sampled_from([k for k in blocking if getattr(slots[i], k)]))
        pick = (kind, draw(st.sampled_from(getattr(slots[i], kind))))
        chosen_by_slot[i] = [*chosen_by_slot.get(i, []), pick] if slots[i].repeat > 1 else [pick]
    if any(kind == "refused" for chosen in chosen_by_slot.values() for kind, _ in chosen):
        for i, slot in enumerate(slots):  # odd values are safe now: parsing fails first
            if any(kind == "refused" for kind, _ in chosen_by_slot.get(i, [])):
                continue  # (an option given twice keeps its last value: never hide the refused one)
            if slot.odd and draw(st.booleans(), label=f"odd {slot.flag}"):
                pick = ("odd", draw(st.sampled_from(slot.odd)))
                chosen_by_slot[i] = [*chosen_by_slot.get(i, []), pick] if slot.repeat > 1 else [pick]
    return chosen_by_slot


def to_argv(name: str, picks: dict[int, list[tuple[str, str]]]) -> list[str]:
    words, slots, _ = COMMANDS[name]
    argv = list(words)
    argv += [value for i, chosen in picks.items() if slots[i].flag is None for _, value in chosen]
    for i, chosen in picks.items():
        slot = slots[i]
        if slot.flag is None:
            continue
        for kind, value in chosen:  # (a value after a flag is an unexpected extra argument)
            argv += [slot.flag] if kind == "flag" else [slot.flag, value]
    return argv


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Every kind of file a command line can name, and a work directory (also the cwd)."""
    d = tmp_path_factory.mktemp("fuzz")
    model = build(tiny(n_layers=1, d_model=8, n_heads=1, ctx=8))
    model.training_summary = {"steps": 0}
    model.save(d / "m.safetensors")
    trace = capture(
        model, torch.randint(0, 256, (4, 8), generator=torch.Generator().manual_seed(0)), rank=True
    )
    save_trace(trace, d / "t.nc")
    (d / "notes.txt").write_text("hello")
    (d / "empty.txt").write_bytes(b"")
    (d / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (d / "a-directory").mkdir()
    (d / "a-directory" / "notes.txt").write_text("x")
    (d / "empty-dir").mkdir()
    (d / "work").mkdir()
    return {
        "ckpt": str(d / "m.safetensors"),
        "trace": str(d / "t.nc"),
        "text": str(d / "notes.txt"),
        "empty": str(d / "empty.txt"),
        "binary": str(d / "blob.bin"),
        "dir": str(d / "a-directory"),
        "empty_dir": str(d / "empty-dir"),
        "missing": str(d / "no" / "such" / "file"),
        "work": str(d / "work"),
        "root": str(d),
    }


def tree(root: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*"))


class _TooSlow(Exception):
    pass


def _alarm(signum, frame):
    raise _TooSlow("the command started long work")


def run(argv: list[str], files: dict[str, str], limit: int = 30) -> tuple[int, str]:
    """(exit status, stderr) of ``depthscope argv`` run in the work directory, at most ``limit`` s."""
    argv = [a.format(**files) for a in argv]
    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    cwd = os.getcwd()
    os.chdir(files["work"])  # a relative or empty path lands here, never in the repository
    signal.alarm(limit)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
    except Exception as exc:  # what a user would see as a traceback
        pytest.fail(f"depthscope {argv} raised {type(exc).__name__}: {exc}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(cwd)
    return rc, err.getvalue()


def assert_one_error_line(argv, rc: int, err: str) -> None:
    lines = err.splitlines()
    assert rc == 2, f"{argv}: exit {rc}, stderr {err!r}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{argv}: stderr {err!r}"
    assert lines[0][len("error: ") :].strip(), f"{argv}: an empty error message"
    assert "Traceback" not in err


FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("name", list(COMMANDS))
@FUZZ
@given(data=st.data())
def test_invalid_command_lines_exit_2_with_one_error_line(files, name, data):
    argv = to_argv(name, data.draw(picks(name), label="picks"))
    before = tree(files["root"])
    rc, err = run(argv, files)
    assert_one_error_line(argv, rc, err)
    assert tree(files["root"]) == before, f"{argv} left files behind"


def test_the_generator_always_includes_a_value_refused_first():
    """Sanity of the fuzz itself: every command line carries a value refused before any work (for a
    slow command, one typer rejects), and no later value of the same option hides it.
    """

    @settings(max_examples=200, derandomize=True, deadline=None)
    @given(data=st.data())
    def check(data):
        name = data.draw(st.sampled_from(list(COMMANDS)))
        chosen = data.draw(picks(name))
        blocking = ("refused",) if COMMANDS[name][2] else ("refused", "early")
        last = [values[-1][0] for values in chosen.values()]
        assert any(kind in blocking for kind in last), (name, chosen)
        if any(kind == "odd" for values in chosen.values() for kind, _ in values):
            assert "refused" in last, (name, chosen)

    check()


# --- values that parse, but must still be refused in one line ---------------------------------------

TINY_TRAIN = ["--layers", "1", "--d-model", "8", "--heads", "1", "--ctx", "8", "--batch-size", "2", "--quiet"]

PARSED_BUT_WRONG = {
    "threshold with a width beyond any array": ["rank", "threshold", "--d", HUGE, "--kappa", "0.5"],
    "threshold with a negative seed": ["rank", "threshold", "--d", "4", "--kappa", "0.5", "--seed", "-1"],
    "capture with a huge seed": [
        "capture",
        "{ckpt}",
        "--out",
        "{work}/t.nc",
        "--tokens",
        "64",
        "--seed",
        HUGE,
    ],
    "capture with a huge batch": [
        "capture",
        "{ckpt}",
        "--out",
        "{work}/t.nc",
        "--tokens",
        "64",
        "--batch-size",
        HUGE,
    ],
    "capture into an existing directory": [
        "capture",
        "{ckpt}",
        "--out",
        "{dir}",
        "--tokens",
        "64",
        "--quiet",
    ],
    "capture to an empty path": ["capture", "{ckpt}", "--out", "", "--tokens", "64", "--quiet"],
    "train into an existing directory": ["train", "--steps", "0", "--out", "{dir}", *TINY_TRAIN],
    "train to an empty path": ["train", "--steps", "0", "--out", "", *TINY_TRAIN],
    "train with a huge seed": [
        "train",
        "--steps",
        "0",
        "--out",
        "{work}/m.safetensors",
        "--seed",
        HUGE,
        *TINY_TRAIN,
    ],
    "train with an infinite learning rate": [
        "train",
        *("--steps", "1", "--out", "{work}/m.safetensors", "--lr", "inf"),
        *TINY_TRAIN,
    ],
    "report with a huge step": [
        "report",
        "{ckpt}",
        "--out",
        "{work}/r",
        "--tokens",
        "64",
        "--step",
        HUGE,
        "--quiet",
    ],
    "report to an empty path": ["report", "{trace}", "--out", "", "--quiet"],
    "no command": [],
    "rank without a path or subcommand": ["rank"],
    "zoo without a subcommand": ["zoo"],
}


@pytest.mark.parametrize("case", list(PARSED_BUT_WRONG))
def test_values_that_parse_but_are_wrong_are_one_line(files, tmp_path, case):
    argv = PARSED_BUT_WRONG[case]
    files = {**files, "work": str(tmp_path)}  # a fresh work directory (and cwd) for each case
    before = tree(files["root"])
    rc, err = run(argv, files, limit=60)
    assert_one_error_line(argv, rc, err)
    assert tree(files["root"]) == before and tree(str(tmp_path)) == [], f"{argv} left files behind"
