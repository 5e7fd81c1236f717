"""Running at scale: sharded captures equal one process, partial states resume after SIGKILL,
models placed by device map and computed in bfloat16."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from depthscope.cli import main
from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.capture import Run
from depthscope.probes.load import Placement, load_model
from depthscope.probes.partial import partial_path
from depthscope.probes.settings import CaptureSettings
from depthscope.trace import load_trace
from tests.helpers import build, perturb, tiny
from tests.probes.test_huggingface import llama_dir  # noqa: F401 (a fixture)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RTOL = 1e-12


def assert_same_trace(a, b, rtol=RTOL, ignore=("world_size",)):
    """Every variable equal to ``rtol`` (relative to each element, plus ``rtol`` of the variable's
    largest magnitude for elements near zero), same NaN pattern, same attrs except ``ignore``."""
    assert sorted(a.data_vars) == sorted(b.data_vars)
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        assert x.shape == y.shape, name
        assert np.array_equal(np.isnan(x), np.isnan(y)), name
        scale = np.nanmax(np.abs(x)) if np.isfinite(x).any() else 0.0
        np.testing.assert_allclose(y, x, rtol=rtol, atol=rtol * scale, equal_nan=True, err_msg=name)
    keys = (set(a.attrs) | set(b.attrs)) - set(ignore)
    floats = {k for k in keys if isinstance(a.attrs.get(k), (float, np.floating))}
    assert {k: a.attrs.get(k) for k in keys - floats} == {k: b.attrs.get(k) for k in keys - floats}
    for k in floats:  # sums turned into attrs (the clean loss)
        assert b.attrs[k] == pytest.approx(a.attrs[k], rel=rtol), k


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny DCA checkpoint moved off its initialisation: per-token q/k/v weights that vary."""
    path = tmp_path_factory.mktemp("scale") / "dca.safetensors"
    return perturb(build(tiny("dca")), 0.5).save(path)


def cli(*args) -> list[str]:
    return ["capture", *map(str, args), "--quiet"]


def test_merged_states_equal_one_pass(ckpt):
    """The merge itself, in one process: a run over batches 0..3 equals runs over {0, 2} and {1, 3}
    merged (sums, weight means and spreads, covariances, logit and ablation sums)."""
    model = load_model(ckpt)
    from depthscope.probes.adapters import resolve

    ad = resolve(model)
    chunks = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(3)).split(2)
    runs = [Run(ad, CaptureSettings(rank=True, logits=True, ablate="cells"), 0, 32) for _ in range(3)]
    with torch.no_grad():
        for b, chunk in enumerate(chunks):
            runs[0].batch(model, chunk, b)
            runs[1 + b % 2].batch(model, chunk, b)
    merged = Run(ad, CaptureSettings(rank=True, logits=True, ablate="cells"), 0, 32)
    merged.merge(runs[1].state())
    merged.merge(runs[2].state())
    assert_same_trace(runs[0].dataset({}), merged.dataset({}))
    assert merged.acc.tokens == runs[0].acc.tokens == 8 * 32


def test_two_workers_equal_one_process(ckpt, tmp_path):
    """`--workers 2`: two gloo processes, rank r taking batches b % 2 == r, rank 0 merging in rank
    order, equal one process to 1e-12 (spectra, logit attribution and cell ablations included)."""
    common = ["--tokens", "512", "--batch-size", "2", "--rank", "--logits", "--ablate", "cells"]
    assert main(cli(ckpt, "--out", tmp_path / "one.nc", *common)) == 0
    assert main(cli(ckpt, "--out", tmp_path / "two.nc", *common, "--workers", "2")) == 0
    one, two = load_trace(tmp_path / "one.nc"), load_trace(tmp_path / "two.nc")
    assert one.attrs["world_size"] == 1 and two.attrs["world_size"] == 2
    assert one.attrs["tokens"] == two.attrs["tokens"] == 512
    assert_same_trace(one, two)
    assert not list(tmp_path.glob("*.partial*"))


def test_torchrun_on_a_hugging_face_model(llama_dir, tmp_path):  # noqa: F811
    """torchrun with 2 ranks on a Hugging Face Llama directory (text through its tokenizer): only rank
    0 writes, and the trace equals the single-process one to 1e-12."""
    args = ["--tokens", "384", "--batch-size", "2", "--ctx", "32", "--logits"]
    assert main(cli(llama_dir, "--out", tmp_path / "one.nc", *args)) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "depthscope", *cli(llama_dir, "--out", tmp_path / "two.nc", *args)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    # the ranks' own lines come first, torchrun's summary of a failure after them
    assert done.returncode == 0, done.stderr[:1500] + "\n...\n" + done.stderr[-1000:]
    assert done.stdout.count("wrote ") == 1 and "2 ranks" in done.stdout
    assert_same_trace(load_trace(tmp_path / "one.nc"), load_trace(tmp_path / "two.nc"))


def test_a_failing_rank_stops_every_rank(ckpt, tmp_path, capsys):
    """A bad setting fails on every rank; the parent prints one line and exits 2, nothing written."""
    code = main(cli(ckpt, "--out", tmp_path / "t.nc", "--tokens", "64", "--ctx", "999", "--workers", "2"))
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "window length" in err
    assert not (tmp_path / "t.nc").exists()


