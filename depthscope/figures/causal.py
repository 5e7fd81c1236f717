"""Weight against effect, read depth of DCA's q/k/v views, and each paper's own heatmap.

Primitives (``plot_*``, one panel, ``ax=``) draw an estimator's output: ``analysis.weight_effect``
cells, ``analysis.views``, a native weight variable of a trace, ``analysis.stream_composite``.
The ``*_figure`` wrappers take traces, call those estimators once and lay the panels out for
the report.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.ticker import FuncFormatter

from depthscope.analysis.causal import cell_correlation, views, weight_effect
from depthscope.analysis.native import max_row_sum, routed_shares, stream_composite, write_split
from depthscope.figures.data import trace_label, traces_by_model
from depthscope.figures.heatmaps import make_norm, symlog_ticks, symmetric_vmax
from depthscope.figures.style import DIVERGING_CMAP, model_colors, new_axes, style_axes, styled, subplots

# --- weight against effect ----------------------------------------------------------------------

WEIGHT_EFFECT_X = {"share": "contribution share", "weight": "row-normalised weight"}


@styled
def plot_weight_effect(cells: xr.Dataset, ax=None, *, x: str = "share", color=None, title: str | None = None):
    """Each (consumer, source) cell's ``x`` against its ablation effect (the loss increase when
    the source is removed from that consumer alone), one point per cell.

    ``cells``: ``analysis.weight_effect(trace)``; ``x``: ``"share"`` (contribution share) or
    ``"weight"`` (row-normalised weight).

    Returns:
        The Axes; ``ax.collections[0].get_offsets()`` is (x, effect) of every cell.
    """
    ax = style_axes(ax) if ax is not None else new_axes((4.2, 3.0))
    ax.scatter(cells[x].values, cells["effect"].values, s=9, color=color, alpha=0.75)
    ax.axhline(0.0, color="0.6", linewidth=0.8)
    ax.set_xlabel(WEIGHT_EFFECT_X[x])
    ax.set_ylabel("ablation effect (nats/token)")
    if title:
        ax.set_title(title, loc="left")
    return ax


@styled
def weight_effect_figure(traces):
    """``plot_weight_effect`` of the share and of the weight, one row of two panels per model
    with cell ablations (a trace, a stack or a list of traces), Spearman's rho in each title.

    Returns:
        The Figure (panels ``fig.axes``: share then weight, model by model).
    """
    items = [(label, t) for label, t in traces_by_model(traces) if "ablation_effect_cell" in t]
    if not items:
        raise ValueError("no trace here has ablation_effect_cell (capture with ablate='cells')")
    colours = model_colors((label, t.attrs.get("scheme", "")) for label, t in items)
    fig, axes = subplots(len(items), 2, figsize=(8.4, 2.6 * len(items) + 0.6), squeeze=False)
    for row, (label, t) in zip(axes, items):
        cells = weight_effect(t)
        rho = cell_correlation(cells)
        for ax, x in zip(row, WEIGHT_EFFECT_X):
            title = f"{label}: rho = {float(rho[f'rho_{x}']):.2f}"
            plot_weight_effect(cells, ax, x=x, color=colours[label], title=title)
    fig.suptitle("Does the weight matter? Each cell's weight against its causal effect")
    return fig


# --- read depth of the views of multi-input consumers ------------------------------------------

READ_DEPTH = {"mean_lag": "mean lag (sublayers back)", "embed_mass": "weight on the embedding"}
VIEW_STYLES = {"q": ("-", "o"), "k": ("--", "s"), "v": (":", "^")}


@styled
def plot_read_depth(views: xr.Dataset, ax=None, *, var: str = "mean_lag"):
    """How far back each view of a multi-input consumer reads (DCA's q, k, v), block by block.

    ``views``: ``analysis.views(trace)``; ``var``: ``"mean_lag"`` (the mass-weighted mean lag)
    or ``"embed_mass"`` (the weight on the embedding). One line per view, in the views' order.

    Returns:
        The Axes.
    """
    if views.sizes.get("view", 0) == 0:
        raise ValueError("the trace has no multi-input consumers (DCA's q/k/v views)")
    ax = style_axes(ax) if ax is not None else new_axes((4.5, 3.4))
    for name in views["view"].values:
        ls, marker = VIEW_STYLES.get(str(name), ("-", "."))
        ax.plot(
            views["block"].values,
            views[var].sel(view=name).values,
            linestyle=ls,
            marker=marker,
            label=str(name),
        )
    ax.set_xlabel("block")
    ax.set_ylabel(READ_DEPTH[var])
    ax.legend(title="view")
    return ax


@styled
def read_depth_figure(trace: xr.Dataset):
    """``plot_read_depth`` of the mean lag (left) and of the mass on the embedding (right).

    Returns:
        The Figure.
    """
    v = views(trace)
    fig, axes = subplots(1, 2, figsize=(9.0, 3.4))
    for ax, var in zip(axes, READ_DEPTH):
        plot_read_depth(v, ax, var=var)
    fig.suptitle(f"{trace.attrs.get('label', '')}: how far back the query, key and value inputs read")
    return fig


# --- the papers' own heatmaps ------------------------------------------------------------------

NATIVE = ("dwa_alpha", "hc_res", "attnres_alpha", "comb", "frac_res", "depth_write")
KIND_PANELS = {"attn": "pre-attention", "mlp": "pre-MLP", "readout": "read-out"}


def _drawable(trace: xr.Dataset, name: str) -> bool:
    """Whether the trace has ``name`` with a value in it (a format-1 stack pads the others with NaN)."""
    return name in trace and bool(trace[name].notnull().any())


def has_native(trace: xr.Dataset) -> bool:
    """Whether the trace holds weights in a parametrisation ``native_figure`` draws."""
    return any(_drawable(trace, name) for name in NATIVE)


@styled
def plot_dwa(alpha: xr.DataArray, ax=None, *, title: str | None = None):
    """DenseFormer's DWA weights as its paper's Fig. 5 (arXiv 2402.02622): rows = the DWA after
    block i, columns = the block outputs X_0..X_i, symmetric-log scale (+-1, 0.368, 0.135, 0.05).

    ``alpha``: a trace's ``dwa_alpha`` (dims dwa, state).

    Returns:
        The Axes (its colour bar labelled in plain numbers, never mathtext).
    """
    alpha = alpha.transpose("dwa", "state")
    if ax is None:
        ax = new_axes((0.32 * alpha.sizes["state"] + 2.4, 0.32 * alpha.sizes["dwa"] + 1.4))
    vmax = symmetric_vmax(alpha.values)
    im = ax.imshow(
        np.ma.masked_invalid(alpha.values),
        cmap=DIVERGING_CMAP,
        norm=make_norm(vmax, symlog=True),
        aspect="auto",
    )
    ax.set_xticks(range(alpha.sizes["state"]), [str(s) for s in alpha["state"].values], rotation=90)
    ax.set_yticks(range(alpha.sizes["dwa"]), [f"DWA {d}" for d in alpha["dwa"].values])
    ax.set_xlabel("block output X_j")
    ax.set_ylabel("depth-weighted average after block i")
    cb = ax.figure.colorbar(im, ax=ax, pad=0.02)
    cb.set_ticks(symlog_ticks(vmax))
    cb.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}"))  # plain text, no mathtext
    cb.set_label("DWA weight alpha[i, j]")
    ax.set_title(
        "DWA weights as DenseFormer's Fig. 5 (arXiv 2402.02622)" if title is None else title, loc="left"
    )
    return ax


def entry_names(n: int) -> list[str]:
    """Block AttnRes' entries: the embedding, the completed blocks, the partial sum."""
    return ["embed"] + [f"block {b}" for b in range(1, n - 1)] + ["partial"]


@styled
def plot_entries(alpha: xr.DataArray, ax=None, *, kind: str = "attn"):
    """Block AttnRes' softmax weights over its entries (embedding, block sums, partial sum) for
    the consumers of one ``kind`` (``attn``, ``mlp``, ``readout``), as the paper's Fig. 8
    (arXiv 2603.15031).

    ``alpha``: a trace's ``attnres_alpha`` (dims layer, entry; with the ``layer_kind``
    coordinate).

    Returns:
        The Axes (colour scale 0 to 1).
    """
    ax = style_axes(ax) if ax is not None else new_axes((4.2, 3.6))
    sub = alpha.transpose("layer", "entry").isel(layer=np.flatnonzero(alpha["layer_kind"].values == kind))
    n = alpha.sizes["entry"]
    ax.imshow(np.ma.masked_invalid(sub.values), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(n), entry_names(n), rotation=90)
    ax.set_yticks(range(sub.sizes["layer"]), [str(x) for x in sub["layer"].values])
    ax.set_title(KIND_PANELS.get(kind, kind), loc="left")
    return ax


@styled
def plot_stream_matrix(
    matrix: xr.DataArray, ax=None, *, vmax: float | None = None, title: str = "", unit: str = "stream"
):
    """One stream-mixing matrix (source stream x target stream), each value written in its cell.

    ``matrix``: one consumer's ``hc_res`` or ``comb`` (``trace["hc_res"].sel(layer=...)``), or
    ``analysis.stream_composite`` of them; diverging colours over +-``vmax`` (default
    max(1, max |value|)); ``unit`` names what the rows and columns are (Frac-Connections: fractions).

    Returns:
        The Axes.
    """
    ax = style_axes(ax) if ax is not None else new_axes((3.4, 3.2))
    m = matrix.transpose("stream_from", "stream_to").values
    vmax = max(1.0, float(np.nanmax(np.abs(m)))) if vmax is None else vmax
    ax.imshow(m, cmap=DIVERGING_CMAP, vmin=-vmax, vmax=vmax)
    for (r, c), value in np.ndenumerate(m):
        ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(m.shape[1]))
    ax.set_yticks(range(m.shape[0]))
    ax.set_xlabel(f"target {unit}")
    ax.set_ylabel(f"source {unit}")
    ax.set_title(title, loc="left")
    return ax


