"""`depthscope report` end to end: files, tables that match the analysis, bad input, a real browser."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from depthscope.analysis.dilution import summary
from depthscope.cli import main
from depthscope.trace import load_trace, save_trace, select_model
from tests.figures.browser import assert_every_chart_drew, chromium, render

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
        "norm-growth.png",
        "pattern.png",
        "retention.png",
        "rank.png",
    } <= set(figures)
    assert "model-standard.png" in figures and "model-attnres.svg" in figures
    for name in figures:
        assert f'href="{name}"' in html, name
    # every figure is interactive, or (drawn as its paper draws it) its PNG is embedded: no image twice
    pngs = [f for f in figures if f.endswith(".png")]
    charts = set(re.findall(r'<figure id="([^"]+)"><div class="charts">', html))
    assert html.count("data:image/png;base64,") == len(pngs) - len(charts) and len(charts) >= 8
    assert not [p for p in report.parent.iterdir() if p.name.startswith(".out.")]  # temporary dir gone
    # overview first: the grid and the dilution curves come before the tables
    assert html.index('id="grid-weights"') < html.index('id="dilution"') < html.index('id="summary"')
    assert "Row-normalised weight" in html  # the caption says which weight the grid shows
    titles = re.findall(r"<figcaption><b>(.*?)</b>", html)
    assert "Does the weight matter?" in titles or not re.search("weight-effect", html)
    assert titles and not [t for t in titles if t.endswith(("?.", "..")) or not t.endswith((".", "?"))]
    header = re.search(r'<p class="sub">.*?Corpus: (.*?)\. depthscope', html).group(1)
    assert re.fullmatch(r"python-stdlib \(\d+ files, python3\.\d+\)", header), header  # no machine path


def test_traces_file_and_tables_match_analysis(report):
    stacked = load_trace(report / "traces.nc")
    assert stacked.sizes["model"] == 2 and list(stacked["model"].values) == ["standard", "attnres"]
    html = (report / "index.html").read_text()
    for label in stacked["model"].values:
        expected = float(summary(select_model(stacked, label))["pattern_score"].sel(group="sublayers"))
        row = re.search(rf'<tr data-model="{label}">(.*?)</tr>', html, re.S).group(1)
        growth = float(summary(select_model(stacked, label))["norm_growth_ratio"])
        shown = float(re.search(r'class="norm-growth" data-value="([^"]+)"', row).group(1))
        assert shown == pytest.approx(growth, rel=1e-12) and growth > 0
        value = float(re.search(r'class="pattern" data-value="([^"]+)"', row).group(1))
        if label == "standard":  # unit weights: the pattern score is 1 by construction, shown as no finding
            assert expected == 1.0 and np.isnan(value) and "unit (pattern 1 by construction)" in row
        else:
            assert value == pytest.approx(expected, rel=1e-12) and "learned" in row
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


def test_settings_and_origin_cells_of_traces_made_in_python():
    """A trace captured in Python has no checkpoint path and no ablation: its cells say so."""
    import torch

    from depthscope.pipelines.report_data import checkpoint_cell
    from depthscope.pipelines.report_settings import used
    from depthscope.probes import capture
    from tests.helpers import build, tiny

    t = capture(build(tiny()), torch.randint(0, 256, (2, 16)))
    assert t.attrs["checkpoint"] == ""
    assert checkpoint_cell(t) == "captured in Python (standard)"
    ablated = t.copy()
    ablated.attrs.update(ablation="cells", checkpoint="/somewhere/on/a/machine/ckpt.safetensors")
    assert checkpoint_cell(ablated) == "ckpt.safetensors"
    t.attrs["ablation"] = ""  # as a stack of traces with and without ablation stores the missing attr
    row = used([("python", t), ("zoo", ablated)])["ablate"]
    assert row == "off: python; cells: zoo"


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


def test_report_is_offline_and_sized_by_its_data(report):
    """No script or stylesheet from a URL; the charting runtime once; the rest of the page is what
    its data needs (rounded numbers: 4 significant digits)."""
    from depthscope.figures.interactive import runtime

    html = (report / "index.html").read_text()
    assert not re.search(r"<script[^>]*\bsrc=", html) and not re.search(r"<link[^>]*https?://", html)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert html.count(runtime()) == 1 and html.count("<script") == 1
    payload = re.search(r"var REPORT = (\{.*?\});\n", html).group(1)
    numbers = re.findall(r"-?\d+\.\d+(?:e-?\d+)?", payload)
    digits = [n.lstrip("-").split("e")[0].replace(".", "").strip("0") for n in numbers]
    assert numbers and max(map(len, digits)) <= 4
    # two 3-block models: the page is the runtime, the data and a fixed overhead (tables, text)
    assert len(html) - len(runtime()) < 250_000


@pytest.mark.slow
def test_report_renders_in_a_browser(report, tmp_path):
    """Headless chromium: the page's script runs with no error or warning, every chart draws marks,
    it offers one option per model, and the page is not blank."""
    page = render(report, tmp_path / "profile")
    assert_every_chart_drew(page)
    assert len(page.charts) >= 8
    dom = page.dom
    assert len(re.findall(r"<canvas", dom)) >= len(page.charts)  # each chart drew its canvas
    select = re.search(r'<select id="model-select">(.*?)</select>', dom, re.S).group(1)
    assert re.findall(r'<option value="([^"]+)"', select) == ["standard", "attnres"]
    # the selector shows one model's section
    shown = re.findall(r'<section id="section-[^"]+" data-model="([^"]+)"(?! hidden)', dom)
    assert shown == ["standard"], shown
    shot = tmp_path / "shot.png"
    url = (report / "index.html").resolve().as_uri()
    subprocess.run(
        [
            *chromium(),
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1280,1600",
            url,
        ],
        capture_output=True,
        timeout=120,
    )
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    assert pixels.std() > 0.05  # not a blank page
    assert (pixels.mean(-1) < 0.9).mean() > 0.05  # a real share of the page is drawn (text, figures)
