"""Consumer x source heatmaps of the depth-mixing matrix (or any (layer, source) variable).

Rows are consumers (``layer``) top to bottom in execution order, columns are sources, as in the
DenseFormer / AttnRes / HC papers' weight heatmaps. Unavailable cells (NaN) are masked, so they
stay blank. The colour map is diverging and centred on 0 with a symmetric range; ``symlog=True``
gives the DenseFormer paper's scale (SymLogNorm, base e, ticks at +-1, 0.368, 0.135, 0.05).

Tick labels: with more than ``MAX_TICK_LABELS`` rows or columns only every k-th label is shown
(k even, so the shown labels are all of one sublayer kind; the last label always), with an
unlabelled minor tick on every cell. The full list is never lost: the axis' major formatter maps
every cell index to its label, so
``[ax.xaxis.get_major_formatter()(i) for i in range(n_sources)]`` is the source labels (and
``ax.yaxis`` likewise the consumer labels), whatever is shown.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import xarray as xr
from matplotlib import colormaps
from matplotlib.colors import Colormap, LogNorm, Normalize, SymLogNorm
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from depthscope.analysis.dilution import block_view, row_normalized
from depthscope.errors import DepthscopeError
from depthscope.figures.style import DIVERGING_CMAP, MAX_TICK_LABELS, SEQUENTIAL_CMAP, styled
from depthscope.trace import STACK, select_model

# --- data in --------------------------------------------------------------------------------


def trace_label(trace: xr.Dataset | xr.DataArray) -> str:
    """A trace's display label: attrs ``label``, else ``scheme``, else ``trace``."""
    return str(trace.attrs.get("label", trace.attrs.get("scheme", "trace")))


def traces_by_model(data) -> list[tuple[str, xr.Dataset]]:
    """(label, trace) per model from a trace, a trace stacked along ``model`` (padding dropped by
    ``select_model``) or a list of traces (labels deduplicated as ``stack_traces`` does).
    """
    if isinstance(data, xr.Dataset):
        if STACK not in data.dims:
            return [(trace_label(data), data)]
        return [(str(m), select_model(data, str(m))) for m in data[STACK].values]
    if isinstance(data, xr.DataArray):
        raise DepthscopeError("expected a trace Dataset (or a list of them), got a DataArray")
    out, counts = [], {}
    for t in data:
        if not isinstance(t, xr.Dataset):
            raise DepthscopeError(f"expected trace Datasets, got {type(t).__name__}")
        base = trace_label(t)
        counts[base] = counts.get(base, 0) + 1
        out.append((base if counts[base] == 1 else f"{base}#{counts[base]}", t))
    if not out:
        raise DepthscopeError("no traces to plot")
    return out


def _drop_padding(da: xr.DataArray) -> xr.DataArray:
    """Rows and columns that are NaN everywhere (a stacked model's padding) removed."""
    for dim in da.dims:
        others = [d for d in da.dims if d != dim]
        da = da.isel({dim: np.flatnonzero(da.notnull().any(others).values)})
    return da


def variable(trace: xr.Dataset, var: str) -> xr.DataArray:
    """A (layer, source) variable of a trace, or the derived ``row_normalized`` weight."""
    if var == "row_normalized":
        return row_normalized(trace)
    if var not in trace:
        raise DepthscopeError(f"trace has no variable {var!r}")
    return trace[var]


def _matrix(data, var: str, blocks: bool = False) -> xr.DataArray:
    """The 2-D DataArray to draw: (layer, source) when both dims are present."""
    if isinstance(data, xr.Dataset):
        if STACK in data.dims:
            if data.sizes[STACK] != 1:
                raise DepthscopeError(f"{data.sizes[STACK]} models in one trace: use plot_heatmap_grid")
            data = select_model(data, str(data[STACK].values[0]))
        da = variable(block_view(data) if blocks else data, var)
    elif isinstance(data, xr.DataArray):
        da = data
        if STACK in da.dims:
            if da.sizes[STACK] != 1:
                raise DepthscopeError(f"{da.sizes[STACK]} models in one array: use plot_heatmap_grid")
            da = _drop_padding(da.isel({STACK: 0}))
    else:
        raise DepthscopeError(f"expected a trace Dataset or a DataArray, got {type(data).__name__}")
    if da.ndim != 2:
        raise DepthscopeError(f"a heatmap needs a 2-D array, got dims {da.dims}")
    if {"layer", "source"} <= set(da.dims):
        da = da.transpose("layer", "source")
    return da


