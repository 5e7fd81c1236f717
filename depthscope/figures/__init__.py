"""Plotting: DataArray in, matplotlib Axes/Figure out."""

from depthscope.figures.curves import dilution_curves, pattern_scores, retention
from depthscope.figures.heatmaps import heatmap, heatmap_grid
from depthscope.figures.rank import rank_profile, rank_vs_width
from depthscope.figures.style import (
    apply_house_style,
    house_style,
    save,
    scheme_color,
    scheme_colors,
)

__all__ = [
    "apply_house_style",
    "dilution_curves",
    "heatmap",
    "heatmap_grid",
    "house_style",
    "pattern_scores",
    "rank_profile",
    "rank_vs_width",
    "retention",
    "save",
    "scheme_color",
    "scheme_colors",
]
