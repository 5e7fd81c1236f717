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


def test_the_settings_table_shows_what_the_traces_were_captured_with():
    """Not the report's defaults: each trace's own attrs, one value where all agree, else per model."""
    import xarray as xr

    a = xr.Dataset(attrs={"label": "a", "tokens": 2046, "ctx": 16, "seed": 0})
    b = xr.Dataset(attrs={"label": "b", "tokens": 512, "ctx": 16, "seed": 0})
    table = ReportSettings(capture=CaptureSettings(n_tokens=8192), k=3).table([a, b])
    assert table["tokens"] == "2046: a; 512: b" and table["ctx"] == 16 and table["seed"] == 0
    assert table["k"] == 3 and table["trajectories"] == "none" and table["logits"] == "off"
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


def test_runs_of_one_scheme_at_two_depths_get_their_own_figures_and_headings(tmp_path):
    """The bundled 8- and 16-block trajectories of two schemes, given alone: a report whose runs are
    named by depth and steps, each figure drawn from its own run (the 8-block one stopped
    overwriting the 16-block one), each section headed by its run, and the last steps as models."""
    import hashlib
    import re

    from depthscope import zoo
    from depthscope.cli import main
    from depthscope.trace import load_trace

    inputs = [zoo.ZOO_DIR / d / "trajectories" / f"{n}.nc" for d in ("", "deep") for n in ("standard", "hc")]
    out = tmp_path / "rep"
    assert main(["report", *map(str, inputs), "--out", str(out), "--quiet"]) == 0
    html = (out / "index.html").read_text()
    runs = {
        "standard-8blocks-steps250-4000": "standard, 8 blocks, steps 250-4000",
        "hc-8blocks-steps250-4000": "hc, 8 blocks, steps 250-4000",
        "standard-16blocks-steps125-2000": "standard, 16 blocks, steps 125-2000",
        "hc-16blocks-steps125-2000": "hc, 16 blocks, steps 125-2000",
    }
    digests = set()
    for name, heading in runs.items():
        section = re.search(rf'<section id="run-{name}"><h3>(.*?)</h3>(.*?)</section>', html, re.S)
        assert section and section.group(1) == heading, name
        assert f"trajectory-{name}.png" in section.group(2)  # the figure beside its own table
        for kind in ("trajectory", "trajectory-weights"):
            digests.add(hashlib.sha256((out / f"{kind}-{name}.png").read_bytes()).hexdigest())
        steps = list(load_trace(out / f"trajectory-{name}.nc")["step"].values)
        assert steps == ([250, 500, 1000, 2000, 4000] if "8blocks" in name else [125, 250, 500, 1000, 2000])
    assert len(digests) == 8  # eight different drawings
    # trajectories alone: each run's last step is its model, in the overview and a section each
    models = list(load_trace(out / "traces.nc")["model"].values)
    assert len(models) == 4 and all(m.endswith(("@4000", "@2000")) for m in models), models
    assert "versus-depth" in html
