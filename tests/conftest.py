"""Shared fixtures: tiny models, fixed seeds, one torch thread per test process."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("DEPTHSCOPE_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
