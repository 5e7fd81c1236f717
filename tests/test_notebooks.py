"""The notebooks (jupytext percent scripts) run from start to end in a real kernel, show their figures
inline and save them where ``DEPTHSCOPE_NOTEBOOK_OUT`` says; ``make notebooks`` writes them as
``.ipynb`` files, which must be valid notebooks."""

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
        "04_real_checkpoint.py",  # the three workflows: a real checkpoint end to end,
        "05_report_figures.py",  # the figures of a report,
        "06_rank_thresholds.py",  # collective-rank thresholds
    ]


# the figures each notebook saves (in DEPTHSCOPE_NOTEBOOK_OUT)
SAVED = {
    "04_real_checkpoint": ["smollm2-blocks.png", "smollm2-blocks.svg", "smollm2-last-token.png"],
    "05_report_figures": ["deep-weights.pdf", "hc-departure.pdf", "hc-departure.svg"],
    "06_rank_thresholds": ["threshold-vs-kappa.png"],
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_notebook_converts_to_a_valid_ipynb(path, tmp_path):
    """What ``make notebooks`` does: jupytext writes an .ipynb that nbformat accepts."""
    out = tmp_path / f"{path.stem}.ipynb"
    jupytext.write(jupytext.read(path), out)
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    assert sum(c.cell_type == "code" for c in nb.cells) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHSCOPE_NOTEBOOK_TOKENS", "256")
    saved = tmp_path / "saved"
    monkeypatch.setenv("DEPTHSCOPE_NOTEBOOK_OUT", str(saved))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    nb = jupytext.read(path)
    assert nb.cells and nb.cells[0].cell_type == "markdown"
    # a last cell, run in the same kernel: the notebook read the test's token budget, not its own
    nb.cells.append(nbformat.v4.new_code_cell("print(f\"budget {globals().get('TOKENS')}\")"))
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(run_dir)}}
    ).execute()
    budget = nb.cells.pop().outputs
    if "DEPTHSCOPE_NOTEBOOK_TOKENS" in path.read_text():  # a notebook that captures reads the test's budget
        assert [o.get("text") for o in budget] == ["budget 256\n"]
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    shown = [o for o in outputs if o.get("output_type") in ("display_data", "execute_result")]
    assert any("image/png" in o.get("data", {}) for o in shown)  # the figures are displayed inline
    assert not list(run_dir.iterdir())  # nothing written where it runs
    want = SAVED.get(path.stem, [])
    assert sorted(p.name for p in saved.iterdir()) == want if want else not saved.exists()
    for name in want:
        assert (saved / name).stat().st_size > 1000
