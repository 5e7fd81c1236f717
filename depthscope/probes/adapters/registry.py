"""Model families as values, in one explicit registry, open to other packages and to user code.

A ``Family`` says what one family reads and how: its name, one line of what it reads (``depthscope
adapters`` prints it), the package and version it was written for, the transformers model types
it claims, its priority, and three functions: ``detect(model) -> bool``, ``build(model) ->
Adapter`` and, for families whose users build models from saved arguments, ``from_saved(args)``.

The registry holds, in order of priority then name:

* the built-in families, listed in ``BUILT_IN`` (one module each in this package, whose constants
  and functions make the value: ``Family.of``);
* the families other packages declare in the entry-point group ``depthscope.families`` (an entry
  point names a ``Family`` or a module shaped like ours), loaded on first use;
* the families user code adds with ``depthscope.register_family(family)``.

A family that claims ``model_types`` is tried before the generic transformers reader
(``huggingface``), which reads every transformers decoder whose type no family claims. A broken
third-party entry point is reported with a warning and skipped, never a reason to read nothing.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters.base import Adapter, find_module

GROUP = "depthscope.families"  # the entry-point group another package registers its families in
BUILT_IN = (
    "schemes",
    "bridge",
    "beam",
    "deepseek_v4",
    "gemma3n",
    "glm5_next",
    "hy_v4",
    "inkling2",
    "post_ln",
    "qwen4_exp",
    "attn_res",
    "deep_cross_attention",
    "x_transformers",
    "hyper_connections",
    "huggingface",
)


@dataclass(frozen=True)
class Family:
    """One model family (see the module docstring)."""

    name: str
    reads: str
    detect: Callable[[Any], bool]
    build: Callable[[Any], Adapter]
    package: str | None = None
    version: str | None = None
    model_types: tuple[str, ...] = ()
    priority: int = 100
    from_saved: Callable[[dict], Any] | None = None
    generic: bool = False  # reads what no other family claims (the transformers reader)

    @classmethod
    def of(cls, module: ModuleType) -> Family:
        """The family a module shaped like ours defines (``FAMILY``, ``READS``, ``detect``, ``build``;
        optionally ``PACKAGE``, ``VERSION``, ``MODEL_TYPES``, ``PRIORITY``, ``from_saved``, ``GENERIC``).
        """
        missing = [k for k in ("FAMILY", "detect", "build") if not hasattr(module, k)]
        if missing:
            raise DepthscopeError(f"{module.__name__} is no family: it lacks {', '.join(missing)}")
        return cls(
            name=module.FAMILY,
            reads=getattr(module, "READS", ""),
            detect=module.detect,
            build=module.build,
            package=getattr(module, "PACKAGE", None),
            version=getattr(module, "VERSION", None),
            model_types=tuple(getattr(module, "MODEL_TYPES", ())),
            priority=int(getattr(module, "PRIORITY", 100)),
            from_saved=getattr(module, "from_saved", None),
            generic=bool(getattr(module, "GENERIC", False)),
        )


def transformers_detect(model_types: tuple[str, ...], base_class: str) -> Callable[[Any], bool]:
    """The detect of a family written for transformers classes: a PreTrainedModel of one of
    ``model_types`` holding a module of class ``base_class``.
    """

    def detect(model: Any) -> bool:
        from depthscope.probes.adapters.hf import model_type, pretrained

        return (
            pretrained(model)
            and model_type(model) in model_types
            and find_module(model, base_class) is not None
        )

    detect.__doc__ = (
        f"Whether the model is a transformers {'/'.join(model_types)} model (with a {base_class})."
    )
    return detect


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
        for name in BUILT_IN:
            _add(Family.of(importlib.import_module(f"{__package__}.{name}")), f"{__package__}.{name}")
    if not _LOADED["entry_points"]:
        _LOADED["entry_points"] = True
        from importlib.metadata import entry_points

        for point in entry_points(group=GROUP):
            try:
                value = point.load()
                _add(
                    Family.of(value) if isinstance(value, ModuleType) else value, f"entry point {point.name}"
                )
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
    if name in (f.name for f in map(_built_in, BUILT_IN)):
        raise DepthscopeError(f"{name} is a built-in family")
    _REGISTRY.pop(name, None)


def _built_in(module: str) -> Family:
    return Family.of(importlib.import_module(f"{__package__}.{module}"))


def families() -> dict[str, Family]:
    """Every registered family by name, in the order they are tried (priority, then name)."""
    _load()
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (kv[1].priority, kv[0])))


def claimed(model_type: Any) -> str | None:
    """The family whose ``model_types`` names this ``config.model_type``, or None."""
    return next((f.name for f in families().values() if model_type in f.model_types), None)
