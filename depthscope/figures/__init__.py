"""Plotting: an estimator's output (DataArray or Dataset) in, matplotlib Axes or Figure out.

Every ``plot_*`` draws data (``ax=`` where it draws one panel) and computes nothing: give it
what an estimator of ``depthscope.analysis`` returns, e.g. ``plot_dilution(dilution_curves(
stacked))``. The ``*_figure`` functions take traces and lay out several panels for the report.
Models are coloured by their ``scheme`` (``model_colors``).
"""

from depthscope.figures.causal import (
    native_figure,
    plot_dwa,
    plot_entries,
    plot_read_depth,
    plot_stream_matrix,
    plot_weight_effect,
    read_depth_figure,
    weight_effect_figure,
)
from depthscope.figures.curves import (
    plot_dilution,
    plot_dilution_panels,
    plot_group_over_training,
    plot_loss_over_training,
    plot_pattern_over_training,
    plot_pattern_scores,
    plot_retention,
    plot_shares_over_training,
    plot_trajectories,
    plot_trajectory,
)
from depthscope.figures.heatmaps import plot_heatmap, plot_heatmap_grid
from depthscope.figures.rank import plot_rank_profile, plot_rank_vs_width
from depthscope.figures.style import (
    apply_house_style,
    house_style,
    model_colors,
    save,
    scheme_color,
)

__all__ = [
    "apply_house_style",
    "house_style",
    "model_colors",
    "native_figure",
    "plot_dilution",
    "plot_dilution_panels",
    "plot_dwa",
    "plot_entries",
    "plot_group_over_training",
    "plot_heatmap",
    "plot_heatmap_grid",
    "plot_loss_over_training",
    "plot_pattern_over_training",
    "plot_pattern_scores",
    "plot_rank_profile",
    "plot_rank_vs_width",
    "plot_read_depth",
    "plot_retention",
    "plot_shares_over_training",
    "plot_stream_matrix",
    "plot_trajectories",
    "plot_trajectory",
    "plot_weight_effect",
    "read_depth_figure",
    "save",
    "scheme_color",
    "weight_effect_figure",
]
