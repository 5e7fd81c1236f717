"""The command line reads any model: `depthscope spec MODEL` prints a spec file in the model's own
names, and `capture`, `inspect` and `report` read a model through `--spec FILE.py` (its spec, its
setup() and its load()); what fails in a spec file is one line naming the file and the line."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from depthscope.cli import main
from depthscope.probes import capture
from depthscope.trace import load_trace
from tests.test_hostile import assert_one_error_line, run

# a byte-level nanoGPT (its own names, no config, no tokenizer), built by the spec file's load()
LOAD = """
import torch
from torch import nn


class CausalMean(nn.Module):
    # a stand-in for attention: each position reads the mean of the values up to it

    def __init__(self, d):
        super().__init__()
        self.v = nn.Linear(d, d)

    def forward(self, x):
        return self.v(x).cumsum(1) / torch.arange(1, x.shape[1] + 1)[:, None]


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), CausalMean(d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, d=32, layers=3, ctx=64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(256, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, 256, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def load(path):
    torch.manual_seed(0)
    return NanoGPT().eval()
"""
SPEC = """
from depthscope import ModelSpec

spec = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "h.*.attn", "mlp": "h.*.mlp"},
    reads={"attn": "h.*.ln_1", "mlp": "h.*.ln_2", "readout": "ln_f"},
)
"""
FAST = ["--tokens", "256", "--ctx", "32", "--batch-size", "4", "--quiet"]


def quiet(argv: list) -> int:
    with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        return main([str(a) for a in argv])


@pytest.fixture
def files(tmp_path) -> Path:
    (tmp_path / "load.py").write_text(LOAD)
    (tmp_path / "spec.py").write_text(LOAD + SPEC)
    return tmp_path


def test_a_spec_file_reads_a_model_only_its_load_builds(files, tmp_path):
    """MODEL is whatever load() takes ('nano' is no file): the trace equals the Python capture."""
    out = tmp_path / "t.nc"
    assert quiet(["capture", "nano", "--spec", files / "spec.py", "--out", out, *FAST]) == 0
    trace = load_trace(out)
    assert trace.attrs["spec_file"] == str((files / "spec.py").resolve())
    from depthscope.probes.specfile import read_spec_file

    sf = read_spec_file(files / "spec.py")
    again = capture(sf.load("nano"), None, n_tokens=256, ctx=32, batch_size=4, spec=sf.spec, progress=False)
    for var in ("mixing", "contribution_share", "residual_error"):
        np.testing.assert_array_equal(trace[var].values, again[var].values)
    np.testing.assert_allclose(trace["mixing"].sel(layer="readout").dropna("source"), 1.0, atol=1e-12)


def test_depthscope_spec_prints_a_spec_that_reads_the_model(files, tmp_path, capsys):
    """No edit: the printed file (its load() reused from the file lent) captures the model exactly as
    the hand-written spec does."""
    suggested = tmp_path / "suggested.py"
    assert main(["spec", "nano", "--spec", str(files / "load.py"), "--out", str(suggested)]) == 0
    text = suggested.read_text()
    assert 'embed=["wte", "wpe"]' in text and '"attn": "h.*.attn"' in text and '"readout": "ln_f"' in text
    assert "checked on a probe forward: read" in text
    by_hand, printed = tmp_path / "a.nc", tmp_path / "b.nc"
    assert quiet(["capture", "nano", "--spec", files / "spec.py", "--out", by_hand, *FAST]) == 0
    assert quiet(["capture", "nano", "--spec", suggested, "--out", printed, *FAST]) == 0
    a, b = load_trace(by_hand), load_trace(printed)
    for var in ("mixing", "contribution_share"):
        np.testing.assert_array_equal(a[var].values, b[var].values)
    capsys.readouterr()
    assert main(["spec", "nano", "--spec", str(files / "load.py")]) == 0  # printed to stdout
    assert "spec = ModelSpec(" in capsys.readouterr().out


def test_depthscope_spec_reads_the_muddformer_checkpoint(tmp_path):
    """The MUDDFormer-shaped custom-code checkpoint: the printed spec names layer 0's one norm under
    the q, k and v views and reads every input exactly, without an edit."""
    from tests.fixtures.muddformer_like import write_muddformer_like

    directory = tmp_path / "mudd"
    with redirect_stderr(io.StringIO()):
        write_muddformer_like(directory)
    given = (directory / "spec.py").read_text()
    start, end = given.index("spec = ModelSpec("), given.index("def setup")
    (tmp_path / "load.py").write_text(given[:start] + given[end:])  # its load() and setup(), no spec
    suggested = tmp_path / "suggested.py"
    assert quiet(["spec", directory, "--spec", tmp_path / "load.py", "--out", suggested]) == 0
    text = suggested.read_text()
    assert '"attn.q": ["layers.0.attention_norm", "layers.*.attention_norms.0"]' in text
    out = tmp_path / "t.nc"
    assert quiet(["capture", directory, "--spec", suggested, "--out", out, *FAST]) == 0
    trace = load_trace(out)
    assert [str(x) for x in trace.layer.values[:4]] == ["0.attn.q", "0.attn.k", "0.attn.v", "0.mlp"]
    assert float(trace["residual_error"].max()) < 1e-5
    found = json.loads(trace.attrs["weights_found"])
    assert found["3.attn.q"] == "token" and found["0.attn.q"] == "unit"
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-9)


def test_inspect_and_report_take_a_spec_file(files, tmp_path):
    table = tmp_path / "p.nc"
    assert quiet(["inspect", "nano", "--spec", files / "spec.py", "--text", "def f(x):", "--out", table]) == 0
    import xarray as xr

    ds = xr.open_dataset(table)
    np.testing.assert_allclose(ds["contribution_share"].sum("source"), 1.0, atol=1e-6)
    report = tmp_path / "rep"
    argv = ["report", "nano", "--spec", files / "spec.py", "--out", report, "--tokens", "128", "--ctx", "32"]
    assert quiet([*argv, "--quiet"]) == 0
    assert (report / "index.html").is_file()


@pytest.mark.parametrize(
    "body, message",
    [
        (
            "x = 1\ny = 2\nraise ValueError('bad value')\n",
            r"running the spec file failed \(line 3\): ValueError",
        ),
        ("spec = 3\n", "spec is a int, not a depthscope.ModelSpec"),
        ("load = 3\n", "load is a int, not a function"),
        ("def load(path):\n    return {}[path]\n" + SPEC, r"load\(\) failed \(line 2\): KeyError"),
        ("import sys\nsys.exit(3)\n", r"exits \(3\)"),
        ("def load(path):\n    return 7\n" + SPEC, r"load\(\) returned a int, not a torch module"),
        (
            LOAD.replace(
                "def load(path):", "def setup(model):\n    raise RuntimeError('no cache')\n\ndef load(path):"
            )
            + SPEC,
            r"setup\(\) failed \(line \d+\): RuntimeError: no cache",
        ),
        (LOAD, "defines no spec"),
    ],
)
def test_what_fails_in_a_spec_file_is_one_line(tmp_path, body, message):
    path = tmp_path / "bad.py"
    path.write_text(body)
    rc, err = run(["capture", "nano", "--spec", path, "--out", tmp_path / "t.nc", *FAST])
    assert_one_error_line(rc, err, str(path))
    import re

    assert re.search(message, err), err
    assert not (tmp_path / "t.nc").exists()


def test_a_spec_file_is_python_and_must_exist(tmp_path):
    rc, err = run(["capture", "nano", "--spec", tmp_path / "none.py", "--out", tmp_path / "t.nc"])
    assert_one_error_line(rc, err)
    assert "no such file" in err
    (tmp_path / "s.json").write_text("{}")
    rc, err = run(["capture", "nano", "--spec", tmp_path / "s.json", "--out", tmp_path / "t.nc"])
    assert_one_error_line(rc, err)
    assert "a spec file is Python" in err


def test_help_says_a_spec_file_runs_code():
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["capture", "--help"]) == 0
    assert "naming it runs its code" in " ".join(out.getvalue().replace("│", " ").split())
