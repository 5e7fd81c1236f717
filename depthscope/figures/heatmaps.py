"""Consumer x source heatmaps of the depth-mixing matrix (or any (layer, source) variable).

Data in: a (layer, source) DataArray, a trace's variable or an estimator's output
(``analysis.row_normalized``), with a ``model`` dimension for the grid; or a Dataset (a trace, a
stack, ``analysis.block_view`` of either) and the name of the variable to draw.

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
from matplotlib.colors import Colormap, LogNorm, Normalize, SymLogNorm, TwoSlopeNorm
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from depthscope.errors import DepthscopeError
from depthscope.figures.data import by_model, trace_label, unpadded
from depthscope.figures.style import (
    DIVERGING_CMAP,
    MAX_TICK_LABELS,
    SEQUENTIAL_CMAP,
    new_figure,
    styled,
    subplots,
)
from depthscope.trace import STACK
from depthscope.trace.labels import BLOCK

# --- data in --------------------------------------------------------------------------------


def _matrix(da: xr.DataArray) -> xr.DataArray:
    """The 2-D array to draw: (layer, source) when both dims are present."""
    if da.ndim != 2:
        raise DepthscopeError(f"a heatmap needs a 2-D array, got dims {da.dims}")
    return da.transpose("layer", "source") if {"layer", "source"} <= set(da.dims) else da


def _select(data, var: str) -> xr.DataArray:
    """``data`` itself (a DataArray) or its variable ``var`` (a Dataset)."""
    if isinstance(data, xr.DataArray):
        return data
    if not isinstance(data, xr.Dataset):
        raise DepthscopeError(f"expected a DataArray or a Dataset, got {type(data).__name__}")
    if var not in data:
        raise DepthscopeError(
            f"no variable {var!r} to draw (variables: {', '.join(map(str, data.data_vars))})"
        )
    return data[var]


def heatmap_panels(data, var: str = "mixing") -> list[tuple[str, xr.DataArray]]:
    """(label, 2-D array) per panel: one per model of ``data`` (a DataArray, or a Dataset's
    ``var``; a stack's padding dropped), or one per array of a sequence of 2-D DataArrays.
    """
    if isinstance(data, (list, tuple)):
        if not all(isinstance(d, xr.DataArray) for d in data):
            raise DepthscopeError("expected 2-D DataArrays (several traces: stack_traces them first)")
        return [(str(d.attrs.get("label", d.name or "")), _matrix(d)) for d in data]
    da = _select(data, var)
    if STACK in da.dims:
        return [(label, _matrix(unpadded(part))) for label, _, part in by_model(da)]
    label = trace_label(data) if isinstance(data, xr.Dataset) else str(da.attrs.get("label", ""))
    return [(label, _matrix(da))]


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


LABEL_INCHES = 0.14  # room one tick label needs along an axis (the house style's 7-point labels)


def _set_labels(axis, labels: list[str], max_labels: int = MAX_TICK_LABELS, cell_inches: float = 0.0) -> bool:
    """Ticks on the cells of ``axis``: every label; when too many, grouped by block (``_block_ticks``);
    otherwise every k-th label, the last kept. ``cell_inches``: one cell's length on the page.
    Returns whether the ticks name blocks.
    """
    n = len(labels)
    grouped = n > max_labels and sum("." in label for label in labels) > n // 2
    if grouped:
        shown, names, minor = _block_ticks(labels, max_labels, cell_inches)
    else:
        step = max(1, math.ceil(n / max_labels))
        step += step % 2 if step > 1 else 0  # even: labels land on one sublayer kind (every *.mlp)
        shown = list(range(0, n, step))
        if shown and shown[-1] != n - 1:
            shown[-1] = n - 1  # keep the last label (the read-out); drop the one too close to it
        names = dict(enumerate(labels))
        minor = list(range(n)) if len(shown) < n else []

    def label_of(x, _pos=None):
        i = int(round(x))
        return names.get(i, "") if 0 <= i < n and abs(x - i) < 1e-6 else ""

    axis.set_major_locator(FixedLocator(shown))
    axis.set_major_formatter(FuncFormatter(label_of))
    axis.set_minor_locator(FixedLocator(minor) if minor else NullLocator())
    return grouped


def _block_ticks(labels: list[str], max_labels: int, cell_inches: float) -> tuple[list[int], dict, list[int]]:
    """(major ticks, their names, minor ticks) of an axis of sublayers grouped by block: a deep model's
    ``12.attn``, ``12.mlp`` ... become one tick ``12`` at its block's first cell, every m-th block,
    with a minor tick at every block. Every block is named by its number alone, the last block too;
    a cell outside the blocks (``embed``, ``readout``) keeps its name and is always labelled. Two
    labels one cell apart only where a cell is long enough to hold a label.
    """
    n = len(labels)
    blocks = [label.split(".")[0] for label in labels]
    firsts = [i for i in range(n) if "." in labels[i] and (i == 0 or blocks[i] != blocks[i - 1])]
    names = {i: blocks[i] if "." in labels[i] else labels[i] for i in range(n)}
    own = [i for i in (0, n - 1) if "." not in labels[i]]  # embed, readout: always shown
    shown = [*own, *firsts[:1], *firsts[-1:]]  # and the first and last blocks
    least = 1.0 if cell_inches >= 0.75 * LABEL_INCHES else n / max_labels  # cells between two labels
    every = max(1, math.ceil(len(firsts) / max_labels))
    if firsts and own and abs(firsts[0] - own[0]) < least:
        shown.remove(firsts[0])  # block 0 beside the embedding without room: the embedding is named
    for i in firsts[::every]:
        if all(abs(i - j) >= least for j in shown):
            shown.append(i)
    minor = sorted({*firsts, *own})
    return sorted(set(shown)), names, minor


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


def _is_blocks(da: xr.DataArray, dim: str) -> bool:
    """Whether ``dim`` holds whole blocks (``analysis.block_view``), from its kind coordinate."""
    kind = da.coords.get(f"{dim}_kind")
    return kind is not None and BLOCK in set(np.asarray(kind.values).ravel().tolist())


def _axis_label(da: xr.DataArray, dim: str) -> str:
    if dim == "source":
        return "source block" if _is_blocks(da, dim) else "source"
    if dim == "layer":
        return "consumer block" if _is_blocks(da, dim) else "consumer (layer)"
    return dim


def _scale(values: np.ndarray, *, log: bool, symlog: bool, linthresh: float, vmin, vmax, cmap, center=None):
    """(values to draw, norm, colour map, vmax) of one heatmap: log (sequential, values below
    vmin raised to it), centred on 0 (diverging, linear or symlog; ``vmin`` default -vmax), or
    linear centred on ``center`` (diverging, each side its own range: ``vmin`` and ``vmax`` default
    to the data's extent around it).
    """
    if log:
        lo, hi = log_range(values)
        vmin, vmax = (lo if vmin is None else float(vmin)), (hi if vmax is None else float(vmax))
        values = np.where(np.isfinite(values), np.maximum(values, vmin), np.nan)
        return values, LogNorm(vmin=vmin, vmax=vmax), SEQUENTIAL_CMAP if cmap is None else cmap, vmax
    cmap = DIVERGING_CMAP if cmap is None else cmap
    if center is not None and not symlog:
        span = symmetric_vmax(np.asarray(values, dtype=float) - center)
        lo = center - span if vmin is None else float(vmin)
        hi = center + span if vmax is None else float(vmax)
        if not lo < center < hi:
            raise DepthscopeError(
                f"a scale centred at {center:g} needs vmin < {center:g} < vmax, got {lo:g}, {hi:g}"
            )
        return values, TwoSlopeNorm(vcenter=center, vmin=lo, vmax=hi), cmap, hi
    vmax = symmetric_vmax(values) if vmax is None else float(vmax)
    norm = make_norm(vmax, symlog=symlog, linthresh=linthresh)
    if vmin is not None:  # honoured on the linear and symlog scales too, not only on the log one
        norm.vmin = float(vmin)
    return values, norm, cmap, vmax


def _draw_matrix(ax, da: xr.DataArray, values: np.ndarray, norm: Normalize, cmap):
    """The image, the (thinned) cell labels and the axis names of one heatmap."""
    rows, cols = da.dims
    im = ax.imshow(
        np.ma.masked_invalid(values), cmap=_cmap(cmap), norm=norm, aspect="auto", interpolation="nearest"
    )
    box = ax.get_position()  # the axes' share of the figure: how many labels fit along each side
    width, height = box.width * ax.figure.get_figwidth(), box.height * ax.figure.get_figheight()
    named = {}
    for dim, axis, length in ((cols, ax.xaxis, width), (rows, ax.yaxis, height)):
        labels = _labels(da, dim)
        room = min(MAX_TICK_LABELS, max(4, int(length / LABEL_INCHES)))
        blocks = _set_labels(axis, labels, room, cell_inches=length / max(len(labels), 1))
        named[dim] = _axis_label(da, dim) + (
            " (ticks: blocks, at each block's first sublayer)" if blocks else ""
        )
    ax.tick_params(axis="x", labelrotation=90)
    ax.tick_params(which="minor", length=1.5)
    for spine in ax.spines.values():  # the matrix's own edge is frame enough
        spine.set_visible(False)
    ax.set_xlabel(named[cols])
    ax.set_ylabel(named[rows])
    return im


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
    center: float | None = None,
    figsize: tuple[float, float] | None = None,
):
    """Consumer x source heatmap of a (layer, source) DataArray, or of a trace's ``var``.

    Args:
        data: a DataArray with dims (layer, source), such as a trace's ``mixing`` or
            ``analysis.row_normalized(trace)`` (any other 2-D array: rows = its first dim; a
            one-model stack is drawn without its padding), or a Dataset (a trace, or
            ``analysis.block_view(trace)`` for a deep model's blocks) whose ``var`` is drawn.
        symlog: SymLogNorm (base e, linear within +-linthresh), the DenseFormer paper's scale.
        log: a sequential colour map on a log scale from ``vmin`` to ``vmax`` (non-negative
            quantities; zeros get the lowest colour); default: for ``row_normalized`` only, whose
            rows fall as 1/n_l with depth.
        vmax: colour range +-vmax (log: up to vmax); default max |value| (1 for an all-zero or
            all-NaN array).
        annotate: write each value in its cell.
        title: default the model's label (none for a DataArray without one).
        colorbar: draw the colour bar (``ax.images[0].colorbar``), labelled ``long_name [units]``.
        center: a linear diverging scale centred here (1 for ``share x n_l``, the uniform share).
        figsize: the figure's size in inches (default: from the numbers of rows and columns).

    ``vmin`` and ``vmax`` are honoured on every scale.

    Returns:
        The Axes; ``ax.images[0].get_array()`` is the data with NaN cells masked.
    """
    panels = heatmap_panels(data, var)
    if len(panels) != 1:
        raise DepthscopeError(f"{len(panels)} models in one array: use plot_heatmap_grid")
    label, da = panels[0]
    log = da.name == "row_normalized" if log is None else log
    values = np.asarray(da.values, dtype=float)
    values, norm, cmap, vmax = _scale(
        values, log=log, symlog=symlog, linthresh=linthresh, vmin=vmin, vmax=vmax, cmap=cmap, center=center
    )
    if ax is None:
        _, ax = subplots(figsize=figsize or heatmap_size(*values.shape, colorbar=colorbar))
    im = _draw_matrix(ax, da, values, norm, cmap)
    title = label if title is None else title
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
    norm = mappable.norm
    if isinstance(norm, TwoSlopeNorm):  # the centre (1: the uniform share) gets a tick of its own
        ticks = [
            t
            for t in cb.get_ticks()
            if norm.vmin <= t <= norm.vmax and abs(t - norm.vcenter) > 0.05 * (norm.vmax - norm.vmin)
        ]
        cb.set_ticks(sorted({*ticks, norm.vcenter}))
    cb.outline.set_visible(False)
    return cb


def _default_ncols(n: int) -> int:
    """1-3 panels in a row; more in a near-square grid (4 -> 2 x 2, 6 -> 2 x 3, 9 -> 3 x 3)."""
    return n if n <= 3 else math.ceil(math.sqrt(n))


def _grid_figure(panels: list[tuple[str, xr.DataArray]], ncols: int):
    """A Figure and its GridSpec: column widths and row heights follow the panels' cell counts."""
    n = len(panels)
    nrows = math.ceil(n / ncols)
    grid = [panels[r * ncols : (r + 1) * ncols] for r in range(nrows)]
    heights = [max(p.shape[0] for _, p in row) for row in grid]
    widths = [max(panels[i][1].shape[1] for i in range(c, n, ncols)) for c in range(ncols)]
    # one cell size for the whole figure, small enough to keep it within ~18 x 16 inches
    cell = max(0.08, min(0.22, 14.0 / sum(widths), 11.0 / sum(heights)))
    fig = new_figure((sum(widths) * cell + 1.9 * ncols + 1.2, sum(heights) * cell + 1.6 * nrows))
    return fig, fig.add_gridspec(nrows, ncols, width_ratios=widths, height_ratios=heights)


@styled
def plot_heatmap_grid(
    data,
    var: str = "mixing",
    *,
    symlog: bool = False,
    linthresh: float = 0.05,
    ncols: int | None = None,
    vmax: float | None = None,
    cmap: str | Colormap | None = None,
    annotate: bool = False,
    log: bool | None = None,
):
    """One heatmap panel per model on one shared colour scale (one colour bar for the figure).

    ``data``: a DataArray with dims (model, layer, source), such as
    ``analysis.row_normalized(stacked)`` (each row of |M| over its sum, so a standard residual
    reads 1/n_l whatever the scheme's read-out scale; drawn on a log scale, see ``plot_heatmap``'s
    ``log``) or ``stacked["mixing"]``; a stacked Dataset, whose ``var`` is drawn; or a sequence of
    2-D DataArrays. Each panel is drawn without the padding rows and columns of models with fewer
    consumers. Panels are ``fig.axes[:n]`` in model order, titled by the model labels;
    ``fig.axes[-1]`` is the colour bar. Column widths and row heights follow the panels' source
    and consumer counts.

    Returns:
        The Figure.
    """
    panels = heatmap_panels(data, var)
    n = len(panels)
    if n == 0:
        raise DepthscopeError("no models to plot")
    ncols = max(1, min(ncols or _default_ncols(n), n))
    every = np.concatenate([p.values.ravel() for _, p in panels])
    log = panels[0][1].name == "row_normalized" if log is None else log
    vmin = None
    if log:
        vmin, top = log_range(every)
        vmax = top if vmax is None else float(vmax)
    elif vmax is None:
        vmax = symmetric_vmax(every)
    fig, gs = _grid_figure(panels, ncols)
    style = dict(symlog=symlog, log=log, linthresh=linthresh, vmax=vmax, vmin=vmin, cmap=cmap)
    axes = []
    for i, (label, da) in enumerate(panels):
        r, c = divmod(i, ncols)
        ax = plot_heatmap(
            da, fig.add_subplot(gs[r, c]), annotate=annotate, title=label, colorbar=False, **style
        )
        if c != 0:
            ax.set_ylabel("")
        if i + ncols < n:  # another panel below: its x label suffices
            ax.set_xlabel("")
        axes.append(ax)
    shrink = 0.6 if len(axes) <= ncols else 0.5
    label = colorbar_label(panels[0][1])
    _colorbar(
        fig, axes[0].images[0], axes, label, symlog=symlog, vmax=vmax, linthresh=linthresh, shrink=shrink
    )
    return fig
