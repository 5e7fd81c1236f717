"""Model families as adapters: one module per family, found in this package and tried in order.

Adding a family is adding one module to this package (every module that defines ``FAMILY`` is a
family; ``base`` and ``streams`` are helpers). A family module defines

* ``FAMILY``: its name (``capture(..., adapter=FAMILY)`` selects it);
* ``READS``: one line, what it reads and how that maps to M (``depthscope adapters`` prints it);
* ``PACKAGE``, ``VERSION``: the distribution it reads and the version it was written for (None
  for depthscope's own models and transformers' standard classes);
* ``detect(model) -> bool`` and ``build(model) -> Adapter`` (see ``base.py``);
* optionally ``PRIORITY`` (default 100): families are tried in increasing priority, then by name;
* optionally ``MODEL_TYPES``: the transformers ``config.model_type`` values it claims (the generic
  ``huggingface`` family reads every other transformers decoder).

An installed version other than ``VERSION`` gives a warning (and the trace records both), never a
silent misreading.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from types import ModuleType
from typing import Any

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters.base import Adapter, ConsumerSpec, NativeSpec, SourceSpec, installed_version


def _families() -> tuple[ModuleType, ...]:
    found = []
    for info in pkgutil.iter_modules(__path__):  # helpers (base, streams, hf) define no FAMILY
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "FAMILY"):
            found.append(module)
    return tuple(sorted(found, key=lambda m: (getattr(m, "PRIORITY", 100), m.__name__)))


MODULES: tuple[ModuleType, ...] = _families()
FAMILIES: dict[str, ModuleType] = {m.FAMILY: m for m in MODULES}


def claimed(model_type: Any) -> str | None:
    """The family whose ``MODEL_TYPES`` names this ``config.model_type`` (one written for it), or None."""
    return next((m.FAMILY for m in MODULES if model_type in getattr(m, "MODEL_TYPES", ())), None)


def _built(family: ModuleType, model: Any) -> Adapter:
    ad = family.build(model)
    package, pinned = getattr(family, "PACKAGE", None), getattr(family, "VERSION", None)
    if package:
        have = installed_version(package)
        ad.attrs.update(package=package, package_version=have or "", adapter_written_for=pinned or "")
        if have != pinned:
            warnings.warn(
                f"{family.FAMILY}: the adapter was written for {package} {pinned}, installed is {have}; "
                "check the trace against the package's own computation",
                stacklevel=3,
            )
    return ad


def resolve(model: Any, adapter: str | Adapter | None = None) -> Adapter:
    """The adapter of ``model``: the one given, the family named, or the first family that detects it."""
    if isinstance(adapter, Adapter):
        return adapter
    if adapter is not None:
        if adapter not in FAMILIES:
            raise DepthscopeError(f"unknown adapter {adapter!r}; known: {', '.join(FAMILIES)}")
        return _built(FAMILIES[adapter], model)
    for family in FAMILIES.values():
        if family.detect(model):
            return _built(family, model)
    from depthscope.probes.adapters.spec import build_spec, guess_spec

    guessed = guess_spec(model)
    why = ""
    if guessed is not None:  # a plain module shaped like a pre-norm decoder: read as its spec says
        try:
            ad = build_spec(model, guessed)
            ad.attrs["spec_origin"] = "discovered"
            return ad
        except DepthscopeError as err:
            why = f" (read as {guessed.describe()['writes']}: {str(err).removeprefix('ModelSpec: ')})"
    raise DepthscopeError(
        f"cannot capture a {type(model).__name__}: no adapter knows it "
        f"(known families: {', '.join(FAMILIES)}){why}; name where it writes and reads: "
        "capture(model, data, spec=depthscope.ModelSpec(embed=['wte'], "
        "writes={'attn': 'blocks.*.attn', 'mlp': 'blocks.*.mlp'}, reads={'attn': 'blocks.*.ln_1', "
        "'mlp': 'blocks.*.ln_2', 'readout': 'ln_f'})), see README.md#reading-your-own-model"
    )


def describe() -> list[dict[str, str]]:
    """Every family: name, what it reads, the package and version it was written for, what is installed."""
    return [
        {
            "family": m.FAMILY,
            "reads": getattr(m, "READS", ""),
            "package": getattr(m, "PACKAGE", None) or "-",
            "written_for": getattr(m, "VERSION", None) or "-",
            "installed": installed_version(getattr(m, "PACKAGE", None)) or "-",
        }
        for m in MODULES
    ]


__all__ = [
    "FAMILIES",
    "MODULES",
    "Adapter",
    "ConsumerSpec",
    "NativeSpec",
    "SourceSpec",
    "claimed",
    "describe",
    "resolve",
]
