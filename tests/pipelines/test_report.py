"""The report pipeline (pipelines.report): which views each model gets, what counts as a trajectory."""

from __future__ import annotations

import pytest

from depthscope.errors import DepthscopeError
from depthscope.pipelines.report import ReportSettings, collect, is_trajectory
from depthscope.probes import capture
from depthscope.probes.settings import CaptureSettings
from depthscope.trace import save_trace, stack_traces
from tests.helpers import build, tiny


def test_causal_views_follow_the_model_kind():
    s = ReportSettings()
    own, foreign = s.for_model(True), s.for_model(False)
    assert own.rank and own.logits and own.ablate == "cells" and own.ablate_tokens == 512
    assert foreign.rank and not foreign.logits and foreign.ablate is None
    assert not ReportSettings(logits="off", ablate="off").for_model(True).causal
    on = ReportSettings(logits="on", ablate="sources").for_model(False)
    assert on.logits and on.ablate == "sources"
    assert own.n_tokens == foreign.n_tokens == 8192  # the report's capture defaults


def test_the_settings_table_is_flat():
    table = ReportSettings(capture=CaptureSettings(n_tokens=100, ctx=16), k=3).table()
    assert table["tokens"] == 100 and table["ctx"] == 16 and table["k"] == 3
    assert all(not isinstance(v, (dict, CaptureSettings)) for v in table.values())


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """Three checkpoints of one run (same config and training settings, steps 1, 2, 3)."""
    d = tmp_path_factory.mktemp("run")
    model = build(tiny("attnres", n_layers=1))
    paths = []
    for step in (3, 1, 2):
        model.training_summary = {"step": step, "steps": 3, "seed": 0, "lr": 1e-3}
        paths.append(model.save(d / f"m.step-{step}.safetensors"))
    return paths


def test_checkpoints_of_one_run_become_a_trajectory_in_step_order(steps):
    settings = ReportSettings(capture=CaptureSettings(n_tokens=64, ctx=32), logits="off", ablate="off")
    traces, trajectories = collect(steps, settings, progress=False)
    assert [t.attrs["label"] for t in traces] == ["attnres@3", "attnres@1", "attnres@2"]
    [tr] = trajectories
    assert list(tr["step"].values) == [1, 2, 3] and is_trajectory(tr)
    assert all("collective_rank" in t for t in traces)  # the report always measures rank


def test_given_steps_must_match_the_checkpoints(steps):
    with pytest.raises(DepthscopeError, match="--steps gives 2 steps for 3 checkpoints"):
        collect(steps, ReportSettings(), [1, 2], progress=False)


def test_a_stack_of_other_models_is_not_a_trajectory(tmp_path):
    a = capture(build(tiny("standard", n_layers=1)), n_tokens=64, ctx=32)
    b = capture(build(tiny("attnres", n_layers=1)), n_tokens=64, ctx=32)
    stacked = stack_traces([a, b])
    assert not is_trajectory(stacked) and not is_trajectory(a)
    traces, trajectories = collect([save_trace(stacked, tmp_path / "s.nc")], ReportSettings(), progress=False)
    assert [t.attrs["label"] for t in traces] == ["standard", "attnres"] and trajectories == []