def colorbar_label(da: xr.DataArray) -> str:
    """``long_name [units]`` (or the name), dimensionless units ``1`` left out."""
    name = da.attrs.get("long_name") or da.name or ""
    units = str(da.attrs.get("units", ""))
    return f"{name} [{units}]" if units and units != "1" else str(name)


def _labels(da: xr.DataArray, dim: str) -> list[str]:
    return [str(v) for v in da[dim].values] if dim in da.coords else [str(i) for i in range(da.sizes[dim])]


# --- scales ---------------------------------------------------------------------------------


def symmetric_vmax(values) -> float:
    """Max |finite value|, or 1 when there is none (or all are 0): the colour range is +-vmax."""
    v = np.asarray(values, dtype=float)
    v = np.abs(v[np.isfinite(v)])
    top = float(v.max()) if v.size else 0.0
    return top if top > 0 else 1.0


def symlog_ticks(vmax: float, linthresh: float = 0.05) -> list[float]:
    """0, +-linthresh and +-e^k above it, up to vmax: the DenseFormer paper's colour-bar ticks
    (+-1, 0.368, 0.135, 0.05 for vmax = 1).
    """
    tol = 1 + 1e-9
    mags = [linthresh] if linthresh <= vmax * tol else []
    k = math.floor(math.log(vmax * tol))
    while math.exp(k) > linthresh * tol:
        mags.append(math.exp(k))
        k -= 1
    mags = sorted(set(mags))
    return [-m for m in reversed(mags)] + [0.0] + mags


def make_norm(vmax: float, *, symlog: bool = False, linthresh: float = 0.05) -> Normalize:
    """A colour norm centred on 0 from -vmax to vmax, linear or symmetric-log (base e)."""
    if symlog:
        return SymLogNorm(linthresh=linthresh, linscale=1.0, vmin=-vmax, vmax=vmax, base=math.e)
    return Normalize(vmin=-vmax, vmax=vmax)


def log_range(values) -> tuple[float, float]:
    """(vmin, vmax) of a log colour scale: the smallest positive and the largest finite value
    (vmin at least vmax / 1e4, so that a few tiny cells do not wash out the rest).
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    top = float(v.max()) if v.size else 1.0
    return max(float(v.min()) if v.size else top / 10, top * 1e-4), top


def _cmap(cmap: str | Colormap) -> Colormap:
    base = colormaps[cmap] if isinstance(cmap, str) else cmap
    return base.with_extremes(bad=(0.0, 0.0, 0.0, 0.0))  # NaN (unavailable) cells stay blank


# --- ticks and size -------------------------------------------------------------------------


def _set_labels(axis, labels: list[str], max_labels: int = MAX_TICK_LABELS) -> None:
    """Ticks on the cells of ``axis``: every label, or every k-th (and the last) when too many."""
    n = len(labels)
    step = max(1, math.ceil(n / max_labels))
    step += step % 2 if step > 1 else 0  # even: labels land on one sublayer kind (every *.mlp)
    shown = list(range(0, n, step))
    if shown and shown[-1] != n - 1:
        shown[-1] = n - 1  # keep the last label (the read-out); drop the one too close to it

    def label_of(x, _pos=None):
        i = int(round(x))
        return labels[i] if 0 <= i < n and abs(x - i) < 1e-6 else ""

    axis.set_major_locator(FixedLocator(shown))
    axis.set_major_formatter(FuncFormatter(label_of))
    axis.set_minor_locator(FixedLocator(range(n)) if step > 1 else NullLocator())


def heatmap_size(n_rows: int, n_cols: int, *, colorbar: bool = True) -> tuple[float, float]:
    """Figure size (inches) for one heatmap: cells of 0.12-0.3 in, plus room for labels."""
    cell = min(0.3, max(0.12, 8.0 / max(n_rows, n_cols, 1)))
    return n_cols * cell + (2.4 if colorbar else 1.3), n_rows * cell + 1.5


def _cell_points(ax, n_rows: int, n_cols: int) -> float:
    """Smaller cell side in points, from the Axes' current size."""
    fig = ax.figure
    w, h = fig.get_size_inches()
    pos = ax.get_position()
    return 72 * min(pos.width * w / max(n_cols, 1), pos.height * h / max(n_rows, 1))


