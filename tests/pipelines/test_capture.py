"""The capture job (pipelines.capture): what `depthscope capture` runs, without the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from depthscope.errors import DepthscopeError
from depthscope.pipelines.capture import CaptureJob, capture_here, run_capture
from depthscope.probes import capture
from depthscope.probes.load import load_model
from depthscope.probes.partial import partial_path
from depthscope.probes.settings import CaptureSettings, Partial
from depthscope.trace import load_trace
from tests.helpers import build, tiny


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    model = build(tiny("attnres"))
    model.training_summary = {"steps": 0}
    return model.save(tmp_path_factory.mktemp("ckpt") / "m.safetensors")


SETTINGS = CaptureSettings(n_tokens=256, batch_size=2, ctx=32, rank=True)


def test_the_job_writes_what_capture_returns(ckpt, tmp_path):
    out = tmp_path / "t.nc"
    trace = run_capture(CaptureJob(str(ckpt), out, settings=SETTINGS, progress=False))
    direct = capture(load_model(ckpt), None, SETTINGS, checkpoint=str(ckpt))
    xr.testing.assert_identical(load_trace(out), trace)
    xr.testing.assert_identical(trace, direct)


def test_a_job_that_saves_partials_removes_them_when_done(ckpt, tmp_path):
    out = tmp_path / "t.nc"
    job = CaptureJob(str(ckpt), out, settings=SETTINGS.replace(partial=Partial(save_every=1)), progress=False)
    trace = capture_here(job)
    assert not partial_path(out).exists() and out.is_file()
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)


def test_a_leftover_partial_needs_resume(ckpt, tmp_path):
    out = tmp_path / "t.nc"
    partial_path(out).write_bytes(b"left over")
    job = CaptureJob(str(ckpt), out, settings=SETTINGS.replace(partial=Partial(save_every=1)), progress=False)
    with pytest.raises(DepthscopeError, match="add --resume"):
        capture_here(job)
    assert not out.exists()


def test_workers_must_be_positive(ckpt, tmp_path):
    with pytest.raises(DepthscopeError, match="--workers must be >= 1"):
        CaptureJob(str(ckpt), tmp_path / "t.nc", workers=0)


def test_every_capture_option_is_one_setting_with_one_default(monkeypatch):
    """`depthscope capture` has every capture option (``capture_options``), each with the default
    CaptureSettings gives it, and hands each given value to the setting of its name: the options
    are written once, in the command's signature, and become settings in one place."""
    import typer

    from depthscope import cli
    from depthscope.pipelines import capture as pipeline
    from depthscope.pipelines.capture import capture_options, capture_settings

    params = {p.name: p for p in typer.main.get_command(cli.app).commands["capture"].params}
    assert capture_options() <= set(params)
    defaults = capture_settings()
    flat = {
        "tokens": defaults.n_tokens,
        "checkpoint_every": defaults.partial.save_every,
        "resume": defaults.partial.resume,
        **{k: getattr(defaults.placement, k) for k in pipeline.PLACEMENT},
    }
    for name in capture_options():
        want = flat[name] if name in flat else getattr(defaults, name)
        assert params[name].default == want, name
    seen = {}

    def run(job):  # stands in for the capture: what it was asked, and no trace (as a rank > 0)
        seen["job"] = job

    monkeypatch.setattr(pipeline, "run_capture", run)
    argv = ["capture", "m.safetensors", "--out", "t.nc", "--tokens", "77", "--seed", "5", "--rank"]
    argv += ["--ablate", "cells", "--ablate-tokens", "9", "--dtype", "bfloat16", "--checkpoint-every", "3"]
    monkeypatch.setattr(cli, "_model_inputs", lambda models, *a: list(models))
    assert cli.main(argv) == 0
    got = seen["job"].settings
    assert (got.n_tokens, got.seed, got.rank, got.ablate, got.ablate_tokens) == (77, 5, True, "cells", 9)
    assert got.placement.dtype == "bfloat16" and got.partial.save_every == 3 and got.batch_size == 16
    with pytest.raises(TypeError, match="unknown options"):
        capture_settings(token=5)