@styled
def native_figure(trace: xr.Dataset):
    """The model's weights in its own parametrisation, drawn the way its paper draws them.

    * DenseFormer (arXiv 2402.02622, Fig. 5): ``plot_dwa``;
    * Block AttnRes (arXiv 2603.15031, Fig. 8): ``plot_entries`` of the pre-attention, pre-MLP
      and read-out inputs in separate panels;
    * HC / mHC (arXiv 2409.19606; 2512.24880 Fig. 8) and DeepSeek-V4's ``comb``:
      ``plot_stream_matrix`` of H_res of the first, a middle and the last sublayer, and of their
      composite over depth (``analysis.stream_composite``);
    * the schemes that attend over depth inside attention (MoDA, Depth-Attention, the value
      residual): ``plot_depth_rows``.

    Returns:
        The Figure, or None when the trace has none of these.
    """
    label = trace_label(trace) if "label" in trace.attrs else ""
    if _drawable(trace, "dwa_alpha"):
        title = f"{label}: DWA weights as DenseFormer's Fig. 5 (arXiv 2402.02622)"
        return plot_dwa(trace["dwa_alpha"], title=title).figure
    if _drawable(trace, "attnres_alpha"):
        return _entries_figure(trace["attnres_alpha"], label)
    for name in ("hc_res", "comb"):
        if _drawable(trace, name):
            return _streams_figure(trace[name], label)
    if _drawable(trace, "frac_res"):
        return _streams_figure(fraction_matrix(trace["frac_res"]), label, unit="fraction")
    if _drawable(trace, "depth_write"):
        return plot_depth_rows(trace)
    return None


