"""Every number a user sees is kept: captures equal the reference traces written by the engine of
d49192e (tests/fixtures/reference/make.py), to float32 rounding since the batched engine (its
products are formed in another order; in float64 it equals a dense oracle to 1e-10:
tests/probes/test_oracle.py). The coordinates, attrs and variables are the same, apart
from the version attribute, the block coordinates added since, the attrs the generic transformers
reader records (which layout read the model, its static weights), the tokenization attribute, the
even batches' spectrum kept for the rank convergence check, and the logit lens, now asked for on its
own (``lens=True``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from depthscope.probes import capture
from depthscope.trace import load_trace
from tests.fixtures.reference.models import CASES

pytestmark = pytest.mark.golden  # run again under ATEN_CPU_CAPABILITY=default by make test

HERE = Path(__file__).parent / "fixtures" / "reference"
ADDED_COORDS = ("layer_block", "source_block")
ADDED_ATTRS = ("layout", "static_weights", "tokenization")
ADDED_VARS = ("source_spectrum_half",)
ERRORS = ("residual_error", "logit_error")  # rounding errors themselves: compared in absolute terms


def comparable(trace: xr.Dataset) -> xr.Dataset:
    trace = trace.drop_vars([c for c in ADDED_COORDS if c in trace.coords])
    trace = trace.drop_vars([v for v in ADDED_VARS if v in trace.data_vars])
    attrs = {k: v for k, v in trace.attrs.items() if k not in ADDED_ATTRS}
    return trace.drop_attrs(deep=False).assign_attrs({**attrs, "depthscope_version": ""})


def assert_same_numbers(now: xr.Dataset, ref: xr.Dataset) -> None:
    assert set(now.data_vars) == set(ref.data_vars)
    coords = lambda t: t.drop_vars(list(t.data_vars)).assign_attrs({})  # noqa: E731
    xr.testing.assert_identical(coords(now).drop_attrs(deep=False), coords(ref).drop_attrs(deep=False))
    assert set(now.attrs) == set(ref.attrs)
    for key, value in ref.attrs.items():
        # the loss: a float64 sum of float32 log-probabilities, each rounded to ~6e-8 relative by
        # kernels that differ between CPUs (7e-8 apart on an AVX2 EPYC): float32's bound, 1e-6
        assert now.attrs[key] == (pytest.approx(value, rel=1e-6) if isinstance(value, float) else value), key
    for name in ref.data_vars:
        a, b = now[name], ref[name]
        assert a.dims == b.dims and a.attrs == b.attrs, name
        if name in ERRORS:
            assert float(a.max()) <= 1e-5 and float(b.max()) <= 1e-5
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=name)
            continue
        scale = float(np.nanmax(np.abs(b.values))) if np.isfinite(b.values).any() else 1.0
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale, err_msg=name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_capture_equals_the_reference_trace(name):
    make, data, options = CASES[name]
    now = capture(make(), data(), **options, lens=bool(options.get("logits")))
    ref = load_trace(HERE / f"{name}.nc")
    assert_same_numbers(comparable(now), comparable(ref))


def test_the_kernels_are_those_the_run_asked_for():
    """``make test`` runs the golden tests a second time with PyTorch's non-vectorised kernels, as
    another CPU rounds: that run must really use them."""
    import os

    import torch

    used = torch.backends.cpu.get_cpu_capability()
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        assert used == "DEFAULT"
    else:  # whatever this CPU has
        assert used in {"DEFAULT", "AVX2", "AVX512", "SVE256", "NEON", "VSX", "ZVECTOR"}, used
