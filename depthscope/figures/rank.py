"""Collective-rank figures: per-source effective ranks across depth, and r*/d versus width."""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthscope.analysis.rank import effective_ranks
from depthscope.figures.heatmaps import traces_by_model
from depthscope.figures.style import scheme_color, styled
from depthscope.trace.labels import EMBED


@styled
def plot_rank_profile(data, ax=None, *, kind: str = "numerical", energy: float = 0.99):
    """Effective rank of each sublayer's outputs versus its depth, one line per model.

    ``data``: a trace captured with rank=True, a stack of them, or a list. The width d is drawn
    as a dotted line: a layer of rank d uses the whole stream.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    d = None
    for label, t in traces_by_model(data):
        if "source_spectrum" not in t:
            continue
        r = effective_ranks(t["source_spectrum"], energy).sel(rank_kind=kind)
        keep = t["source_kind"] != EMBED
        x = t["source_depth"].where(keep, drop=True).values
        y = r.where(keep, drop=True).values
        ax.plot(x, y, marker="o", ms=3, color=scheme_color(label), label=label)
        d = t.sizes["component"]
    if d is not None:
        ax.axhline(d, color="black", ls=":", lw=1, label=f"width d = {d}")
    ax.set_xlabel("source depth (sublayer index, embedding = 0)")
    ax.set_ylabel(f"{kind} effective rank" + (f" ({energy:g} energy)" if kind == "numerical" else ""))
    ax.set_ylim(bottom=0)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), title="model")
    return ax


@styled
def plot_rank_vs_width(table: xr.Dataset, ax=None, *, kind: str = "numerical"):
    """r*/d of checkpoints of several widths (``table``: dims (scheme, width) with variable
    ``collective_rank_ratio`` and a ``rank_kind`` dim), one line per scheme.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5.2, 3.6))
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