@styled
def plot_depth_rows(trace: xr.Dataset):
    """Depth mixing inside attention, beside the stream's: per attention layer (rows) and block
    whose memory it read (columns), the attention mass each block gets (token and head mean; the
    value residual's lambdas) and each block's share of the attention's write
    (``analysis.native.write_split``, rows sum to 1); then the read-out's shares by block, through
    the stream alone and counting what came through attention (``analysis.native.routed_shares``).

    Returns:
        The Figure.
    """
    from depthscope.analysis.dilution import block_view

    split = write_split(trace).dropna("layer", how="all")
    mass = trace["depth_mass"].mean("head").sel(layer=split["layer"])
    blocks = [str(j) for j in range(split.sizes["depth"])]
    fig, axes = subplots(1, 3, figsize=(13, 3.6), gridspec_kw={"width_ratios": [1, 1, 1.2]})
    panels = (
        (mass, "attention mass on each block's memory", "viridis", 0.0, 1.0),
        (split, "share of the attention's write", DIVERGING_CMAP, None, None),
    )
    for ax, (da, title, cmap, lo, hi) in zip(axes, panels):
        values = da.transpose("layer", "depth").values
        if lo is None:
            hi = symmetric_vmax(values)
            lo = -hi
        im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
        ax.set_xticks(range(len(blocks)), blocks)
        ax.set_yticks(range(da.sizes["layer"]), [str(x) for x in da["layer"].values])
        ax.set_xlabel("block whose keys / values it read")
        ax.set_title(title, loc="left")
        fig.colorbar(im, ax=ax, pad=0.02)
    stream = block_view(trace)["contribution_share"].sel(layer="readout")
    routed = routed_shares(trace).sel(block=[str(b) for b in stream["source"].values])
    x = np.arange(stream.sizes["source"])
    ax = axes[2]
    ax.bar(x - 0.2, stream.values, 0.4, label="through the stream")
    ax.bar(x + 0.2, routed.values, 0.4, label="counting attention over depth")
    ax.set_xticks(x, [str(b) for b in stream["source"].values], rotation=90)
    ax.set_ylabel("share of the read-out's input")
    ax.set_title("read-out shares by block", loc="left")
    ax.legend(fontsize=7, frameon=False)
    label = trace_label(trace) if "label" in trace.attrs else ""
    fig.suptitle(f"{label}: depth mixing inside attention, beside the stream's")
    return fig