def _annotate(ax, values: np.ndarray, norm: Normalize) -> None:
    n_rows, n_cols = values.shape
    size = min(8.0, max(3.5, _cell_points(ax, n_rows, n_cols) / 3.4))
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            dark = abs(float(norm(v)) - 0.5) > 0.3  # the saturated ends of the diverging map
            ax.text(
                j, i, f"{v:.2f}", ha="center", va="center", fontsize=size, color="white" if dark else "black"
            )


# --- plots ----------------------------------------------------------------------------------


@styled
def plot_heatmap(
    data,
    ax=None,
    *,
    var: str = "mixing",
    symlog: bool = False,
    log: bool | None = None,
    linthresh: float = 0.05,
    vmax: float | None = None,
    vmin: float | None = None,
    cmap: str | Colormap | None = None,
    annotate: bool = False,
    title: str | None = None,
    colorbar: bool = True,
    blocks: bool = False,
):
    """Consumer x source heatmap of ``mixing`` (or ``var`` of a trace, or any 2-D DataArray).

    Args:
        data: a trace (``var`` is drawn; a one-model stack is unpadded), or a DataArray with
            dims (layer, source) (any other 2-D array: rows = its first dim).
        symlog: SymLogNorm (base e, linear within +-linthresh), the DenseFormer paper's scale.
        log: a sequential colour map on a log scale from ``vmin`` to ``vmax`` (non-negative
            quantities; zeros get the lowest colour); default: for ``row_normalized`` only, whose
            rows fall as 1/n_l with depth.
        vmax: colour range +-vmax (log: up to vmax); default max |value| (1 for an all-zero or
            all-NaN array).
        annotate: write each value in its cell.
        title: default the trace's label (none for a bare DataArray).
        colorbar: draw the colour bar (``ax.images[0].colorbar``), labelled ``long_name [units]``.
        blocks: draw the block-level view (``analysis.block_view``: a block's sources summed, its
            consumers averaged), for deep models.

    Returns:
        The Axes; ``ax.images[0].get_array()`` is the data with NaN cells masked.
    """
    da = _matrix(data, var, blocks)
    rows, cols = da.dims
    values = np.asarray(da.values, dtype=float)
    log = da.name == "row_normalized" if log is None else log
    if log:
        lo, hi = log_range(values)
        vmin, vmax = (lo if vmin is None else float(vmin)), (hi if vmax is None else float(vmax))
        norm = LogNorm(vmin=vmin, vmax=vmax)
        values = np.where(np.isfinite(values), np.maximum(values, vmin), np.nan)
        cmap = SEQUENTIAL_CMAP if cmap is None else cmap
    else:
        vmax = symmetric_vmax(values) if vmax is None else float(vmax)
        norm = make_norm(vmax, symlog=symlog, linthresh=linthresh)
        cmap = DIVERGING_CMAP if cmap is None else cmap
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=heatmap_size(*values.shape, colorbar=colorbar))
    im = ax.imshow(
        np.ma.masked_invalid(values), cmap=_cmap(cmap), norm=norm, aspect="auto", interpolation="nearest"
    )
    _set_labels(ax.xaxis, _labels(da, cols))
    _set_labels(ax.yaxis, _labels(da, rows))
    ax.tick_params(axis="x", labelrotation=90)
    ax.tick_params(which="minor", length=1.5)
    for spine in ax.spines.values():  # the matrix's own edge is frame enough
        spine.set_visible(False)
    ax.set_xlabel(("source block" if blocks else "source") if cols == "source" else cols)
    ax.set_ylabel(("consumer block" if blocks else "consumer (layer)") if rows == "layer" else rows)
    if title is None and isinstance(data, xr.Dataset):
        title = trace_label(data) if STACK not in data.dims else str(data[STACK].values[0])
    if title:
        ax.set_title(title)
    if annotate:
        _annotate(ax, values, norm)
    if colorbar:
        _colorbar(ax.figure, im, ax, colorbar_label(da), symlog=symlog, vmax=vmax, linthresh=linthresh)
    return ax


def _colorbar(
    fig, mappable, ax, label: str, *, symlog: bool, vmax: float, linthresh: float, shrink: float = 1.0
):
    cb = fig.colorbar(mappable, ax=ax, shrink=shrink, pad=0.02, aspect=30)
    cb.set_label(textwrap.fill(label, 45))
    if symlog:
        cb.set_ticks(symlog_ticks(vmax, linthresh))
        cb.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}"))
        cb.ax.yaxis.set_minor_locator(NullLocator())
    cb.outline.set_visible(False)
    return cb


