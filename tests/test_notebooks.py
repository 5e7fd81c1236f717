"""The notebooks (jupytext percent scripts) run from start to end in a real kernel."""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.py"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.py",
        "02_comparing_schemes.py",
        "03_your_own_model.py",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHSCOPE_NOTEBOOK_TOKENS", "256")
    nb = jupytext.read(path)
    assert nb.cells and nb.cells[0].cell_type == "markdown"
    # a last cell, run in the same kernel: the notebook read the test's token budget, not its own
    nb.cells.append(nbformat.v4.new_code_cell('print(f"budget {TOKENS}")'))
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    budget = nb.cells.pop().outputs
    assert [o.get("text") for o in budget] == ["budget 256\n"]
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    shown = [o for o in outputs if o.get("output_type") in ("display_data", "execute_result")]
    assert any("image/png" in o.get("data", {}) for o in shown)  # the figures are displayed inline
    assert not list(tmp_path.iterdir())  # notebooks write no files
