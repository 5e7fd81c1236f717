"""A report page rendered in headless Chromium, as the browser tests read it: the body's status
attributes and each chart's drawn marks (set by the page's own script, ``report.js``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Rendered:
    dom: str
    body: dict[str, str]  # the body's data-* attributes
    marks: dict[str, int]  # chart id -> items its data marks drew
    clipped: dict[str, int]  # chart id -> points drawn past the edge of their plot
    nonfinite: dict[str, int]  # chart id -> items at a position that is not a finite number
    charts: list[str]  # the chart ids the page holds


def chromium() -> list[str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is needed for this test: apt-get install chromium (.ci/run and make test do)"
    return [browser, *CHROMIUM_FLAGS]


def render(report: Path, profile: Path) -> Rendered:
    """Load ``report``/index.html in headless Chromium and read what its script recorded."""
    url = (report / "index.html").resolve().as_uri()
    dom = subprocess.run(
        [*chromium(), f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=180,
    ).stdout
    tag = re.search(r"<body([^>]*)>", dom).group(1)
    body = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag))
    marks = {
        cid: int(n)
        for cid, n in re.findall(r'<div class="chart[^"]*" id="([^"]+)"[^>]*data-marks="(\d+)"', dom)
    }
    chart = r'<div class="chart[^"]*" id="([^"]+)"[^>]*'
    clipped, nonfinite = (
        {cid: int(n) for cid, n in re.findall(chart + attr + r'="(\d+)"', dom)}
        for attr in ("data-clipped", "data-nonfinite")
    )
    charts = re.findall(r'<div class="chart" id="([^"]+)">', (report / "index.html").read_text())
    return Rendered(dom, body, marks, clipped, nonfinite, charts)


def assert_every_chart_drew(page: Rendered) -> None:
    """Every chart settled and drew marks; no script error and no warning (Vega reports a log
    domain that includes zero, which draws empty axes, only as a console warning)."""
    assert page.body.get("status") == "ready", page.body
    assert page.body.get("errors") == "0", page.body
    assert page.body.get("warnings") == "0", page.body
    drawn, total = map(int, page.body["charts"].split("/"))
    assert drawn == total == len(page.charts), page.body
    empty = [cid for cid in page.charts if page.marks.get(cid, 0) == 0]
    assert not empty, f"charts with no drawn marks: {empty}"
    assert set(page.clipped) == set(page.charts), "a chart did not say how many points it clipped"
    cut = {cid: n for cid, n in page.clipped.items() if n}
    assert not cut, f"points cut at the plot's edge: {cut}"
    assert set(page.nonfinite) == set(page.charts), "a chart did not say how many items it placed nowhere"
    nowhere = {cid: n for cid, n in page.nonfinite.items() if n}
    assert not nowhere, f"items at a non-finite position: {nowhere}"