def _entries_figure(alpha: xr.DataArray, label: str):
    fig, axes = subplots(1, 3, figsize=(12, 3.6), gridspec_kw={"width_ratios": [1, 1, 0.6]})
    for ax, kind in zip(axes, KIND_PANELS):
        plot_entries(alpha, ax, kind=kind)
    fig.colorbar(axes[0].images[0], ax=list(axes), pad=0.02, shrink=0.8).set_label(
        "softmax weight over entries"
    )
    fig.suptitle(f"{label}: Block AttnRes weights as the paper's Fig. 8 (arXiv 2603.15031)")
    return fig


def fraction_matrix(res: xr.DataArray) -> xr.DataArray:
    """Frac-Connections' ``frac_res`` as a [layer, stream_from, stream_to] matrix over its units: the
    fractions (depthscope's scheme), or the (fraction, stream) pairs of the package's modules,
    fraction-major.
    """
    if "stream_from" not in res.dims:
        return res.rename(frac_from="stream_from", frac_to="stream_to")
    r = res.transpose("layer", "frac_from", "stream_from", "frac_to", "stream_to")
    n = r.sizes["frac_from"] * r.sizes["stream_from"]
    values = r.values.reshape(r.sizes["layer"], n, n)
    return xr.DataArray(
        values, dims=("layer", "stream_from", "stream_to"), coords={"layer": r["layer"]}, name=res.name
    )


def _streams_figure(res: xr.DataArray, label: str, unit: str = "stream"):
    res = res.dropna("layer", how="all")
    n = res.sizes["layer"]
    composite = stream_composite(res)
    what = "A" if res.name == "frac_res" else "H_res"
    panels = [(f"{what} at {res['layer'].values[i]}", res.isel(layer=i)) for i in sorted({0, n // 2, n - 1})]
    panels.append(("composite over depth", composite))
    vmax = max(1.0, max(float(np.nanmax(np.abs(m.values))) for _, m in panels))
    fig, axes = subplots(1, len(panels), figsize=(3.0 * len(panels) + 1.0, 3.2))
    for ax, (title, m) in zip(axes, panels):
        plot_stream_matrix(m, ax, vmax=vmax, title=title, unit=unit)
    fig.colorbar(axes[-1].images[0], ax=list(axes), pad=0.02, shrink=0.8)
    cite = {
        "comb": "DeepSeek-V4 comb",
        "frac_res": "Frac-Connections' A over fractions (arXiv 2503.14125)",
    }.get(str(res.name), "HC/mHC H_res as mHC's Fig. 8 (arXiv 2512.24880)")
    fig.suptitle(f"{label}: {cite}; composite max row sum {max_row_sum(composite):.2f}")
    return fig
