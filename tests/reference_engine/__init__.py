"""The capture engine of depthscope before the batched engine (commit 3e44534), kept as a slow
reference: its formulas are the definitions the new engine must reproduce (to 1e-10 in float64).

``reference_capture(model, data, **options)`` is that engine's ``capture``. Only the tests use it.
"""

from tests.reference_engine.capture import capture as reference_capture

__all__ = ["reference_capture"]
