"""Third-party models saved with torch.save as {"family", "args", "state_dict"}: loaded with
weights_only=True (never code), captured from the CLI like any checkpoint; hostile files refused."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from depthscope.cli import main
from depthscope.probes import capture
from depthscope.probes.load import load_model
from depthscope.trace import load_trace


def dca_args():
    return dict(num_tokens=256, dim=32, depth=2, past_layers_k=1, dim_head=16, heads=2)


def attn_res_args():
    return dict(
        vocab_size=256,
        d_model=32,
        n_layers=4,
        n_heads=2,
        n_kv_heads=1,
        max_seq_len=64,
        attn_res_mode="block",
        n_blocks=2,
    )


def x_transformers_args():
    layers = dict(dim=32, depth=2, heads=2, attn_dim_head=16, num_residual_streams=4)
    return dict(wrapper=dict(num_tokens=256, max_seq_len=64), layers=layers)


CASES = {
    "deep-cross-attention": dca_args,
    "attn-res": attn_res_args,
    "x-transformers": x_transformers_args,
}


@pytest.mark.parametrize("family", list(CASES))
def test_a_saved_model_loads_and_captures_like_the_live_one(family, tmp_path, capsys):
    from depthscope.probes.adapters import FAMILIES

    torch.manual_seed(0)
    live = FAMILIES[family].from_saved(CASES[family]()).eval()
    path = tmp_path / "model.pt"
    torch.save({"family": family, "args": CASES[family](), "state_dict": live.state_dict()}, path)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    a = capture(live, tokens, skip_positions=0)
    b = capture(load_model(path), tokens, skip_positions=0)
    for name in ("mixing", "contribution_share"):
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7)
    out = tmp_path / "t.nc"  # the CLI reads text as bytes (vocabulary 256, no tokenizer)
    assert main(["capture", str(path), "--out", str(out), "--tokens", "256", "--ctx", "32", "--quiet"]) == 0
    assert load_trace(out).attrs["family"] == family


class Payload:
    """Unpickling this would create a file: weights_only must refuse it before."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def test_a_pickle_that_runs_code_is_refused_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"family": "deep-cross-attention", "args": Payload(str(marker)), "state_dict": {}}, path)
    assert main(["capture", str(path), "--out", str(tmp_path / "t.nc"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refused" in err
    assert not marker.exists() and not (tmp_path / "t.nc").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        ([1, 2, 3], "expected a dict"),
        ({"family": "hyper-connections", "args": {}, "state_dict": {}}, "cannot be built from a file"),
        ({"family": ["x"], "args": {}, "state_dict": {}}, "cannot be built from a file"),
        ({"family": "deep-cross-attention", "args": [], "state_dict": {}}, "must be dicts"),
        ({"family": "deep-cross-attention", "args": {"nonsense": 1}, "state_dict": {}}, "cannot build"),
        (
            {"family": "deep-cross-attention", "args": dca_args(), "state_dict": {"w": torch.zeros(2)}},
            "describe other tensors than it holds",
        ),
    ],
)
def test_bad_torch_files(tmp_path, capsys, content, message):
    path = tmp_path / "m.pt"
    torch.save(content, path)
    assert main(["capture", str(path), "--out", str(tmp_path / "t.nc"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_truncated_torch_file(tmp_path, capsys):
    path = tmp_path / "m.pt"
    torch.save({"family": "deep-cross-attention", "args": dca_args(), "state_dict": {}}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert main(["capture", str(path), "--out", str(tmp_path / "t.nc"), "--quiet"]) == 2
    assert "error:" in capsys.readouterr().err
