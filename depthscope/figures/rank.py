"""Collective-rank figures: per-source effective ranks across depth, and r*/d versus width.

Data in: ``analysis.rank_profile`` of a trace or a stack, and the (scheme, width) table of
``pipelines.rank.rank_sweep``; matplotlib Axes out.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthscope.figures.data import by_model, colors, unpadded
from depthscope.figures.style import new_axes, scheme_color, style_axes, styled
from depthscope.trace.labels import EMBED


@styled
def plot_rank_profile(profile: xr.Dataset, ax=None, *, kind: str = "numerical"):
    """Effective rank of each sublayer's outputs versus its depth, one line per model.

    ``profile``: ``analysis.rank_profile`` of a trace captured with rank=True, or of a stack
    (a model captured without it has no line). Each width d is drawn as a dotted line: a layer
    of rank d uses the whole stream.

    Returns:
        The Axes.
    """
    ax = style_axes(ax) if ax is not None else new_axes((6.4, 3.6))
    colours = colors(profile)
    widths = []
    for label, _, part in by_model(profile):
        part = unpadded(part)
        if "effective_rank" not in part or bool(part["effective_rank"].isnull().all()):
            continue
        sublayers = part["source_kind"] != EMBED
        x = part["source_depth"].where(sublayers, drop=True).values
        y = part["effective_rank"].sel(rank_kind=kind).where(sublayers, drop=True).values
        ax.plot(x, y, marker="o", ms=3, color=colours[label], label=label)
        widths.append(int(part["d_model"]))
    for d in dict.fromkeys(widths):
        ax.axhline(d, color="black", ls=":", lw=1, label=f"width d = {d}")
    energy = profile["effective_rank"].attrs.get("energy", 0.99) if "effective_rank" in profile else 0.99
    ax.set_xlabel("source depth (sublayer index, embedding = 0)")
    ax.set_ylabel(f"{kind} effective rank" + (f" ({energy:g} energy)" if kind == "numerical" else ""))
    ax.set_ylim(bottom=0)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), title="model")
    return ax


@styled
def plot_rank_vs_width(table: xr.Dataset, ax=None, *, kind: str = "numerical"):
    """r*/d of checkpoints of several widths (``table``: dims (scheme, width) with variable
    ``collective_rank_ratio`` and a ``rank_kind`` dim), one line per scheme.

    Returns:
        The Axes.
    """
    ax = style_axes(ax) if ax is not None else new_axes((5.2, 3.6))
    ratio = table["collective_rank_ratio"].sel(rank_kind=kind)
    for scheme in ratio["scheme"].values:
        y = ratio.sel(scheme=scheme)
        ax.plot(y["width"].values, y.values, marker="o", color=scheme_color(str(scheme)), label=str(scheme))
    ax.set_xscale("log", base=2)
    widths = np.asarray(ratio["width"].values)
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.set_xlabel("width d")
    ax.set_ylabel(f"r*/d ({kind} rank)")
    ax.legend(title="scheme")
    return ax
