"""A model family as a value (``Family``): what one family reads and how. The registry
(``registry``) holds them; each family module of this package ends in its ``FAMILY`` value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from depthscope.probes.adapters.base import Adapter, find_module


@dataclass(frozen=True)
class Family:
    """One model family (``registry``'s docstring says how each field is used)."""

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
    # stream statistics: (model, adapter) -> (number of streams, sums -> a context reporting each read)
    streams: Callable[[Any, Adapter], tuple[int, Callable[[Any], Any]]] | None = None


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


TRANSFORMERS = "5.24.0"  # the transformers version the families of its model classes were written for


def transformers_family(
    name: str,
    reads: str,
    model_types: tuple[str, ...],
    base_class: str,
    build: Callable[[Any], Adapter],
    **more,
) -> Family:
    """A family of transformers model classes: detected by model type and decoder class, written for
    ``TRANSFORMERS``, tried before the generic transformers reader.
    """
    detect = transformers_detect(model_types, base_class)
    return Family(name, reads, detect, build, "transformers", TRANSFORMERS, model_types, 20, **more)


def package_family(
    name: str,
    reads: str,
    package: str,
    version: str,
    detect: Callable[[Any], bool],
    build: Callable[[Any], Adapter],
    from_saved: Callable[[dict], Any] | None = None,
) -> Family:
    """A family of a third-party package's model classes, written for its ``version``: tried after the
    transformers families and before the generic transformers reader (priority 50).
    """
    return Family(name, reads, detect, build, package, version, priority=50, from_saved=from_saved)
