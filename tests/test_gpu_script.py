"""The GPU script (``benchmarks/gpu.py``): skips cleanly without a CUDA device, and its whole run
works, checked here on the CPU with the same code (what it will run on a GPU the day one is lent)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SPEC = importlib.util.spec_from_file_location(
    "gpu_script", Path(__file__).parents[1] / "benchmarks" / "gpu.py"
)
gpu = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu)


def test_without_a_cuda_device_it_says_so_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on CI, whatever this machine has
    out = tmp_path / "gpu.json"
    assert gpu.main(["--json", str(out)]) == 0
    assert capsys.readouterr().out.startswith("skipped: no CUDA device")
    assert not out.exists()


def test_the_whole_run_on_the_cpu_is_exact_and_recorded(tmp_path):
    out = tmp_path / "gpu.json"
    argv = [
        "--device",
        "cpu",
        "--tokens",
        "256",
        "--smollm2-tokens",
        "256",
        "--layers",
        "2",
        "--d-model",
        "32",
    ]
    argv += ["--ctx", "64", "--variant", "standard", "--variant", "mhc", "--json", str(out)]
    assert gpu.main(argv) == 0
    rec = json.loads(out.read_text())
    cost = [r for r in rec["rows"] if r["table"] == "cost"]
    assert [r["variant"] for r in cost] == ["standard", "mhc"]
    for r in cost:
        assert r["max_residual_error"] <= 1e-4
        assert r["time_ratio"] == pytest.approx(r["capture_seconds"] / r["forward_seconds"], rel=1e-12)
        ratios = sorted(x["capture_seconds"] / x["forward_seconds"] for x in r["runs"])
        assert len(ratios) == 3 and ratios[1] == pytest.approx(r["time_ratio"], rel=1e-12)  # the median
    runs = {(r["device"], r["dtype"]): r for r in rec["rows"] if r["table"] == "smollm2"}
    assert set(runs) == {("cpu (reference)", "float32"), ("cpu", "float32"), ("cpu", "bfloat16")}
    assert runs["cpu", "float32"]["max_share_difference_from_cpu"] <= 1e-6  # the same computation
    assert runs["cpu", "bfloat16"]["max_residual_error"] <= 5e-2  # the bfloat16 capture's own check
    assert 0 < runs["cpu", "bfloat16"]["max_share_difference_from_cpu"] < 0.05
    for r in (runs["cpu", "float32"], runs["cpu", "bfloat16"]):
        assert r["time_ratio"] == pytest.approx(r["seconds"] / r["forward_seconds"], rel=1e-12)
