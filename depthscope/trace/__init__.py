"""The trace: depthscope's contract, on the ground floor (format version 2, docs/design.md "The trace").

Everything that reads or writes a trace: the variables and their dims, long names and units
(``format``), the axes' ``Layout``, save/load/check and format-1 conversion, stacking along
``model`` (``stack``), and the label vocabulary and kinds (``labels``). Imports nothing from
depthscope but ``errors``, ``atomic`` and ``resources`` (memory bounds), so every room above reads
traces the same way.
"""

from depthscope.trace import labels
from depthscope.trace.format import (
    CAUSAL_VARIABLE_ATTRS,
    DIMS,
    GLOBAL_ATTRS,
    REQUIRED,
    STACK,
    TRACE_FORMAT,
    VARIABLE_ATTRS,
    VARIABLES,
    Layout,
    block_coords,
    check_trace,
    config_json,
    from_format_1,
    load_trace,
    save_trace,
    with_blocks,
)
from depthscope.trace.stack import select_model, split_models, stack_traces

__all__ = [
    "CAUSAL_VARIABLE_ATTRS",
    "DIMS",
    "GLOBAL_ATTRS",
    "REQUIRED",
    "STACK",
    "TRACE_FORMAT",
    "VARIABLES",
    "VARIABLE_ATTRS",
    "Layout",
    "block_coords",
    "check_trace",
    "config_json",
    "from_format_1",
    "labels",
    "load_trace",
    "save_trace",
    "select_model",
    "split_models",
    "stack_traces",
    "with_blocks",
]
