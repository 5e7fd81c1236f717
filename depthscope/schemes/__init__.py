"""Reference implementations: one module per residual scheme, one shared model."""

from depthscope.schemes import standard  # noqa: F401  (registration order = table order)
from depthscope.schemes.base import (
    Consumer,
    Mixer,
    ModelConfig,
    Scheme,
    Site,
    Source,
    consumers,
    get_scheme,
    scheme_names,
    sources,
)
from depthscope.schemes.model import DepthModel

__all__ = [
    "Consumer",
    "DepthModel",
    "Mixer",
    "ModelConfig",
    "Scheme",
    "Site",
    "Source",
    "consumers",
    "get_scheme",
    "scheme_names",
    "sources",
]
