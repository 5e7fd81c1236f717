"""`depthscope report` end to end: files, tables that match the analysis, bad input, a real browser."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from depthscope.analysis.dilution import summary
from depthscope.cli import main
from depthscope.trace import load_trace, save_trace, select_model

SMALL = ["--layers", "3", "--d-model", "16", "--heads", "2", "--ctx", "32", "--batch-size", "4", "--quiet"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    for scheme in ("standard", "attnres"):
        assert (
            main(
                [
                    "train",
                    "--scheme",
                    scheme,
                    "--steps",
                    "5",
                    "--out",
                    str(d / f"{scheme}.safetensors"),
                    *SMALL,
                ]
            )
            == 0
        )
    out = d / "out"
    rc = main(
        [
            "report",
            str(d / "standard.safetensors"),
            str(d / "attnres.safetensors"),
            "--out",
            str(out),
            "--tokens",
            "256",
            "--quiet",
        ]
    )
    assert rc == 0
    return out


def test_report_files_and_references(report):
    html = (report / "index.html").read_text()
    figures = sorted(p.name for p in report.iterdir() if p.suffix in (".png", ".svg"))
    assert {
        "grid-weights.png",
        "grid-mixing.png",
        "grid-share.png",
        "dilution.png",
        "pattern.png",
        "retention.png",
        "rank.png",
    } <= set(figures)
    assert "model-standard.png" in figures and "model-attnres.svg" in figures
    for name in figures:
        assert f'href="{name}"' in html, name
    assert html.count("data:image/png;base64,") == len([f for f in figures if f.endswith(".png")])
    assert not [p for p in report.parent.iterdir() if p.name.startswith(".out.")]  # temporary dir gone
    # overview first: the grid and the dilution curves come before the tables
    assert html.index('id="grid-weights"') < html.index('id="dilution"') < html.index('id="summary"')
    assert "Row-normalised weight" in html  # the caption says which weight the grid shows


def test_traces_file_and_tables_match_analysis(report):
    stacked = load_trace(report / "traces.nc")
    assert stacked.sizes["model"] == 2 and list(stacked["model"].values) == ["standard", "attnres"]
    html = (report / "index.html").read_text()
    for label in stacked["model"].values:
        expected = float(summary(select_model(stacked, label))["pattern_score"].sel(group="sublayers"))
        row = re.search(rf'<tr data-model="{label}">(.*?)</tr>', html, re.S).group(1)
        value = float(re.search(r'class="pattern" data-value="([^"]+)"', row).group(1))
        assert value == pytest.approx(expected, rel=1e-12)
    std = float(
        re.search(r'<tr data-model="standard">.*?class="pattern" data-value="([^"]+)"', html, re.S).group(1)
    )
    assert std == 1.0  # a standard residual is exactly uniform
    assert 'id="rank"' in html and "collective_rank" in stacked


def test_report_reads_traces_too(report, tmp_path):
    one = select_model(load_trace(report / "traces.nc"), "attnres")
    save_trace(one, tmp_path / "a.nc")
    out = tmp_path / "again"
    assert (
        main(["report", str(tmp_path / "a.nc"), str(report / "traces.nc"), "--out", str(out), "--quiet"]) == 0
    )
    again = load_trace(out / "traces.nc")
    assert list(again["model"].values) == ["attnres", "standard", "attnres#2"]


@pytest.mark.parametrize("kind", ["text file", "missing", "directory"])
def test_bad_input_writes_nothing(tmp_path, capsys, kind):
    bad = tmp_path / "notes.txt"
    if kind == "text file":
        bad.write_text("hello")
    elif kind == "directory":
        bad.mkdir()
    out = tmp_path / "out"
    rc = main(["report", str(bad), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert ("no such file" in err) if kind == "missing" else ("neither a checkpoint" in err)
    assert not out.exists()


def test_unwritable_output_directory(report, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = main(["report", str(report / "traces.nc"), "--out", str(blocker / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot write the report" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.slow
def test_report_renders_in_a_browser(report, tmp_path):
    """Headless chromium: the page is not blank and every image in it loaded."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is needed for this test: apt-get install chromium (.ci/run and make test do)"
    url = (report / "index.html").resolve().as_uri()
    common = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [*common, "--virtual-time-budget=5000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    loaded = re.search(r'data-images-loaded="(\d+)/(\d+)"', dom)
    assert loaded, "the page's load script did not run"
    ok, total = map(int, loaded.groups())
    assert total >= 8 and ok == total
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*common, f"--screenshot={shot}", "--window-size=1280,1600", url], capture_output=True, timeout=120
    )
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    assert pixels.std() > 0.05  # not a blank page
    assert (pixels.mean(-1) < 0.9).mean() > 0.05  # a real share of the page is drawn (text, figures)
