"""Reference implementations: one module per residual scheme, one shared model."""

# Importing a scheme module registers it; this order is the order of every table.
from depthscope.schemes import standard  # noqa: F401, I001
from depthscope.schemes import denseformer  # noqa: F401
from depthscope.schemes import dca  # noqa: F401
from depthscope.schemes import attnres  # noqa: F401
from depthscope.schemes import hc  # noqa: F401
from depthscope.schemes import mhc  # noqa: F401
from depthscope.schemes import shc  # noqa: F401
from depthscope.schemes import frac  # noqa: F401
from depthscope.schemes import ddl  # noqa: F401
from depthscope.schemes import shortswa  # noqa: F401
from depthscope.schemes import muddformer  # noqa: F401
from depthscope.schemes import value_residual  # noqa: F401
from depthscope.schemes import depth_attention  # noqa: F401
from depthscope.schemes import moda  # noqa: F401
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
    variants,
)
from depthscope.schemes.model import DepthModel, load_checkpoint

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
    "load_checkpoint",
    "scheme_names",
    "sources",
    "variants",
]
