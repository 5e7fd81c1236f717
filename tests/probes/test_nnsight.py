"""Live models wrapped by nnsight: ``capture`` reads the module inside an ``NNsight`` or a
``LanguageModel`` (a lazily built one loads its weights first), and the trace equals the module's."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from depthscope.probes import capture
from depthscope.probes.capture import unwrap
from depthscope.probes.load import load_model
from tests.probes.test_huggingface import bert_dir, llama_dir, tokens  # noqa: F401 (fixtures)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = [  # nnsight's own notices about the models it wraps
    pytest.mark.filterwarnings("ignore:Module .* has a submodule named 'output'"),
    pytest.mark.filterwarnings("ignore:LanguageModel is deprecated"),
]


def assert_same(a, b) -> None:
    assert set(a.data_vars) == set(b.data_vars)
    for name in a.data_vars:
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
    assert a.attrs["family"] == b.attrs["family"] and a.attrs["label"] == b.attrs["label"]


def test_an_nnsight_wrapper_is_captured_as_its_module(bert_dir, llama_dir):  # noqa: F811
    """NNsight(module) of a post-LN encoder and of a decoder: the same trace as the module's."""
    import nnsight

    for d in (bert_dir, llama_dir):
        model = load_model(d)
        wrapped = nnsight.NNsight(model)
        assert unwrap(wrapped)[0] is model
        assert_same(capture(wrapped, tokens(), skip_positions=0), capture(model, tokens(), skip_positions=0))


def test_a_language_model_built_lazily_loads_its_weights_and_reads_text_with_its_tokenizer(llama_dir):  # noqa: F811
    """LanguageModel(dir) starts as a meta-device skeleton: capture loads it (as nnsight's first trace
    would) and reads text with the wrapper's tokenizer; the wrapper still traces afterwards."""
    import nnsight
    from transformers import AutoTokenizer

    lm = nnsight.LanguageModel(str(llama_dir), tokenizer=AutoTokenizer.from_pretrained(llama_dir))
    assert lm.dispatched is False
    reference = load_model(llama_dir)
    got = capture(lm, None, n_tokens=128, ctx=32)
    assert lm.dispatched is True and got.attrs["family"] == "huggingface"
    assert_same(got, capture(reference, None, n_tokens=128, ctx=32))
    with lm.trace("a b c"):
        out = lm.model.layers[0].output.save()
    assert torch.is_tensor(out)


def test_other_models_pass_through_and_nnsight_is_not_imported_for_them(llama_dir, monkeypatch):  # noqa: F811
    model = load_model(llama_dir)
    monkeypatch.delitem(sys.modules, "nnsight", raising=False)
    assert unwrap(model, "tok") == (model, "tok")
    assert "nnsight" not in sys.modules


@pytest.mark.parametrize("attr", ["_module", "_model"])
def test_the_wrapped_module_is_found_under_either_name(attr):
    """nnsight 0.8 keeps the module as ``_module``; older releases as ``_model``."""
    inner = torch.nn.Linear(2, 2)
    fake = type("Envoy", (), {"__module__": "nnsight.intervention.envoy"})()
    setattr(fake, attr, inner)
    assert unwrap(fake) == (inner, None)
