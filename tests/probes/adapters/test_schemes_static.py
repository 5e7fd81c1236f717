"""Static weights of depthscope's own models (``probes.adapters.schemes.static_weights``) are read
again whenever a tensor of the model changes, and only then: an optimiser step in place, a state
loaded in place or another dtype gives the weights a fresh read gives."""

from __future__ import annotations

import pytest
import torch

from depthscope.probes.adapters import schemes
from tests.helpers import build, tiny


def fresh(model) -> dict:
    schemes._STATIC.pop(model, None)
    return schemes.static_weights(model)


@pytest.fixture
def model():
    return build(tiny("denseformer"))


def test_an_unchanged_model_is_read_once(model, monkeypatch):
    first = schemes.static_weights(model)
    assert first and all(len(w) >= 1 for w in first.values())
    calls = []
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: calls.append(1))
    assert schemes.static_weights(model) == first and calls == []  # the held read, no forward


def test_a_step_in_place_reads_again(model):
    before = schemes.static_weights(model)
    mixing = [p for name, p in model.named_parameters() if "mix" in name]
    assert mixing
    opt = torch.optim.SGD(mixing, lr=0.1)
    for p in mixing:
        p.grad = torch.ones_like(p)
    opt.step()
    after = schemes.static_weights(model)
    assert after != before
    assert after == fresh(model)


def test_a_state_loaded_in_place_and_another_dtype_read_again(model):
    schemes.static_weights(model)
    state = {k: v + 0.05 if "mix" in k else v for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    assert schemes.static_weights(model) == fresh(model)
    schemes.static_weights(model)
    model.double()
    assert schemes.static_weights(model) == fresh(model)
