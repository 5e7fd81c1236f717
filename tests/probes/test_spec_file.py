"""A spec file for a checkpoint whose own code the installed transformers cannot load: ``depthscope
capture DIR --spec SPEC.py --trust-remote-code``, on a directory shaped like the MUDDFormer releases
(``tests/fixtures/muddformer_like.py``: custom code written for transformers 4.40, caches to set up
before a forward, multiway dynamic dense connections), read against an oracle built from plain hooks
and the model's own dense weights (``dynamic_dense`` outputs plus ``dense_bs``).

SPEC.py defines ``spec`` (a ``ModelSpec``), ``setup(model, batch_size, ctx)`` (the caches) and
``load(path)`` (the model from the directory's own code, without ``from_pretrained``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

import depthscope
from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.trace import load_trace
from tests.fixtures.muddformer_like import CONFIG, write_muddformer_like
from tests.test_hostile import assert_one_error_line, run

BATCH, CTX, WINDOWS = 4, 32, 8
ATOL = 1e-5  # float32 forward: per-token weights solved from float32 activations
STATS = ("mixing", "mixing_std", "contribution_share")
# the model's caches hold 2 sequences whatever batch the capture asks for
FIXED_CACHES = '''\
"""The directory's spec.py, with caches for 2 sequences whatever batch the capture runs."""
import importlib.util

_found = importlib.util.spec_from_file_location("muddformer_tiny_spec_base", {spec!r})
_base = importlib.util.module_from_spec(_found)
_found.loader.exec_module(_base)
spec, load = _base.spec, _base.load


def setup(model):
    model.setup_caches(max_batch_size=2, max_seq_length=64)
