"""depthscope: measure how transformers mix earlier layers' outputs across depth."""

__version__ = "0.1.0"

from depthscope import zoo  # noqa: E402  (the bundled checkpoints: depthscope.zoo.ZOO_DIR)
from depthscope.errors import DepthscopeError  # noqa: E402
from depthscope.schemes import DepthModel, ModelConfig  # noqa: E402
from depthscope.probes.load import load_model as load  # noqa: E402

__all__ = ["DepthModel", "DepthscopeError", "ModelConfig", "load", "zoo", "__version__"]
