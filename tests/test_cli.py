"""The CLI end to end: train from the entry point, and one clear line + exit 2 on bad input."""

from __future__ import annotations

import pytest

from depthscope import load
from depthscope.cli import main

SMALL = ["--layers", "2", "--d-model", "16", "--heads", "2", "--ctx", "32", "--batch-size", "4", "--quiet"]


def test_train_writes_a_loadable_checkpoint(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    rc = main(
        ["train", "--scheme", "attnres", "--set", "blocks=2", "--steps", "5", "--out", str(out), *SMALL]
    )
    assert rc == 0
    model = load(out)
    assert model.cfg.scheme == "attnres" and model.cfg.options.blocks == 2 and model.cfg.n_layers == 2
    assert model.training_summary["steps"] == 5
    assert "validation loss" in capsys.readouterr().out


def test_train_on_a_corpus_file(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "m.safetensors"
    assert main(["train", "--steps", "2", "--corpus", str(text), "--out", str(out), *SMALL]) == 0
    assert str(text) in load(out).training_summary["corpus"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scheme", "resnext"], "unknown scheme 'resnext'"),
        (["--set", "blocks"], "--set expects key=value"),
        (["--scheme", "attnres", "--set", "colour=red"], "unknown option"),
        (["--scheme", "attnres", "--set", "blocks=many"], "not a valid int"),
        (["--scheme", "attnres", "--set", "blocks=99"], "attnres blocks must be between"),
        (["--corpus", "/no/such/dir"], "does not exist"),
        (["--corpus", "SHORT"], "too short"),
        (["--corpus", "EMPTY"], "empty"),
        (["--heads", "3"], "must split into 3 heads"),
        (["--steps", "-1"], "Invalid value for '--steps'"),
        (["--batch-size", "0"], "Invalid value for '--batch-size'"),
        (["--lr", "0"], "Invalid value for '--lr'"),
        (["--lr", "fast"], "'fast' is not a number"),
        (["--layers", "0"], "Invalid value for '--layers'"),
        (["--save-every", "-5"], "Invalid value for '--save-every'"),
        (["--layerz", "2"], "No such option"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    (tmp_path / "short.txt").write_text("abc")
    (tmp_path / "empty.txt").write_text("")
    args = [
        a.replace("SHORT", str(tmp_path / "short.txt")).replace("EMPTY", str(tmp_path / "empty.txt"))
        for a in args
    ]
    out = tmp_path / "m.safetensors"
    rc = main(["train", "--steps", "1", "--out", str(out), *SMALL, *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert err.strip().count("\n") == 0, err
    assert not out.exists() and not list(tmp_path.glob(".m.safetensors*"))


def test_save_every_writes_intermediate_checkpoints_with_their_step(tmp_path):
    from depthscope.schemes.checkpoint import read_meta

    out = tmp_path / "run.safetensors"
    assert main(["train", "--steps", "6", "--save-every", "2", "--out", str(out), *SMALL]) == 0
    steps = sorted(tmp_path.glob("run.step-*.safetensors"))
    assert [p.name for p in steps] == ["run.step-000002.safetensors", "run.step-000004.safetensors"]
    for p, step in zip(steps, (2, 4)):
        t = read_meta(p)["training"]
        assert t["step"] == step and t["steps"] == 6 and t["train_tokens"] == step * 4 * 32
        assert load(p).training_summary["val_loss"] > 0
    assert read_meta(out)["training"]["step"] == 6


def test_schemes_lists_every_registered_scheme(capsys):
    from depthscope.schemes import scheme_names

    assert main(["schemes"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in scheme_names())
