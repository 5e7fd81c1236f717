"""depthscope: measure how transformers mix earlier layers' outputs across depth.

The names below are imported when first used, so that ``import depthscope`` (and the command
line's ``--help``) does not pay for torch, transformers and xarray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from depthscope._version import __version__
from depthscope.errors import DepthscopeError

if TYPE_CHECKING:
    from depthscope import probes, zoo
    from depthscope.probes.adapters.family import Family
    from depthscope.probes.adapters.registry import register_family
    from depthscope.probes.adapters.spec import ModelSpec
    from depthscope.probes.adapters.suggest import suggest_spec
    from depthscope.probes.load import load_model as load
    from depthscope.schemes import DepthModel, ModelConfig

# public name -> (module, attribute; None for the module itself)
_LAZY = {
    "zoo": ("depthscope.zoo", None),  # the bundled checkpoints: depthscope.zoo.ZOO_DIR
    "load": ("depthscope.probes.load", "load_model"),
    "DepthModel": ("depthscope.schemes", "DepthModel"),
    "ModelConfig": ("depthscope.schemes", "ModelConfig"),
    "ModelSpec": ("depthscope.probes.adapters.spec", "ModelSpec"),  # read any module: where it writes, reads
    "suggest_spec": ("depthscope.probes.adapters.suggest", "suggest_spec"),  # a ModelSpec to start from
    "probes": ("depthscope.probes", None),
    "Family": ("depthscope.probes.adapters.family", "Family"),  # a model family, as a value
    "register_family": ("depthscope.probes.adapters.registry", "register_family"),
}

__all__ = [
    "DepthModel",
    "DepthscopeError",
    "Family",
    "ModelConfig",
    "ModelSpec",
    "load",
    "probes",
    "register_family",
    "suggest_spec",
    "zoo",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'depthscope' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    return value if attr is None else getattr(value, attr)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
