"""Versus depth: the same schemes at several depths (``analysis.depth.depth_table`` in, Axes out)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthscope.figures.style import model_colors, new_axes, style_axes, styled, subplots

PANELS = (
    ("pattern_score", {"kind": "sublayers"}, "pattern score, sublayer inputs"),
    ("pattern_score", {"kind": "readout"}, "pattern score, read-out"),
    ("retention", {"source": "embed"}, "read-out share of the embedding"),
    ("retention", {"source": "0.mlp"}, "read-out share of block 0's MLP"),
    ("loss_gain", {}, "loss gain over the standard residual (nats/byte)"),
    ("rank_ratio", {}, "r*/d (numerical rank)"),
)


@styled
def plot_versus_depth(table: xr.Dataset, ax=None, *, var: str = "pattern_score", select=None, title=None):
    """One line per scheme group of ``table[var]`` (after ``.sel(**select)``) against the number of
    blocks; retention panels also draw the uniform 1/T share of the read-out (dashed).

    Returns:
        The Axes.
    """
    ax = ax if ax is not None else new_axes((4.2, 3.2))
    da = table[var].sel(select or {})
    colours = model_colors(zip(map(str, table["group"].values), map(str, table["scheme"].values)))
    x = table["n_layers"].values
    drawn = 0
    for g in map(str, table["group"].values):
        y = da.sel(group=g).values
        if np.isfinite(y).any():
            ax.plot(x, y, marker="o", color=colours[g], label=g)
            drawn += 1
    if not drawn:  # said on the panel rather than left as an empty frame
        ax.text(
            0.5, 0.5, "not in these traces", ha="center", va="center", transform=ax.transAxes, color="0.4"
        )
    if var == "retention":
        ax.plot(x, table["baseline"].values, ls="--", color="0.4", lw=1, label="1/T (uniform)")
    ax.set_xticks(x)
    ax.set_xlabel("blocks")
    ax.set_title(title or str(table[var].attrs.get("long_name", var)))
    return style_axes(ax)


@styled
def plot_view_lags(table: xr.Dataset, ax=None, *, title: str = "q, k, v read depth (sublayers back)"):
    """For the groups with q/k/v views (DCA), each view's mean read depth against the blocks.

    Returns:
        The Axes.
    """
    ax = ax if ax is not None else new_axes((4.2, 3.2))
    x = table["n_layers"].values
    colours = model_colors(zip(map(str, table["group"].values), map(str, table["scheme"].values)))
    drawn = 0
    for g in map(str, table["group"].values):
        lags = table["view_lag"].sel(group=g)
        for view, style in zip(map(str, table["view"].values), ("-", "--", ":")):
            y = lags.sel(view=view).values
            if np.isfinite(y).any():
                ax.plot(x, y, ls=style, marker="o", color=colours[g], label=f"{g} {view}")
                drawn += 1
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no q/k/v views", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks(x)
    ax.set_xlabel("blocks")
    ax.set_title(title)
    return style_axes(ax)


@styled
def depth_figure(table: xr.Dataset):
    """The report's versus-depth figure: ``PANELS`` and the q/k/v read depths, one legend.

    Returns:
        The Figure.
    """
    fig, axes = subplots(2, 4, figsize=(16, 6.6))
    flat = list(axes.flat)
    for ax, (var, select, title) in zip(flat, PANELS):
        plot_versus_depth(table, ax, var=var, select=select, title=title)
    plot_view_lags(table, flat[len(PANELS)])
    handles, labels = flat[0].get_legend_handles_labels()
    extra = [(h, lab) for h, lab in zip(*flat[2].get_legend_handles_labels()) if lab not in labels]
    flat[-1].axis("off")
    flat[-1].legend(
        [h for h, _ in [*zip(handles, labels), *extra]],
        [*labels, *(lab for _, lab in extra)],
        loc="center",
        title="scheme",
    )
    steps = sorted({int(s) for s in np.unique(table["step"].values) if s >= 0})
    fig.suptitle(
        f"The same schemes at {', '.join(map(str, table['n_layers'].values))} blocks, compared at "
        f"step {', '.join(map(str, steps))} (equal tokens seen)"
    )
    return fig
