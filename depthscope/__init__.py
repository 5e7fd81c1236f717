"""depthscope: measure how transformers mix earlier layers' outputs across depth."""

from depthscope import zoo  # the bundled checkpoints: depthscope.zoo.ZOO_DIR
from depthscope._version import __version__
from depthscope.errors import DepthscopeError
from depthscope.probes.load import load_model as load
from depthscope.schemes import DepthModel, ModelConfig

__all__ = ["DepthModel", "DepthscopeError", "ModelConfig", "load", "zoo", "__version__"]
