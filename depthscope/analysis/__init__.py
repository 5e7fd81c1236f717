"""Estimators: pure functions of traces (dilution, patterns, collective rank, theory)."""

from depthscope.analysis.dilution import (
    baseline,
    consumer_table,
    dilution_index,
    pattern_score,
    relative_retention,
    retention,
    row_normalized,
    share_of,
    summary,
)
from depthscope.analysis.rank import add_ranks, collective_rank, effective_ranks

__all__ = [
    "add_ranks",
    "baseline",
    "collective_rank",
    "consumer_table",
    "dilution_index",
    "effective_ranks",
    "pattern_score",
    "relative_retention",
    "retention",
    "row_normalized",
    "share_of",
    "summary",
]
