"""Models that ship their own modeling code (``auto_map`` in config.json): refused in one line that
names --trust-remote-code and what it does; with it, built by their own code through transformers
and read like any decoder, the trace saying the code ran (``trust_remote_code``).
"""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import pytest
import torch

import depthscope
from depthscope.cli import main
from depthscope.errors import DepthscopeError
from depthscope.trace import load_trace
from tests.helpers import tiny_llama
from tests.test_hostile import assert_one_error_line, run

CONFIGURATION = """
from transformers import LlamaConfig


class TinyConfig(LlamaConfig):
    model_type = "tiny_custom"
"""
MODELING = """
from transformers import LlamaForCausalLM

from .configuration_tiny import TinyConfig


class TinyForCausalLM(LlamaForCausalLM):
    config_class = TinyConfig
"""
FAST = ["--tokens", "128", "--ctx", "32", "--quiet"]


@pytest.fixture(scope="module")
def custom_dir(tmp_path_factory) -> Path:
    """A model directory whose config names its own classes (a Llama under a new model type)."""
    d = tmp_path_factory.mktemp("remote") / "tiny_custom_model"
    model = tiny_llama(0)
    with redirect_stderr(io.StringIO()):
        model.save_pretrained(d)
    (d / "configuration_tiny.py").write_text(CONFIGURATION)
    (d / "modeling_tiny.py").write_text(MODELING)
    config = json.loads((d / "config.json").read_text())
    config.update(
        model_type="tiny_custom",
        architectures=["TinyForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_tiny.TinyConfig",
            "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM",
        },
    )
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.fixture
def modules_cache(tmp_path_factory, monkeypatch):
    """transformers copies a model's code to HF_MODULES_CACHE (read at its import): a temporary one."""
    import transformers.dynamic_module_utils as dynamic

    cache = tmp_path_factory.getbasetemp() / "hf-modules"
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(cache))
    monkeypatch.setattr(sys, "path", list(sys.path))  # it appends the cache to sys.path
    return cache


def test_custom_code_is_refused_without_the_flag(custom_dir, tmp_path):
    rc, err = run(["capture", custom_dir, "--out", tmp_path / "t.nc", "--quiet"])
    assert_one_error_line(rc, err, str(custom_dir))
    assert "--trust-remote-code" in err and "runs the model's own Python code from its directory" in err
    assert not list(tmp_path.iterdir())
    with pytest.raises(DepthscopeError, match="trust_remote_code=True"):
        depthscope.load(custom_dir)


def test_with_the_flag_the_models_own_code_builds_it_and_it_is_read(custom_dir, modules_cache, tmp_path):
    out = tmp_path / "t.nc"
    assert main(["capture", str(custom_dir), "--out", str(out), "--trust-remote-code", *FAST]) == 0
    trace = load_trace(out)
    assert trace.attrs["trust_remote_code"] == 1
    assert json.loads(trace.attrs["config"])["model_type"] == "tiny_custom"
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-6)
    assert float(trace["residual_error"].max()) < 1e-4
    assert any(modules_cache.rglob("modeling_tiny.py"))  # the code ran from the temporary cache


def test_trust_remote_code_from_python(custom_dir, modules_cache):
    model = depthscope.load(custom_dir, trust_remote_code=True)
    assert type(model).__name__ == "TinyForCausalLM" and type(model).__module__.startswith(
        "transformers_modules"
    )
    assert model.depthscope_source == {"trust_remote_code": 1}
    trace = depthscope.probes.capture(model, torch.randint(0, 256, (2, 16)))
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-6)


def test_the_flag_changes_nothing_for_a_model_without_custom_code(tmp_path):
    from depthscope import zoo

    plain = depthscope.load(zoo.ZOO_DIR / "standard.safetensors", trust_remote_code=True)
    assert not hasattr(plain, "depthscope_source")
