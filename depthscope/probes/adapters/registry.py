"""Model families as values, in one explicit registry, open to other packages and to user code.

A ``Family`` says what one family reads and how: its name, one line of what it reads (``depthscope
adapters`` prints it), the package and version it was written for, the transformers model types
it claims, its priority, and its functions: ``detect(model) -> bool``, ``build(model) -> Adapter``,
for families whose users build models from saved arguments ``from_saved(args)``, and for
multi-stream families ``streams(model, adapter)``, where stream statistics read the streams
(``probes.stream_stats``).

The registry holds, in order of priority then name:

* the built-in families (``built_in()``: each module of this package ends in its ``FAMILY`` value;
  ``hyper_forms`` holds three rows);
* the families other packages declare in the entry-point group ``depthscope.families`` (an entry
  point names a ``Family``, or a module whose ``FAMILY`` is one), loaded on first use;
* the families user code adds with ``depthscope.register_family(family)``.

A family that claims ``model_types`` is tried before the generic transformers reader
(``huggingface``), which reads every transformers decoder whose type no family claims. A broken
third-party entry point is reported with a warning and skipped, never a reason to read nothing.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters.family import Family
from depthscope.probes.adapters.hf import model_type

GROUP = "depthscope.families"  # the entry-point group another package registers its families in


def built_in() -> tuple[Family, ...]:
    """The built-in families, their modules imported on first use."""
    from depthscope.probes.adapters import (
        attn_res,
        beam,
        bridge,
        deep_cross_attention,
        gemma3n,
        huggingface,
        hyper_connections,
        hyper_forms,
        inkling2,
        post_ln,
        qwen4_exp,
        schemes,
        x_transformers,
    )

    return (
        schemes.FAMILY,
        bridge.FAMILY,
        beam.FAMILY,
        *hyper_forms.FAMILIES,
        gemma3n.FAMILY,
        inkling2.FAMILY,
        post_ln.FAMILY,
        qwen4_exp.FAMILY,
        attn_res.FAMILY,
        deep_cross_attention.FAMILY,
        x_transformers.FAMILY,
        hyper_connections.FAMILY,
        huggingface.FAMILY,
    )


_REGISTRY: dict[str, Family] = {}
_LOADED = {"built_in": False, "entry_points": False}


def _add(family: Family, origin: str) -> None:
    if not isinstance(family, Family):
        raise DepthscopeError(
            f"{origin}: a family must be a depthscope Family, got a {type(family).__name__}"
        )
    if family.name in _REGISTRY and _REGISTRY[family.name] is not family:
        raise DepthscopeError(f"{origin}: a family named {family.name!r} is already registered")
    _REGISTRY[family.name] = family


def _load() -> None:
    if not _LOADED["built_in"]:
        _LOADED["built_in"] = True
        for family in built_in():
            _add(family, f"{__package__} (built in)")
    if not _LOADED["entry_points"]:
        _LOADED["entry_points"] = True
        from importlib.metadata import entry_points

        for point in entry_points(group=GROUP):
            try:
                value = point.load()
                family = vars(value).get("FAMILY") if isinstance(value, ModuleType) else value
                _add(family, f"entry point {point.name}")
            except Exception as err:  # another package's broken family must not stop ours
                warnings.warn(
                    f"depthscope: the family entry point {point.value} failed to load ({err})", stacklevel=2
                )


def register_family(family: Family) -> Family:
    """Add ``family`` to the registry (user code; another package uses the entry-point group)."""
    _load()
    _add(family, "register_family")
    return family


def unregister_family(name: str) -> None:
    """Remove a family that ``register_family`` added (built-in families stay)."""
    if name in (f.name for f in built_in()):
        raise DepthscopeError(f"{name} is a built-in family")
    _REGISTRY.pop(name, None)


def families() -> dict[str, Family]:
    """Every registered family by name, in the order they are tried (priority, then name)."""
    _load()
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (kv[1].priority, kv[0])))


def claimed(model_type: Any) -> str | None:
    """The family whose ``model_types`` names this ``config.model_type``, or None."""
    return next((f.name for f in families().values() if model_type in f.model_types), None)


def _detects(family: Family, model: Any) -> bool:
    """Whether ``family`` reads ``model``: its detect, and for the generic reader no other claim."""
    if family.generic and claimed(model_type(model)) is not None:
        return False
    return detect_safely(family, model)


def detecting(model: Any) -> Family | None:
    """The first registered family that reads ``model``, or None."""
    return next((f for f in families().values() if _detects(f, model)), None)


def detect_safely(family: Family, model: Any) -> bool:
    """``family.detect(model)``; False where it raises (a detector that fails on a foreign model)."""
    try:
        return bool(family.detect(model))
    except Exception:  # noqa: BLE001 - it cannot tell, so it does not read the model
        return False