'''


@pytest.fixture(scope="module")
def mudd_dir(tmp_path_factory) -> Path:
    """The MUDDFormer-like checkpoint directory, its spec.py beside the weights."""
    return write_muddformer_like(tmp_path_factory.mktemp("mudd") / "muddformer-tiny")


@pytest.fixture
def modules_cache(tmp_path_factory, monkeypatch):
    """transformers copies a model's code to HF_MODULES_CACHE (read at its import): a temporary one
    (as in test_remote_code.py).
    """
    import transformers.dynamic_module_utils as dynamic

    cache = tmp_path_factory.getbasetemp() / "hf-modules"
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(cache))
    monkeypatch.setattr(sys, "path", list(sys.path))  # it appends the cache to sys.path
    return cache


def spec_module(path: Path) -> ModuleType:
    """A spec file imported by its path, as the command line imports it."""
    name = "spec_file_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    found = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def ready_model(directory: Path, batch_size: int = BATCH, ctx: int = CTX):
    """The spec file's module and the model it loads, its caches set up for ``batch_size`` x ``ctx``."""
    sm = spec_module(directory / "spec.py")
    model = sm.load(directory)
    sm.setup(model, batch_size=batch_size, ctx=ctx)
    return sm, model


def windows() -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (WINDOWS, CTX), generator=torch.Generator().manual_seed(1))


# --- the oracle: plain hooks and the model's own dense weights, in float64 ------------------------


def recorded(model, tokens: torch.Tensor, batch_size: int) -> dict[str, torch.Tensor]:
    """Every source, every consumer input (``in:LABEL``) and every ``dynamic_dense[i]`` output
    (``dw:i``) of the model on ``tokens`` in batches of ``batch_size``, from plain torch hooks (module
    paths written out here, apart from the spec), in float64.
    """
    n = len(model.layers)
    sources = {"embed": "tok_embeddings"}
    sources.update({f"{i}.attn": f"layers.{i}.attention" for i in range(n)})
    sources.update({f"{i}.block": f"layers.{i}" for i in range(n)})
    inputs = {"0.attn": "layers.0.attention_norm", "0.mlp": "layers.0.ffn_norm", "readout": "norm"}
    for i in range(1, n):
        inputs.update({f"{i}.attn.{v}": f"layers.{i}.attention_norms.{k}" for k, v in enumerate("qkv")})
        inputs[f"{i}.mlp"] = f"layers.{i}.ffn_norm"
    seen: dict[str, list[torch.Tensor]] = {}

    def keep(key: str, t: torch.Tensor) -> None:
        seen.setdefault(key, []).append(t.detach().double())

    handles = []
    for label, path in sources.items():
        hook = lambda m, a, out, label=label: keep(label, out)  # noqa: E731
        handles.append(model.get_submodule(path).register_forward_hook(hook))
    for label, path in inputs.items():
        hook = lambda m, a, label=label: keep("in:" + label, a[0])  # noqa: E731
        handles.append(model.get_submodule(path).register_forward_pre_hook(hook))
    for i in range(n):
        hook = lambda m, a, out, i=i: keep(f"dw:{i}", out)  # noqa: E731  [C, batch, pos, i + 2]
        handles.append(model.dynamic_dense[i].register_forward_hook(hook))
    try:
        with torch.no_grad():
            for chunk in tokens.split(batch_size):
                model(chunk)
    finally:
        for h in handles:
            h.remove()
    return {k: torch.cat(v, 1 if k.startswith("dw:") else 0) for k, v in seen.items()}


def true_weights(
    model, values: dict[str, torch.Tensor], n: int
) -> dict[str, dict[str, torch.Tensor | float]]:
    """What each consumer really mixes: stream c of layer i >= 1 is sum_j dw[i - 1][c, j] X_j over the
    block outputs X_0 = embed, X_j = (j - 1).block (dw the dynamic weights plus ``dense_bs``); the MLP
    reads the r stream (c = 3) plus its attention's output."""
    dw = [values[f"dw:{i}"] + model.dense_bs[i].detach().double()[:, None, None, :] for i in range(n)]
    states = ["embed"] + [f"{i}.block" for i in range(n)]
    weights: dict[str, dict[str, torch.Tensor | float]] = {
        "0.attn": {"embed": 1.0},
        "0.mlp": {"embed": 1.0, "0.attn": 1.0},
    }
    for i in range(1, n):
        for c, view in enumerate("qkv"):
            weights[f"{i}.attn.{view}"] = {states[j]: dw[i - 1][c, :, :, j] for j in range(i + 1)}
        weights[f"{i}.mlp"] = {**{states[j]: dw[i - 1][3, :, :, j] for j in range(i + 1)}, f"{i}.attn": 1.0}
    weights["readout"] = {states[j]: dw[n - 1][0, :, :, j] for j in range(n + 1)}
    return weights


def oracle(model, tokens: torch.Tensor, batch_size: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per consumer, per source it may read: the token-mean weight, the weight's spread over tokens
    and the contribution share, in float64, from plain torch hooks and the weights the model really
    mixed with (``dynamic_dense[i]``'s output plus ``dense_bs[i]``), on ``tokens`` run in batches of
    ``batch_size`` as the capture runs them.
    """
    n = len(model.layers)
    order = ["embed"] + [f"{i}.{kind}" for i in range(n) for kind in ("attn", "block")]
    values = recorded(model, tokens, batch_size)
    weights = true_weights(model, values, n)
    before = {label: 1 + 2 * int(label.split(".")[0]) for label in weights if ".attn" in label}
    before.update({label: 2 + 2 * int(label.split(".")[0]) for label in weights if label.endswith(".mlp")})
    before["readout"] = len(order)

    out = {}
    for label, w in weights.items():
        h = values["in:" + label]
        names = order[: before[label]]  # the sources written before it; weight 0 where it reads none
        per = {
            s: torch.broadcast_to(torch.as_tensor(w.get(s, 0.0), dtype=torch.float64), h.shape[:2])
            for s in names
        }
        terms = {s: per[s][..., None] * torch.broadcast_to(values[s], h.shape) for s in names}
        rebuilt = sum(terms.values())
        # the oracle's own weights rebuild the input (float32 forward, float64 here)
        assert float((rebuilt - h).norm() / h.norm()) < 1e-5, label
        energy = float((rebuilt * rebuilt).sum())
        out[label] = {
            s: {
                "mixing": float(per[s].mean()),
                "mixing_std": float(per[s].std(correction=0)),
                "contribution_share": float((terms[s] * rebuilt).sum()) / energy,
            }
            for s in names
        }
    return out


# --- the tests ------------------------------------------------------------------------------------


def test_the_directory_is_shaped_like_the_release(mudd_dir):
    """Custom code and weights, no tokenizer; the forward needs setup_caches and fails past its batch."""
    files = sorted(p.name for p in mudd_dir.iterdir())
    assert files == [
        "config.json",
        "configuration_muddformer_tiny.py",
        "model.safetensors",
        "modeling_muddformer_tiny.py",
        "spec.py",
    ]
    config = json.loads((mudd_dir / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_muddformer_tiny.MUDDFormerTiny"
    assert config["transformers_version"] == "4.40.2"
    sm = spec_module(mudd_dir / "spec.py")
    model = sm.load(mudd_dir)
    with pytest.raises(AssertionError, match="setup_caches"):
        model(windows()[:2])
    sm.setup(model, batch_size=2, ctx=CTX)
    assert model(windows()[:2]).logits.shape == (2, CTX, CONFIG["vocab_size"])
    assert model(windows()[:1, :8]).logits.shape == (1, 8, CONFIG["vocab_size"])  # smaller fits
    with pytest.raises(RuntimeError, match="shape mismatch"):
        model(windows()[:4])


def test_transformers_cannot_load_it_one_line(mudd_dir, modules_cache):
    """The checkpoint's code predates the installed transformers: depthscope.load refuses it in one
    line naming the directory (its from_pretrained fails inside transformers).
    """
    with pytest.raises(DepthscopeError) as caught:
        depthscope.load(mudd_dir, trust_remote_code=True)
    message = str(caught.value)
    assert "\n" not in message and message.strip(), message
    assert str(mudd_dir) in message, message
    # it says why (the code predates the installed transformers) and what to do instead
    assert "written for transformers 4.40.2, older than the installed" in message, message
    assert "spec file's load()" in message and "--spec FILE.py" in message, message


def test_a_spec_file_reads_it_as_the_model_mixes(mudd_dir):
    """The Python API with the spec file's spec, setup and load equals the oracle: the token-mean
    weights (q, k, v and r streams over the block outputs, zero on earlier attention outputs), their
    spread over tokens and the contribution shares, per consumer and source.
    """
    sm, model = ready_model(mudd_dir)
    tokens = windows()
    trace = capture(model, tokens, spec=sm.spec, skip_positions=0, batch_size=BATCH, progress=False)
    want = oracle(model, tokens, BATCH)
    assert sorted(map(str, trace.layer.values)) == sorted(want)
    found = json.loads(trace.attrs["weights_found"])
    assert found["0.attn"] == found["0.mlp"] == "unit"
    assert {how for label, how in found.items() if not label.startswith("0.")} == {"token"}
    assert float(trace["residual_error"].max()) < 1e-5
    for layer, row in want.items():
        for source, stats in row.items():
            for var in STATS:
                got = float(trace[var].sel(layer=layer, source=source))
                assert got == pytest.approx(stats[var], abs=ATOL), (var, layer, source)
        after = [s for s in map(str, trace.source.values) if s not in row]
        assert np.isnan(trace["mixing"].sel(layer=layer, source=after).values).all(), layer
    # the dynamic weights really vary over tokens (not a static mix the capture could also fit)
    assert min(want["2.attn.q"][s]["mixing_std"] for s in ("embed", "0.block", "1.block")) > 0.05
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-6)


def test_capture_with_a_spec_file_on_the_command_line(mudd_dir, modules_cache, tmp_path):
    """`depthscope capture DIR --spec DIR/spec.py --trust-remote-code`: the model from the spec file's
    load (transformers cannot build it), its caches from its setup (batch_size and ctx passed), read
    by its spec: the trace equals the Python capture of the same settings, array for array.
    """
    out = tmp_path / "t.nc"
    argv = [
        "capture",
        str(mudd_dir),
        "--spec",
        str(mudd_dir / "spec.py"),
        "--trust-remote-code",
        "--out",
        str(out),
        "--tokens",
        str(WINDOWS * CTX),
        "--ctx",
        str(CTX),
        "--batch-size",
        str(BATCH),
        "--quiet",
    ]
    rc, err = run(argv)
    assert rc == 0, err
    trace = load_trace(out)
    sm, model = ready_model(mudd_dir, BATCH, CTX)
    want = capture(
        model, None, spec=sm.spec, n_tokens=WINDOWS * CTX, ctx=CTX, batch_size=BATCH, progress=False
    )
    assert trace.attrs["family"] == "spec" and trace.attrs["label"] == "MUDDFormer"
    assert trace.attrs["config"] == want.attrs["config"]
    assert sorted(trace.data_vars) == sorted(want.data_vars)
    for name in (*want.data_vars, *want.coords):
        np.testing.assert_array_equal(trace[name].values, want[name].values, err_msg=name)


def test_a_forward_that_fails_mid_capture_is_one_line(mudd_dir, modules_cache, tmp_path):
    """Caches for 2 sequences and a capture batch of 8: the probe forward (2 sequences) runs, the first
    batch fails inside the model's code; refused in one line saying the model's forward failed.
    """
    small = tmp_path / "spec_fixed_caches.py"
    small.write_text(FIXED_CACHES.format(spec=str(mudd_dir / "spec.py")))
    out = tmp_path / "t.nc"
    argv = ["capture", mudd_dir, "--spec", small, "--trust-remote-code", "--out", out, "--tokens", "256"]
    rc, err = run([*argv, "--ctx", "32", "--batch-size", "8", "--quiet"])
    assert_one_error_line(rc, err)
    assert "forward" in err and "fail" in err, err
    assert not out.exists()
