"""Versus depth: the table picks equal steps per scheme group, and its numbers are the estimators'."""

from __future__ import annotations

import numpy as np
import pytest

from depthscope.analysis.depth import comparable, depth_table, n_layers, several_depths
from depthscope.analysis.dilution import summary
from depthscope.probes import capture
from tests.helpers import build, perturb, tiny


def model(scheme: str, layers: int, step: int, loss: float, group: str | None = None):
    t = capture(perturb(build(tiny(scheme, n_layers=layers)), others=0.05), n_tokens=64, ctx=32)
    t.attrs.update(step=step, val_loss=loss)
    if group:
        t.attrs["zoo_group"] = group
    return t


@pytest.fixture(scope="module")
def traces():
    return [
        model("standard", 1, 100, 2.0),
        model("standard", 2, 100, 1.9),
        model("standard", 2, 200, 1.8),  # only the deeper run got here: not compared
        model("attnres", 1, 100, 1.7),
        model("attnres", 2, 100, 1.5),
        model("dca", 1, 100, 1.6),  # one depth only: left out
    ]


def test_models_are_compared_at_the_step_every_depth_reached(traces):
    picked = comparable(traces)
    assert set(picked) == {("standard", 1), ("standard", 2), ("attnres", 1), ("attnres", 2)}
    assert all(t.attrs["step"] == 100 for t in picked.values())
    assert several_depths(traces) and not several_depths(traces[-1:])
    assert [n_layers(t) for t in traces] == [1, 2, 2, 1, 2, 1]


def test_the_table_holds_the_estimators_numbers(traces):
    table = depth_table(traces, k=1)
    assert list(table["group"].values) == ["standard", "attnres"] and list(table["n_layers"].values) == [1, 2]
    t = comparable(traces)["attnres", 2]
    s = summary(t, 1)
    np.testing.assert_allclose(
        table["pattern_score"].sel(group="attnres", n_layers=2),
        s["pattern_score"].sel(group=list(table.kind.values)),
    )
    share = float(t["contribution_share"].sel(layer="readout", source="embed"))
    assert float(table["retention"].sel(group="attnres", n_layers=2, source="embed")) == pytest.approx(share)
    assert float(table["baseline"].sel(n_layers=2)) == pytest.approx(1 / 5)  # embed + 2 blocks x 2 sublayers
    np.testing.assert_allclose(table["loss_gain"].sel(group="attnres"), [2.0 - 1.7, 1.9 - 1.5])
    np.testing.assert_allclose(table["loss_gain"].sel(group="standard"), [0.0, 0.0])
    assert np.isnan(table["view_lag"].sel(group="attnres")).all()


def test_groups_pair_renamed_variants():
    a = model("attnres", 1, 10, 1.0, group="attnres-block")
    b = model("attnres", 2, 10, 1.0, group="attnres-block")
    assert list(depth_table([a, b])["group"].values) == ["attnres-block"]