def _panels(data, var: str, blocks: bool = False) -> list[tuple[str, xr.DataArray]]:
    """(label, 2-D array without padding) per model."""
    if isinstance(data, xr.DataArray):
        if STACK in data.dims:
            return [(str(m), _matrix(data.sel({STACK: [m]}), var)) for m in data[STACK].values]
        return [(str(data.attrs.get("label", data.name or "")), _matrix(data, var))]
    if not isinstance(data, xr.Dataset):
        data = list(data)
    if isinstance(data, list) and data and all(isinstance(d, xr.DataArray) for d in data):
        return [(str(d.attrs.get("label", d.name or i)), _matrix(d, var)) for i, d in enumerate(data)]
    return [(label, _matrix(t, var, blocks)) for label, t in traces_by_model(data)]


def _default_ncols(n: int) -> int:
    """1-3 panels in a row; more in a near-square grid (4 -> 2 x 2, 6 -> 2 x 3, 9 -> 3 x 3)."""
    return n if n <= 3 else math.ceil(math.sqrt(n))


@styled
def plot_heatmap_grid(
    data,
    var: str = "row_normalized",
    *,
    symlog: bool = False,
    linthresh: float = 0.05,
    ncols: int | None = None,
    vmax: float | None = None,
    cmap: str | Colormap | None = None,
    annotate: bool = False,
    log: bool | None = None,
    blocks: bool = False,
):
    """One heatmap panel per model on one shared colour scale (one colour bar for the figure).

    ``data``: a trace stacked along ``model`` (each panel without the padding rows/columns of
    models with fewer consumers), a list of traces, or a list of 2-D DataArrays. ``var`` is the
    row-normalised weight by default (``analysis.row_normalized``: each row of |M| over its sum,
    so a standard residual reads 1/n_l whatever the scheme's read-out scale), drawn on a log
    scale (``log``, as in ``plot_heatmap``); ``"mixing"`` is the raw M. Panels are
    ``fig.axes[:n]`` in model order, titled by the model labels;
    ``fig.axes[-1]`` is the colour bar. Column widths and row heights follow the panels' source
    and consumer counts.

    Returns:
        The Figure.
    """
    import matplotlib.pyplot as plt

    panels = _panels(data, var, blocks)
    n = len(panels)
    if n == 0:
        raise DepthscopeError("no models to plot")
    ncols = max(1, min(ncols or _default_ncols(n), n))
    nrows = math.ceil(n / ncols)
    every = np.concatenate([p.values.ravel() for _, p in panels])
    log = panels[0][1].name == "row_normalized" if log is None else log
    vmin = None
    if log:
        vmin, top = log_range(every)
        vmax = top if vmax is None else float(vmax)
    elif vmax is None:
        vmax = symmetric_vmax(every)
    grid = [panels[r * ncols : (r + 1) * ncols] for r in range(nrows)]
    heights = [max(p.shape[0] for _, p in row) for row in grid]
    widths = [max(panels[i][1].shape[1] for i in range(c, n, ncols)) for c in range(ncols)]
    # one cell size for the whole figure, small enough to keep it within ~18 x 16 inches
    cell = max(0.08, min(0.22, 14.0 / sum(widths), 11.0 / sum(heights)))
    figsize = (sum(widths) * cell + 1.9 * ncols + 1.2, sum(heights) * cell + 1.6 * nrows)
    fig = plt.figure(figsize=figsize)
    gs = fig.add_gridspec(nrows, ncols, width_ratios=widths, height_ratios=heights)
    axes = []
    for i, (label, da) in enumerate(panels):
        r, c = divmod(i, ncols)
        ax = fig.add_subplot(gs[r, c])
        plot_heatmap(
            da,
            ax,
            symlog=symlog,
            log=log,
            linthresh=linthresh,
            vmax=vmax,
            vmin=vmin,
            cmap=cmap,
            annotate=annotate,
            title=label,
            colorbar=False,
        )
        if c != 0:
            ax.set_ylabel("")
        if i + ncols < n:  # another panel below: its x label suffices
            ax.set_xlabel("")
        axes.append(ax)
    label = colorbar_label(panels[0][1])
    _colorbar(
        fig,
        axes[0].images[0],
        axes,
        label,
        symlog=symlog,
        vmax=vmax,
        linthresh=linthresh,
        shrink=0.6 if nrows == 1 else 0.5,
    )
    return fig
