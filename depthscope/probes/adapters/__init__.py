"""Model families as adapters: one module per family, registered here in detection order.

Adding a family is one module with ``FAMILY``, ``detect(model) -> bool`` and
``build(model) -> Adapter`` (see ``base.py``), plus one line below.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters import bert, bridge, huggingface, schemes
from depthscope.probes.adapters.base import Adapter, ConsumerSpec, NativeSpec, SourceSpec

FAMILIES: dict[str, ModuleType] = {m.FAMILY: m for m in (schemes, bridge, huggingface, bert)}


def resolve(model: Any, adapter: str | Adapter | None = None) -> Adapter:
    """The adapter of ``model``: the one given, the family named, or the first family that detects it."""
    if isinstance(adapter, Adapter):
        return adapter
    if adapter is not None:
        if adapter not in FAMILIES:
            raise DepthscopeError(f"unknown adapter {adapter!r}; known: {', '.join(FAMILIES)}")
        return FAMILIES[adapter].build(model)
    for family in FAMILIES.values():
        if family.detect(model):
            return family.build(model)
    raise DepthscopeError(
        f"cannot capture a {type(model).__name__}: no adapter knows it (known families: "
        f"{', '.join(FAMILIES)})"
    )


__all__ = ["FAMILIES", "Adapter", "ConsumerSpec", "NativeSpec", "SourceSpec", "resolve"]
