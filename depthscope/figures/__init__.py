"""Plotting: DataArray or trace in, matplotlib Axes/Figure out (every plot function is ``plot_*``)."""

from depthscope.figures.curves import (
    plot_dilution,
    plot_dilution_panels,
    plot_pattern_scores,
    plot_retention,
    plot_trajectories,
    plot_trajectory,
)
from depthscope.figures.heatmaps import plot_heatmap, plot_heatmap_grid
from depthscope.figures.rank import plot_rank_profile, plot_rank_vs_width
from depthscope.figures.style import (
    apply_house_style,
    house_style,
    save,
    scheme_color,
    scheme_colors,
)

__all__ = [
    "apply_house_style",
    "house_style",
    "plot_dilution",
    "plot_dilution_panels",
    "plot_heatmap",
    "plot_heatmap_grid",
    "plot_pattern_scores",
    "plot_rank_profile",
    "plot_rank_vs_width",
    "plot_retention",
    "plot_trajectories",
    "plot_trajectory",
    "save",
    "scheme_color",
    "scheme_colors",
]