def test_resume_after_sigkill_equals_an_uninterrupted_capture(ckpt, tmp_path):
    out = tmp_path / "t.nc"
    args = ["--tokens", "2048", "--batch-size", "1", "--rank", "--logits", "--checkpoint-every", "3"]
    cmd = [sys.executable, "-m", "depthscope", *cli(ckpt, "--out", out, *args)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    partial = partial_path(out)
    deadline = time.time() + 300
    while not partial.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the capture finished before it could be killed"
    assert partial.exists() and not out.exists()
    with np.load(partial) as f:
        meta = json.loads(str(f["meta"]))
    done = meta["batches_done"]
    assert 3 <= done < 64 and meta["windows_done"] == done  # one window per batch here
    assert main(cli(ckpt, "--out", out, *args)) == 2  # a partial exists: --resume or delete it
    assert main(cli(ckpt, "--out", out, *args, "--resume")) == 0
    assert not partial.exists()
    assert main(cli(ckpt, "--out", tmp_path / "whole.nc", *args)) == 0
    assert_same_trace(load_trace(tmp_path / "whole.nc"), load_trace(out))


@pytest.mark.parametrize(
    "change, what",
    [
        (["--seed", "1"], "another corpus"),
        (["--batch-size", "4"], "batch_size"),
        (["--skip-positions", "1"], "skip_positions"),
        (["--rank"], "rank"),
        (["MODEL"], "another model"),
    ],
)
def test_resume_refuses_a_partial_of_other_inputs(ckpt, tmp_path, capsys, change, what):
    out = tmp_path / "t.nc"
    model = load_model(ckpt)
    capture(model, n_tokens=256, batch_size=2, partial=partial_path(out), save_every=1, seed=0)
    assert partial_path(out).exists()
    target = ckpt
    if change == ["MODEL"]:
        target, change = tmp_path / "other.safetensors", []
        perturb(build(tiny("dca")), 0.6).save(target)
    capsys.readouterr()
    args = ["--tokens", "256", "--batch-size", "2", "--resume", *change]
    assert main(cli(target, "--out", out, *args)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and what in err, err
    assert not out.exists() and partial_path(out).exists()  # the partial state is kept


def test_a_corrupt_partial_state_is_refused(ckpt, tmp_path, capsys):
    out = tmp_path / "t.nc"
    partial_path(out).write_bytes(b"PK\x03\x04 not really a zip")
    assert main(cli(ckpt, "--out", out, "--tokens", "128", "--resume")) == 2
    assert "not a readable partial capture" in capsys.readouterr().err


def test_device_map_with_disk_offload_equals_a_plain_load(llama_dir, tmp_path):  # noqa: F811
    """accelerate places layers 0-1 in CPU memory and layers 2 on disk (loaded on the fly by its
    hooks); the hooks still see every tensor and the trace equals the plain load's."""
    tokens = torch.randint(5, 99, (4, 24), generator=torch.Generator().manual_seed(0))
    plain = capture(load_model(llama_dir), tokens, batch_size=2, logits=True)
    mapping = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu"}
    mapping |= {"model.layers.2": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    placed = Placement(device_map=json.dumps(mapping), offload_folder=str(tmp_path / "offload"))
    model = load_model(llama_dir, placed)
    assert model.hf_device_map["model.layers.2"] == "disk"
    assert model.model.layers[2].mlp.down_proj.weight.device.type == "meta"  # really offloaded
    mapped = capture(model, tokens, batch_size=2, logits=True)
    assert_same_trace(plain, mapped, rtol=1e-6, ignore=())


def test_device_map_from_the_cli(llama_dir, tmp_path):  # noqa: F811
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"": "cpu"}))
    assert main(cli(llama_dir, "--out", tmp_path / "t.nc", "--tokens", "128", "--device-map", mapping)) == 0
    assert load_trace(tmp_path / "t.nc").attrs["dtype"] == "float32"


def test_bfloat16_statistics_stay_float64(llama_dir):  # noqa: F811
    """A model computing in bfloat16: sums of its terms are formed in float32 and float64, rebuilt
    within the bfloat16 tolerance, and the shares agree with the float32 model's to bfloat16 accuracy."""
    tokens = torch.randint(5, 99, (4, 24), generator=torch.Generator().manual_seed(0))
    full = capture(load_model(llama_dir), tokens, batch_size=2, logits=True)
    half = capture(load_model(llama_dir, Placement(dtype="bfloat16")), tokens, batch_size=2, logits=True)
    assert half.attrs["dtype"] == "bfloat16" and full.attrs["dtype"] == "float32"
    assert half["contribution_share"].dtype == np.float64
    assert 0 < float(half["residual_error"].max()) <= 5e-2
    assert float(full["residual_error"].max()) <= 1e-5
    diff = abs(half["contribution_share"] - full["contribution_share"]).max()
    assert float(diff) < 0.05
    np.testing.assert_allclose(half["contribution_share"].sum("source"), 1.0, atol=1e-9)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "nonsense"], "not a torch device"),
        (["--device-map", "{not json"], "--device-map must be"),
        (["--device-map", "[1, 2]"], "--device-map must map"),
        (["--device", "cpu", "--device-map", "auto"], "not both"),
        (["--dtype", "int8"], "int8"),
    ],
)
def test_bad_placements(llama_dir, tmp_path, capsys, args, message):  # noqa: F811
    assert main(cli(llama_dir, "--out", tmp_path / "t.nc", "--tokens", "64", *args)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_depthscope_checkpoint_on_a_device_and_dtype(ckpt, tmp_path):
    assert main(cli(ckpt, "--out", tmp_path / "t.nc", "--tokens", "128", "--device", "cpu")) == 0
    assert main(cli(ckpt, "--out", tmp_path / "m.nc", "--tokens", "128", "--device-map", "auto")) == 2
    assert Path(tmp_path / "t.nc").is_file() and not (tmp_path / "m.nc").exists()


def test_save_every_needs_a_path(ckpt):
    with pytest.raises(DepthscopeError, match="needs its path"):
        capture(load_model(ckpt), n_tokens=64, save_every=2)
