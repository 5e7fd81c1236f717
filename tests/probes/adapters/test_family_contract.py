"""What every registered family promises, tested once for all of them (the registry's own list):
it reads a model of its own, refuses a model it does not read in one line, and warns when the
installed package is another version than the one it was written for."""

from __future__ import annotations

import importlib.metadata
import warnings

import pytest
import torch
from torch import nn

from depthscope import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.adapters import resolve
from depthscope.probes.adapters.registry import built_in
from tests.families import BY_FAMILY, sizes

FAMILIES = built_in()


def test_every_built_in_family_has_a_model_here():
    assert sorted(BY_FAMILY) == sorted(f.name for f in FAMILIES)


@pytest.fixture(scope="module")
def models():
    cache = {}

    def model(name: str):
        if name not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a family's own warnings are its own tests'
                cache[name] = BY_FAMILY[name](sizes())[0].eval()
        return cache[name]

    return model


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_a_family_reads_its_own_model_and_refuses_another(family, models):
    model = models(family.name)
    assert family.detect(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert resolve(model).family == family.name
    foreign = nn.Linear(4, 4)
    assert not family.detect(foreign)
    with pytest.raises(DepthscopeError) as err:
        capture(foreign, torch.zeros(1, 8, dtype=torch.long), adapter=family.name, progress=False)
    assert "\n" not in str(err.value) and str(err.value).strip()


PINNED = [f for f in FAMILIES if f.package]


@pytest.mark.parametrize("family", PINNED, ids=[f.name for f in PINNED])
def test_another_installed_version_warns_and_is_recorded(family, models, monkeypatch):
    model = models(family.name)
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.0.1" if name == family.package else real(name)
    )
    with pytest.warns(
        UserWarning, match=f"written for {family.package} {family.version}, installed is 0.0.1"
    ):
        ad = resolve(model)
    assert ad.family == family.name and ad.attrs["family"] == family.name
    assert ad.attrs["package_version"] == "0.0.1" and ad.attrs["adapter_written_for"] == family.version
