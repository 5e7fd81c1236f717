"""The family registry: typed values, tried in priority order; another package adds a family through
the entry-point group ``depthscope.families``, user code through ``depthscope.register_family``."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch

import depthscope
from depthscope import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.adapters import registry
from depthscope.probes.adapters.registry import Family, families
from tests.probes.adapters.spec_models import CTX, VOCAB, NanoGPT, seeded


def test_every_family_is_a_typed_value_in_priority_order():
    found = families()
    assert all(isinstance(f, Family) for f in found.values())
    assert len(found) >= len(registry.built_in())
    order = [(f.priority, name) for name, f in found.items()]
    assert order == sorted(order)
    assert next(iter(found)) == "depthscope" and list(found)[-1] != "depthscope"
    assert found["huggingface"].priority > max(f.priority for f in found.values() if f.model_types)


def test_the_transformers_families_claim_their_model_types():
    assert registry.claimed("beam") == "beam" and registry.claimed("bert") == "post-ln"
    assert registry.claimed("llama") is None


class Toy(NanoGPT):
    """A model class of its own: no built-in family detects it by class (discovery would read it)."""


def toy_family(name: str) -> Family:
    def build(model):
        from depthscope.probes.adapters.spec import build_spec

        ad = build_spec(model, NanoGPT.SPEC)
        ad.attrs["family"] = name
        return ad

    return Family(
        name=name, reads="toy: a nanoGPT by its spec", detect=lambda m: isinstance(m, Toy), build=build
    )


@pytest.fixture
def toy():
    torch.manual_seed(0)
    return Toy().eval(), torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(0))


def test_user_code_registers_a_family(toy):
    model, tokens = toy
    family = depthscope.register_family(toy_family("toy-user"))
    try:
        assert families()["toy-user"] is family
        trace = capture(model, tokens, n_tokens=2 * CTX, ctx=CTX)
        assert trace.attrs["family"] == "toy-user"
        with pytest.raises(DepthscopeError, match="already registered"):
            depthscope.register_family(toy_family("toy-user"))
    finally:
        registry.unregister_family("toy-user")
    assert "toy-user" not in families()


def test_another_package_adds_a_family_through_the_entry_point_group(toy, tmp_path, monkeypatch):
    """A distribution on sys.path declaring ``[depthscope.families] toy = toy_pkg:FAMILY``."""
    (tmp_path / "toy_pkg.py").write_text(
        textwrap.dedent(
            """
            from tests.probes.adapters.test_registry import toy_family

            FAMILY = toy_family("toy-package")
            """
        )
    )
    info = tmp_path / "toy_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[depthscope.families]\ntoy = toy_pkg:FAMILY\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setitem(registry._LOADED, "entry_points", False)
    try:
        assert "toy-package" in families()
        model, tokens = toy
        assert capture(model, tokens, n_tokens=2 * CTX, ctx=CTX).attrs["family"] == "toy-package"
    finally:
        registry._REGISTRY.pop("toy-package", None)
        sys.modules.pop("toy_pkg", None)


def test_a_broken_entry_point_warns_and_reads_on(tmp_path, monkeypatch):
    info = tmp_path / "broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[depthscope.families]\nbroken = no_such_module_here:FAMILY\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setitem(registry._LOADED, "entry_points", False)
    with pytest.warns(UserWarning, match="no_such_module_here"):
        found = families()
    assert "depthscope" in found
    model = seeded("nanogpt")  # and reading goes on
    tokens = torch.randint(0, VOCAB, (1, CTX))
    assert float(capture(model, tokens, n_tokens=CTX, ctx=CTX)["residual_error"].max()) < 1e-5


def test_a_value_that_is_no_family_is_refused():
    with pytest.raises(DepthscopeError, match="must be a depthscope Family"):
        depthscope.register_family("toy")


def test_every_family_module_of_the_package_is_listed():
    """The registry is explicit: a module of this package that defines a FAMILY value is built in."""
    import pkgutil

    import depthscope.probes.adapters as package

    values = [
        vars(importlib.import_module(f"{package.__name__}.{info.name}"))
        for info in pkgutil.iter_modules(package.__path__)
    ]
    defined = [v["FAMILY"] for v in values if isinstance(v.get("FAMILY"), Family)]
    defined += [f for v in values for f in v.get("FAMILIES", ())]
    assert defined and set(map(id, defined)) == set(map(id, registry.built_in()))
