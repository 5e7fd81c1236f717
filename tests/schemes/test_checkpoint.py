"""Checkpoint format: round trip, 16-bit storage, and one clear error per kind of bad file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from depthscope import load
from depthscope.errors import CheckpointError
from depthscope.schemes.checkpoint import META_KEY, read_meta
from tests.helpers import build, random_tokens, tiny


@pytest.fixture
def saved(tmp_path):
    model = build(tiny("attnres"))
    model.training_summary = {"steps": 5, "val_loss": 4.2}
    return model, model.save(tmp_path / "m.safetensors")


def test_metadata_holds_config_and_training(saved):
    model, path = saved
    meta = read_meta(path)
    assert meta["format"] == 1
    assert meta["model"] == model.cfg.to_dict()
    assert meta["training"] == {"steps": 5, "val_loss": 4.2}
    assert load(path).training_summary == {"steps": 5, "val_loss": 4.2}


def test_bfloat16_storage_loads_close(tmp_path, saved):
    model, _ = saved
    path = model.save(tmp_path / "half.safetensors", dtype=torch.bfloat16)
    assert path.stat().st_size < 0.6 * (tmp_path / "m.safetensors").stat().st_size
    tokens = random_tokens(model.cfg)
    loaded = load(path)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0.05, atol=0.05)


def _rewrite(path, tensors=None, meta=None):
    tensors = load_file(str(path)) if tensors is None else tensors
    save_file(tensors, str(path), metadata=meta)
    return path


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _meta(path):
    return {META_KEY: json.dumps(read_meta(path))}


def _edit_meta(path, fn):
    meta = read_meta(path)
    fn(meta)
    return _rewrite(path, meta={META_KEY: json.dumps(meta)})


BAD = {
    "missing file": (lambda p: p.with_name("nope.safetensors"), "no such file"),
    "not safetensors": (
        lambda p: _write(p, b"hello, this is text, not tensors" * 4),
        "not a safetensors file",
    ),
    "tiny file": (lambda p: _write(p, b"abc"), "not a safetensors file"),
    "truncated": (lambda p: _write(p, p.read_bytes()[:-1000]), "truncated"),
    "no config": (lambda p: _rewrite(p, meta={"other": "x"}), "no depthscope_config"),
    "invalid json": (lambda p: _rewrite(p, meta={META_KEY: "{not json"}), "invalid depthscope_config JSON"),
    "no model config": (lambda p: _rewrite(p, meta={META_KEY: json.dumps({"format": 1})}), "no model config"),
    "other format": (lambda p: _edit_meta(p, lambda m: m.update(format=99)), "format 99"),
    "unknown scheme": (
        lambda p: _edit_meta(p, lambda m: m["model"].update(scheme="resnext")),
        "unknown scheme 'resnext'",
    ),
    "bad option": (
        lambda p: _edit_meta(p, lambda m: m["model"]["options"].update(colour="red")),
        "unknown option",
    ),
    "missing tensor": (
        lambda p: _rewrite(
            p, {k: v for k, v in load_file(str(p)).items() if k != "unembed.weight"}, _meta(p)
        ),
        "missing tensors: unembed.weight",
    ),
    "wrong shape": (
        lambda p: _rewrite(p, {**load_file(str(p)), "unembed.weight": torch.zeros(3, 3)}, _meta(p)),
        r"unembed.weight has shape \(3, 3\)",
    ),
    "nan weights": (
        lambda p: _rewrite(
            p, {**load_file(str(p)), "embed.weight": torch.full((256, 16), float("nan"))}, _meta(p)
        ),
        "embed.weight holds NaN or Inf",
    ),
    "inf weights": (
        lambda p: _rewrite(
            p, {**load_file(str(p)), "blocks.0.attn_mix.query": torch.full((16,), float("inf"))}, _meta(p)
        ),
        "attn_mix.query holds NaN or Inf",
    ),
    "unexpected tensor": (
        lambda p: _rewrite(p, {**load_file(str(p)), "extra.weight": torch.zeros(2)}, _meta(p)),
        "unexpected tensors: extra.weight",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_checkpoint_names_file_and_problem(saved, case):
    _, path = saved
    make, message = BAD[case]
    bad = make(path)
    with pytest.raises(CheckpointError, match=message) as info:
        load(bad)
    assert str(bad) in str(info.value)
    assert "\n" not in str(info.value)
