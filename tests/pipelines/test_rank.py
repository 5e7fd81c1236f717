"""Rank measurement and the width sweep (pipelines.rank)."""

from __future__ import annotations

import numpy as np
import pytest

from depthscope.analysis.rank import rank_summary
from depthscope.errors import ConfigError
from depthscope.pipelines.rank import measure, rank_sweep
from depthscope.probes import capture
from depthscope.probes.settings import CaptureSettings
from depthscope.trace import save_trace
from tests.helpers import build, tiny


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    model = build(tiny("dca"))
    model.training_summary = {"steps": 0}
    return model.save(tmp_path_factory.mktemp("ckpt") / "m.safetensors")


def test_measure_a_checkpoint_equals_the_summary_of_its_capture(ckpt):
    settings = CaptureSettings(n_tokens=256, ctx=32)
    [got] = measure(ckpt, settings, energy=0.9, kappa=0.5)
    from depthscope import load

    want = rank_summary(capture(load(ckpt), None, settings.replace(rank=True)), 0.9, 0.5, "v1")
    assert got["collective_rank"] == want["collective_rank"] and got["threshold"] == want["threshold"]
    assert got["d"] == 16 and 0 < got["ratio"]["numerical"]


def test_measure_a_trace_and_refuse_one_without_spectra(ckpt, tmp_path):
    from depthscope import load

    model = load(ckpt)
    with_rank = save_trace(capture(model, n_tokens=128, ctx=32, rank=True), tmp_path / "r.nc")
    without = save_trace(capture(model, n_tokens=128, ctx=32), tmp_path / "n.nc")
    [res] = measure(with_rank, CaptureSettings())
    assert res["n_layers_counted"] == 6  # every sublayer output of 3 blocks
    with pytest.raises(ConfigError, match="capture it with --rank"):
        measure(without, CaptureSettings())


def test_rank_sweep_trains_and_measures_each_width():
    table = rank_sweep([32], ("standard",), n_layers=1, steps=2, tokens=128, progress=False)
    assert dict(table["collective_rank"].sizes) == {"scheme": 1, "width": 1, "rank_kind": 3}
    ratio = table["collective_rank_ratio"].sel(scheme="standard", width=32)
    np.testing.assert_allclose(ratio, table["collective_rank"].sel(scheme="standard", width=32) / 32)
    assert float(table["val_loss"].sel(scheme="standard", width=32)) > 0
