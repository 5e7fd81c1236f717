"""Estimators: pure functions of traces (dilution, patterns, collective rank, theory)."""

from depthscope.analysis.dilution import (
    baseline,
    block_view,
    by_depth,
    consumer_table,
    dilution_curves,
    dilution_index,
    mean_retention,
    pattern_curves,
    pattern_score,
    relative_retention,
    retention,
    row_normalized,
    share_of,
    summary,
)
from depthscope.analysis.native import stream_composite
from depthscope.analysis.rank import add_ranks, collective_rank, conclusion, effective_ranks, rank_profile
from depthscope.analysis.select import QUANTITIES, pick, quantity
from depthscope.analysis.stack import per_model
from depthscope.analysis.streams import stream_collapse, stream_statistics, stream_table, trace_res_distance

__all__ = [
    "QUANTITIES",
    "add_ranks",
    "baseline",
    "block_view",
    "by_depth",
    "collective_rank",
    "conclusion",
    "consumer_table",
    "dilution_curves",
    "dilution_index",
    "effective_ranks",
    "mean_retention",
    "pattern_curves",
    "pattern_score",
    "per_model",
    "pick",
    "quantity",
    "rank_profile",
    "relative_retention",
    "retention",
    "row_normalized",
    "share_of",
    "stream_collapse",
    "stream_composite",
    "stream_statistics",
    "stream_table",
    "summary",
    "trace_res_distance",
]
