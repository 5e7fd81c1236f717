"""Weight against effect, read depth of DCA's q/k/v views, and each paper's own heatmap.

Data in (traces; the numbers come from ``depthscope.analysis``), matplotlib Figure out.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.ticker import FuncFormatter

from depthscope.analysis.causal import views, weight_effect, weight_effect_correlation
from depthscope.figures.heatmaps import make_norm, symlog_ticks, symmetric_vmax, traces_by_model
from depthscope.figures.style import DIVERGING_CMAP, scheme_color, style_axes, styled


@styled
def plot_weight_effect(data):
    """Each (consumer, source) cell's contribution share and row-normalised weight against its
    ablation effect (the loss increase when the source is removed from that consumer alone), one
    row of two panels per model, Spearman's rho in each panel's title.

    Returns:
        The Figure (panels ``fig.axes``: share then weight, model by model).
    """
    import matplotlib.pyplot as plt

    items = [(label, t) for label, t in traces_by_model(data) if "ablation_effect_cell" in t]
    if not items:
        raise ValueError("no trace here has ablation_effect_cell (capture with ablate='cells')")
    fig, axes = plt.subplots(len(items), 2, figsize=(8.4, 2.6 * len(items) + 0.6), squeeze=False)
    for row, (label, t) in zip(axes, items):
        cells, rho = weight_effect(t), weight_effect_correlation(t)
        for ax, name, xlabel in zip(
            row, ("share", "weight"), ("contribution share", "row-normalised weight")
        ):
            ax.scatter(cells[name].values, cells["effect"].values, s=9, color=scheme_color(label), alpha=0.75)
            ax.axhline(0.0, color="0.6", linewidth=0.8)
            ax.set_title(f"{label}: rho = {float(rho[f'rho_{name}']):.2f}", loc="left")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("ablation effect (nats/token)")
            style_axes(ax)
    fig.suptitle("Does the weight matter? Each cell's weight against its causal effect")
    return fig


@styled
def plot_read_depth(trace: xr.Dataset):
    """How far back each view of a multi-input consumer reads (DCA's q, k, v), block by block:
    the mass-weighted mean lag (left) and the mass on the embedding (right).
    """
    import matplotlib.pyplot as plt

    v = views(trace)
    if v.sizes.get("view", 0) == 0:
        raise ValueError("the trace has no multi-input consumers (DCA's q/k/v views)")
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    styles = {"q": ("-", "o"), "k": ("--", "s"), "v": (":", "^")}
    for name in v["view"].values:
        ls, marker = styles.get(str(name), ("-", "."))
        for ax, var in zip(axes, ("mean_lag", "embed_mass")):
            ax.plot(
                v["block"].values, v[var].sel(view=name).values, linestyle=ls, marker=marker, label=str(name)
            )
    axes[0].set_ylabel("mean lag (sublayers back)")
    axes[1].set_ylabel("weight on the embedding")
    for ax in axes:
        ax.set_xlabel("block")
        ax.legend(title="view")
        style_axes(ax)
    fig.suptitle(f"{trace.attrs.get('label', '')}: how far back the query, key and value inputs read")
    return fig


# --- the papers' own heatmaps ------------------------------------------------------------------

NATIVE = ("dwa_alpha", "hc_res", "attnres_alpha", "comb")


def has_native(trace: xr.Dataset) -> bool:
    return any(name in trace for name in NATIVE)


@styled
def plot_native(trace: xr.Dataset):
    """The model's weights in its own parametrisation, drawn the way its paper draws them.

    * DenseFormer (arXiv 2402.02622, Fig. 5): the DWA weights alpha, rows = DWA after block i,
      columns = block outputs X_0..X_i, symmetric-log scale (+-1, 0.368, 0.135, 0.05);
    * Block AttnRes (arXiv 2603.15031, Fig. 8): the softmax over its entries (embedding, block sums,
      partial sum), pre-attention and pre-MLP inputs in separate panels;
    * HC / mHC (arXiv 2409.19606; 2512.24880 Fig. 8) and DeepSeek-V4's ``comb``: the stream-mixing
      matrix H_res (source stream x target stream) of the first, a middle and the last sublayer,
      and their composite over depth (the product of the token-mean matrices).

    Returns:
        The Figure, or None when the trace has none of these.
    """
    if "dwa_alpha" in trace:
        return _dwa(trace)
    if "attnres_alpha" in trace:
        return _entries(trace)
    for name in ("hc_res", "comb"):
        if name in trace:
            return _streams(trace, name)
    return None


def _dwa(trace):
    import matplotlib.pyplot as plt

    alpha = trace["dwa_alpha"]
    vmax = symmetric_vmax(alpha.values)
    norm = make_norm(vmax, symlog=True)
    fig, ax = plt.subplots(figsize=(0.32 * alpha.sizes["state"] + 2.4, 0.32 * alpha.sizes["dwa"] + 1.4))
    im = ax.imshow(np.ma.masked_invalid(alpha.values), cmap=DIVERGING_CMAP, norm=norm, aspect="auto")
    ax.set_xticks(range(alpha.sizes["state"]), [str(s) for s in alpha["state"].values], rotation=90)
    ax.set_yticks(range(alpha.sizes["dwa"]), [f"DWA {d}" for d in alpha["dwa"].values])
    ax.set_xlabel("block output X_j")
    ax.set_ylabel("depth-weighted average after block i")
    cb = fig.colorbar(im, ax=ax, pad=0.02)
    cb.set_ticks(symlog_ticks(vmax))
    cb.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}"))  # plain text, no mathtext
    cb.set_label("alpha_{i,j}")
    ax.set_title(
        f"{trace.attrs.get('label', '')}: DWA weights as DenseFormer's Fig. 5 (arXiv 2402.02622)", loc="left"
    )
    return fig


def _entries(trace):
    import matplotlib.pyplot as plt

    alpha = trace["attnres_alpha"]
    n = alpha.sizes["entry"]
    names = ["embed"] + [f"block {b}" for b in range(1, n - 1)] + ["partial"]
    kinds = trace["layer_kind"].values
    panels = [
        ("pre-attention", kinds == "attn"),
        ("pre-MLP", kinds == "mlp"),
        ("read-out", kinds == "readout"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), gridspec_kw={"width_ratios": [1, 1, 0.6]})
    for ax, (title, rows) in zip(axes, panels):
        sub = alpha.isel(layer=np.flatnonzero(rows))
        im = ax.imshow(np.ma.masked_invalid(sub.values), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(n), names, rotation=90)
        ax.set_yticks(range(sub.sizes["layer"]), [str(x) for x in sub["layer"].values])
        ax.set_title(title, loc="left")
    fig.colorbar(im, ax=list(axes), pad=0.02, shrink=0.8).set_label("softmax weight over entries")
    fig.suptitle(
        f"{trace.attrs.get('label', '')}: Block AttnRes weights as the paper's Fig. 8 (arXiv 2603.15031)"
    )
    return fig


def _streams(trace, name: str):
    import matplotlib.pyplot as plt

    res = trace[name].dropna("layer", how="all")
    n = res.sizes["layer"]
    picks = sorted({0, n // 2, n - 1})
    mats = [res.isel(layer=i).values for i in picks]
    composite = np.eye(mats[0].shape[0])
    for i in range(n):
        composite = composite @ res.isel(layer=i).values  # source-row: h_final = C^T h_0
    panels = [(f"H_res at {res['layer'].values[i]}", m) for i, m in zip(picks, mats)] + [
        ("composite over depth", composite)
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.0 * len(panels) + 1.0, 3.2))
    vmax = max(1.0, max(float(np.nanmax(np.abs(m))) for _, m in panels))
    for ax, (title, m) in zip(axes, panels):
        im = ax.imshow(m, cmap=DIVERGING_CMAP, vmin=-vmax, vmax=vmax)
        for (r, c), value in np.ndenumerate(m):
            ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(m.shape[1]))
        ax.set_yticks(range(m.shape[0]))
        ax.set_xlabel("target stream")
        ax.set_ylabel("source stream")
        ax.set_title(title, loc="left")
    fig.colorbar(im, ax=list(axes), pad=0.02, shrink=0.8)
    gain = float(np.abs(composite).sum(1).max())
    cite = "DeepSeek-V4 comb" if name == "comb" else "HC/mHC H_res as mHC's Fig. 8 (arXiv 2512.24880)"
    fig.suptitle(f"{trace.attrs.get('label', '')}: {cite}; composite max row sum {gain:.2f}")
    return fig
