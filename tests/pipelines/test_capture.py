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
