"""Every number a user sees is kept: captures equal the reference traces written by the engine of
d49192e (tests/fixtures/reference/make.py), apart from the version attribute and the coordinates
added since (the blocks of each row and column)."""

from __future__ import annotations

from pathlib import Path

import pytest
import xarray as xr

from depthscope.probes import capture
from depthscope.trace import load_trace
from tests.fixtures.reference.models import CASES

HERE = Path(__file__).parent / "fixtures" / "reference"
ADDED_COORDS = ("layer_block", "source_block")


def comparable(trace: xr.Dataset) -> xr.Dataset:
    trace = trace.drop_vars([c for c in ADDED_COORDS if c in trace.coords])
    return trace.assign_attrs(depthscope_version="")


@pytest.mark.parametrize("name", sorted(CASES))
def test_capture_equals_the_reference_trace(name):
    make, data, options = CASES[name]
    now = capture(make(), data(), **options)
    ref = load_trace(HERE / f"{name}.nc")
    xr.testing.assert_identical(comparable(now), comparable(ref))
