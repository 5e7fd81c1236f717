"""Shared fixtures: tiny models, fixed seeds, one torch thread per test process."""

from __future__ import annotations

import os

# One BLAS/OpenMP thread per test process: on 2 cores, library threads fight over the cores and
# make the numpy-heavy tests several times slower (set before numpy is imported).
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("DEPTHSCOPE_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
