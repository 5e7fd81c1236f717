"""The claims tables of docs/results.md are what the bundled several-seed collection gives: each cell
of the claims table (claim, source, paper, ours, verdict) and of the steps-to-equal-loss and costs
table equals ``read_claims()``'s, the numbers ``depthscope claims`` prints, in the same order. A
rebuilt collection or a changed estimator fails here until the docs are written again from
``depthscope claims``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from depthscope.pipelines.claims import read_claims

RESULTS = Path(__file__).parent.parent / "docs" / "results.md"
CLAIMS_HEADER = ["claim", "source", "paper", "ours (mean ± sd over seeds)", "verdict"]
COSTS_HEADER = ["variant", "steps ratio", "params", "FLOPs/token", "time/step", "gain (nats/byte)"]


def cells(line: str) -> list[str]:
    """The cells of a markdown table row; ``\\|`` is a literal bar inside a cell."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def table(header: list[str]) -> list[list[str]]:
    """The rows of the one table of docs/results.md with this header."""
    lines = RESULTS.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("|") and cells(line) == header]
    assert len(starts) == 1, f"docs/results.md has {len(starts)} tables headed {header}"
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    assert rows and all(len(r) == len(header) for r in rows), rows
    return rows


@pytest.fixture(scope="module")
def claims():
    return read_claims()


def test_the_markdown_rows_are_read_with_escaped_bars():
    assert cells(r"| a | mean \|H - I\|_F 0.39 | b |") == ["a", "mean |H - I|_F 0.39", "b"]


def test_the_claims_table_is_the_bundled_seeds(claims):
    docs = table(CLAIMS_HEADER)
    ours = [[r[k] for k in ("claim", "source", "paper", "ours", "verdict")] for r in claims.rows]
    assert [r[0] for r in docs] == [r[0] for r in ours], "the claims, in order"
    for shown, measured in zip(docs, ours, strict=True):
        for column, a, b in zip(CLAIMS_HEADER, shown, measured, strict=True):
            assert a == b, f"{shown[0]!r}, {column}: docs/results.md says {a!r}, depthscope claims {b!r}"


def test_the_steps_and_costs_table_is_the_bundled_seeds(claims):
    docs = table(COSTS_HEADER)
    ratio = {r["variant"]: r["ratio"] for r in claims.speedups}
    assert [r["variant"] for r in claims.costs] == list(ratio), "the two tables' variants, in order"
    ours = [
        [c["variant"], ratio[c["variant"]], c["params"], c["flops"], c["time"], c["gain"]]
        for c in claims.costs
    ]
    assert [r[0] for r in docs] == [r[0] for r in ours], "the variants, in order"
    for shown, measured in zip(docs, ours, strict=True):
        for column, a, b in zip(COSTS_HEADER, shown, measured, strict=True):
            assert a == b, f"{shown[0]}, {column}: docs/results.md says {a!r}, depthscope claims {b!r}"
