"""Dilution, retention and pattern-score curves across models, and trajectories over training.

Each ``plot_*`` draws an estimator's output and computes nothing: ``analysis.dilution_curves``,
``relative_retention`` / ``mean_retention``, ``pattern_curves`` (per consumer depth: several
consumers at one depth, DCA's q/k/v views of one input, are one point), and ``summary`` of a
trajectory. Give them a trace or a stack (``model`` dimension): one line per model, coloured by
its ``scheme`` (``style.model_colors``). Data lines are drawn first, in model order (then source
order), each labelled ``"<model>: <what>"``; reference lines (the 1/T baseline, the uniform
pattern score) come after them, so ``ax.lines`` can be read back in a known order.

Y scale ("auto"): shares span 1 (the first consumer) down to ~1/T, so they are drawn on a log
axis; when a plotted share is <= 0 (signed weights such as DenseFormer's can give a negative
contribution) the axis is symlog instead, linear near 0 (below the decade of the smallest
1/T baseline; for retention, of the smallest plotted magnitude).
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator, NullFormatter

from depthscope.analysis.dilution import SHARES
from depthscope.errors import DepthscopeError
from depthscope.figures.data import by_model, colors, run_label
from depthscope.figures.style import (
    SEQUENTIAL_CMAP,
    model_colors,
    new_axes,
    style_axes,
    styled,
    subplots,
)

SOURCE_STYLE = {  # dilution_curves' f"{which}_share" -> line style, marker, legend text
    "embed": ("-", "o", "embedding"),
    "first": (":", "s", "first sublayer"),
    "latest": ("-.", "^", "latest source"),
}
BASELINE_STYLE = dict(color="black", linestyle="--", linewidth=1.0)


def _finite(da: xr.DataArray) -> tuple[np.ndarray, np.ndarray]:
    """(coordinate, values) of a 1-D curve without its NaN points (a model's missing depths)."""
    (dim,) = da.dims
    da = da.dropna(dim)
    return np.asarray(da[dim].values), np.asarray(da.values, dtype=float)


def _name(label: str, what: str) -> str:
    return f"{label}: {what}" if label else what


def _axes(ax, figsize=(7.0, 4.2)):
    return style_axes(ax) if ax is not None else new_axes(figsize)


def _set_yscale(ax, values: list[np.ndarray], floor: float, yscale: str) -> None:
    """Log if every plotted value is > 0, else symlog (linear below ``floor``'s decade)."""
    if yscale == "auto":
        finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.array([])
        yscale = "log" if finite.size == 0 or finite.min() > 0 else "symlog"
    if yscale == "symlog":
        ax.set_yscale("symlog", linthresh=10 ** math.floor(math.log10(floor)) if floor > 0 else 0.01)
    else:
        ax.set_yscale(yscale)


def _baselines(ax, curves: list[tuple[np.ndarray, np.ndarray]], label: str) -> None:
    """Draw each distinct reference curve once (schemes with one layout share one)."""
    drawn: list[tuple[np.ndarray, np.ndarray]] = []
    for x, y in curves:
        if any(x.shape == dx.shape and np.allclose(x, dx) and np.allclose(y, dy) for dx, dy in drawn):
            continue
        ax.plot(x, y, label=label if not drawn else "_" + label, zorder=1.5, **BASELINE_STYLE)
        drawn.append((x, y))


def _outside_legend(ax, handles, title: str, loc: str, anchor: tuple[float, float]):
    return ax.legend(handles=handles, title=title, loc=loc, bbox_to_anchor=anchor, borderaxespad=0.0)


def _depth_axis(ax) -> None:
    ax.set_xlabel("consumer depth (layer_depth; the read-out is last)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _dilution_legends(ax, colours: dict[str, str], sources) -> None:
    """Models (colour) at the top right outside the axes, sources (line style) below them."""
    models = [Line2D([], [], color=c, label=label) for label, c in colours.items()]
    styles = [
        Line2D(
            [],
            [],
            color="0.35",
            linestyle=SOURCE_STYLE[w][0],
            marker=SOURCE_STYLE[w][1],
            label=SOURCE_STYLE[w][2],
        )
        for w in sources
    ]
    styles.append(Line2D([], [], label="1/T baseline", **BASELINE_STYLE))
    first = _outside_legend(ax, models, "model", "upper left", (1.02, 1.0))
    ax.add_artist(first)
    first.set_clip_on(False)  # add_artist clips to the axes, so a tight save would cut it off
    _outside_legend(ax, styles, "source", "lower left", (1.02, 0.0))


@styled
def plot_dilution(curves: xr.Dataset, ax=None, sources=SHARES, *, yscale: str = "auto"):
    """Contribution share of the embedding / first sublayer / latest source versus consumer depth.

    ``curves``: ``analysis.dilution_curves`` of a trace or a stack. One line per model and source
    (colour = model, line style = source); then the 1/T ``baseline`` as a dashed black line (once
    per distinct layout). ``yscale``: "auto" (log, or symlog when a share is <= 0), "log",
    "symlog" or "linear".

    Returns:
        The Axes.
    """
    unknown = [s for s in sources if s not in SOURCE_STYLE]
    if unknown:
        raise ValueError(f"sources must be among {tuple(SOURCE_STYLE)}, got {unknown[0]!r}")
    ax = _axes(ax)
    colours = colors(curves)
    plotted, refs = [], []
    for label, _, part in by_model(curves):
        for which in sources:
            x, y = _finite(part[f"{which}_share"])
            ls, marker, _ = SOURCE_STYLE[which]
            ax.plot(x, y, color=colours[label], linestyle=ls, marker=marker, label=_name(label, which))
            plotted.append(y)
        refs.append(_finite(part["baseline"]))
    _baselines(ax, refs, "1/T baseline")
    _set_yscale(ax, plotted, min((float(y.min()) for _, y in refs if y.size), default=0.01), yscale)
    _depth_axis(ax)
    ax.set_ylabel("contribution share of the source")
    ax.set_title("Dilution: shares versus the 1/T baseline", loc="left")
    _dilution_legends(ax, colours, sources)
    return ax


@styled
def plot_dilution_panels(curves: xr.Dataset, sources=SHARES, *, yscale: str = "auto"):
    """``plot_dilution`` as small multiples: one panel per source, one line per model.

    Easier to read than one crowded panel when many schemes are compared. Returns the Figure;
    its first ``len(sources)`` axes are the panels.
    """
    fig, axes = subplots(1, len(sources), figsize=(4.2 * len(sources) + 1.8, 4.0), sharey=True, squeeze=False)
    for i, (ax, which) in enumerate(zip(axes[0], sources)):
        plot_dilution(curves, ax, sources=(which,), yscale=yscale)
        ax.set_title(f"{SOURCE_STYLE[which][2]}", loc="left")
        if i < len(sources) - 1:
            for legend in [c for c in ax.get_children() if isinstance(c, Legend)]:
                legend.remove()
        if i:
            ax.set_ylabel("")
    fig.suptitle("Dilution: contribution shares versus the 1/T baseline")
    return fig


def _retention_per_source(ax, retention: xr.DataArray) -> list[np.ndarray]:
    """One model's sources: a line each, coloured by source depth (a colour bar, not a legend)."""
    models = by_model(retention)
    if len(models) != 1:
        raise DepthscopeError(f"{len(models)} models' sources in one panel: plot their mean_retention")
    label, _, r = models[0]
    r = r.dropna("source", how="all")
    depths = np.asarray(r["source_depth"].values, dtype=float)
    norm = Normalize(vmin=0, vmax=max(int(np.nanmax(depths)), 1))
    cmap = colormaps[SEQUENTIAL_CMAP]
    plotted = []
    for s, d in zip(r["source"].values, depths):
        x, y = _finite(r.sel(source=s))
        ax.plot(x, y, color=cmap(norm(d)), marker=".", label=_name(label, str(s)))
        plotted.append(y)
    cb = ax.figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.02, aspect=30)
    cb.set_label("source depth (embed = 0)")
    cb.outline.set_visible(False)
    ax.set_title(f"Retention of each source: {label}" if label else "Retention of each source", loc="left")
    return plotted


def _retention_per_model(ax, retention: xr.DataArray) -> tuple[list[np.ndarray], list[Line2D]]:
    """Several models: a line each (their mean over sublayer sources), coloured by scheme."""
    colours = colors(retention)
    plotted, handles = [], []
    for label, _, r in by_model(retention):
        x, y = _finite(r)
        ax.plot(x, y, color=colours[label], marker="o", label=_name(label, "mean over sublayer sources"))
        handles.append(Line2D([], [], color=colours[label], marker="o", label=label))
        plotted.append(y)
    ax.set_title("Retention of sublayer outputs (mean over sources)", loc="left")
    return plotted, handles


@styled
def plot_retention(retention: xr.DataArray, ax=None, *, yscale: str = "auto"):
    """How a source's share fades with lag (sublayers after it was written), relative to 1/T.

    ``retention``: ``analysis.relative_retention`` of one trace (dims source, lag: one line per
    source, coloured by source depth, with a colour bar instead of a 17-entry legend), or
    ``analysis.mean_retention`` of a stack (dims model, lag: one line per model, the mean over
    its sublayer sources). Relative retention is each source's share at the consumers ``lag``
    sublayers later over the uniform 1/n_l share of those same consumers, so one reference line
    at 1 (dashed) serves every source; a raw-share plot would need one 1/T curve per source depth.
    Y scale as in ``plot_dilution``.

    Returns:
        The Axes.
    """
    ax = _axes(ax)
    if "source" in retention.dims:
        plotted, handles = _retention_per_source(ax, retention), []
    else:
        plotted, handles = _retention_per_model(ax, retention)
    ax.axhline(1.0, label="1/T (uniform share)", zorder=1.5, **BASELINE_STYLE)
    handles.append(Line2D([], [], label="1/T (uniform share)", **BASELINE_STYLE))
    positive = np.abs(np.concatenate(plotted)) if plotted else np.array([])
    positive = positive[np.isfinite(positive) & (positive > 0)]
    _set_yscale(ax, plotted, float(np.clip(positive.min(), 1e-3, 0.1)) if positive.size else 0.1, yscale)
    ax.set_xlabel("lag (sublayers after the source was written)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share / uniform share (1 = 1/T)")
    if len(handles) > 1:
        _outside_legend(ax, handles, "model", "upper left", (1.02, 1.0))
    else:
        ax.legend(handles=handles, loc="best")  # inside: above the axes it ran into the title
    return ax


@styled
def plot_pattern_scores(curves: xr.Dataset, ax=None):
    """Input-and-recent pattern score per consumer depth, one line per model, reference at 1.

    ``curves``: ``analysis.pattern_curves(trace_or_stack, k)``; lines are its ``pattern_score``,
    each legend entry carries the model's ``mean_pattern_score``. Above the dashed line at 1.0 (a
    uniform row) the mass of |M| is concentrated on the embedding and the last k sources.

    Returns:
        The Axes.
    """
    ax = _axes(ax)
    k = curves.attrs.get("k", "k")
    colours = colors(curves)
    handles = []
    for label, _, part in by_model(curves):
        x, y = _finite(part["pattern_score"])
        mean = float(part["mean_pattern_score"])
        ax.plot(x, y, color=colours[label], marker="o", label=_name(label, "pattern score"))
        handles.append(Line2D([], [], color=colours[label], marker="o", label=f"{label} (mean {mean:.2f})"))
    ax.axhline(1.0, label="uniform (1.0)", **BASELINE_STYLE)
    handles.append(Line2D([], [], label="uniform row (1.0)", **BASELINE_STYLE))
    _depth_axis(ax)
    ax.set_ylabel(f"pattern score (k = {k})\n> 1: input-and-recent pattern")
    ax.set_title(f"Input-and-recent pattern (|M| on the embedding + last {k} sources)", loc="left")
    _outside_legend(ax, handles, "model (mean score)", "upper left", (1.02, 1.0))
    return ax


# --- over training: ``summary`` of a trajectory (one run's checkpoints along ``model``) -------

TRAJECTORY_GROUPS = {  # summary group -> line style, legend text
    "sublayers": ("-", "all sublayer inputs"),
    "attn": ("--", "attention inputs"),
    "mlp": (":", "MLP inputs"),
    "readout": ("-.", "read-out"),
}


def _training_x(table: xr.Dataset) -> np.ndarray:
    """The training tokens seen at each checkpoint (``train_tokens``), else the ``step``."""
    return np.asarray(table["train_tokens" if "train_tokens" in table.coords else "step"].values, dtype=float)


def _steps_axis(ax, x, tokens: bool) -> None:
    """Log x axis ticked at the checkpoints themselves (tokens in millions, or steps)."""
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    x = np.asarray(x, dtype=float)
    if len(x) <= 8:  # a tick per checkpoint; more would crowd, and the decades remain
        ax.set_xticks(x, [f"{v / 1e6:.3g}M" if tokens and v >= 1e5 else f"{v:.0f}" for v in x])
    ax.set_xlabel("training tokens" if tokens else "step")


def _run_color(table: xr.Dataset) -> str:
    scheme = str(table["scheme"].values[0]) if "scheme" in table.coords else ""
    label = run_label(table)
    return model_colors([(label, scheme)])[label]


def _training_panel(ax, table: xr.Dataset, title: str):
    ax = _axes(ax, (4.4, 3.6))
    _steps_axis(ax, _training_x(table), "train_tokens" in table.coords)
    ax.set_title(title, loc="left")
    return ax


@styled
def plot_pattern_over_training(table: xr.Dataset, ax=None):
    """One run's pattern score per consumer group (line style) against the training tokens seen.

    ``table``: ``analysis.summary(trajectory, k)`` of one run's checkpoints stacked along
    ``model`` (with their ``step`` and ``train_tokens`` coordinates); a group the run lacks has
    no line. The uniform row (1.0) comes last.

    Returns:
        The Axes.
    """
    ax = _training_panel(ax, table, "pattern score")
    x, c = _training_x(table), _run_color(table)
    for group, (ls, text) in TRAJECTORY_GROUPS.items():
        y = table["pattern_score"].sel(group=group).values
        if np.isfinite(y).any():
            ax.plot(x, y, color=c, linestyle=ls, marker="o", label=text)
    ax.axhline(1.0, **BASELINE_STYLE, label="uniform row")
    ax.set_ylabel(f"pattern score (k = {table.attrs.get('k', 'k')})")
    ax.legend()
    return ax


SHARE_LINES = (  # summary variable, group, line style, marker, legend text
    ("embed_share", "readout", "-", "o", "read-out share of the embedding"),
    ("first_index", "sublayers", ":", "s", "first source: dilution index"),
    ("latest_index", "sublayers", "-.", "^", "latest source: dilution index"),
)


@styled
def plot_shares_over_training(table: xr.Dataset, ax=None):
    """One run's read-out share of the embedding and the dilution index of the first and the
    latest sources (mean over sublayer inputs) against the training tokens seen, log y.

    ``table`` as for ``plot_pattern_over_training``. Returns the Axes.
    """
    ax = _training_panel(ax, table, "shares and dilution")
    x, c = _training_x(table), _run_color(table)
    for var, group, ls, marker, text in SHARE_LINES:
        ax.plot(x, table[var].sel(group=group).values, color=c, linestyle=ls, marker=marker, label=text)
    ax.axhline(1.0, **BASELINE_STYLE, label="uniform 1/T (index 1)")
    ax.set_yscale("log")
    ax.legend()
    return ax


@styled
def plot_loss_over_training(table: xr.Dataset, ax=None):
    """One run's validation loss (the ``val_loss`` coordinate; no line without it) against the
    training tokens seen. Returns the Axes.
    """
    ax = _training_panel(ax, table, "loss")
    if "val_loss" in table.coords:
        ax.plot(_training_x(table), table["val_loss"].values, color=_run_color(table), marker="o")
    ax.set_ylabel("validation loss (nats/token)")
    return ax


@styled
def plot_trajectory(table: xr.Dataset, title: str | None = None):
    """How a run's mixing pattern forms: three panels against the training tokens seen.

    ``table``: ``analysis.summary(trajectory, k)`` of one run's checkpoints stacked along
    ``model`` in step order (``step`` and ``train_tokens``, and ``val_loss``, coordinates along
    ``model``). Left: ``plot_pattern_over_training``; middle: ``plot_shares_over_training``;
    right: ``plot_loss_over_training``. Log-scaled token axis. ``title`` names the run (default:
    its ``variant``), followed by its steps.

    Returns:
        The Figure.
    """
    fig, axes = subplots(1, 3, figsize=(13.0, 3.6))
    plot_pattern_over_training(table, axes[0])
    plot_shares_over_training(table, axes[1])
    plot_loss_over_training(table, axes[2])
    steps = ", ".join(str(int(v)) for v in table["step"].values)
    fig.suptitle(f"{title or run_label(table)}: steps {steps}")
    return fig


@styled
def plot_group_over_training(tables, ax=None, *, group: str = "sublayers", colours=None, labels=None):
    """Several runs' pattern score of one consumer group against their training tokens (log axis).

    ``tables``: ``analysis.summary`` of each run's trajectory (as for ``plot_trajectory``); one
    line per run that has the group, labelled by the run (``labels``, default each ``variant``:
    give labels where two runs share a variant, e.g. at two depths), coloured by scheme
    (``colours``: label -> colour, default ``style.model_colors`` of these runs); then the
    uniform row at 1.

    Returns:
        The Axes.
    """
    ax = _axes(ax, (4.4, 3.6))
    labels = _run_labels(tables, labels)
    colours = colours or _run_colors(tables, labels)
    for table, label in zip(tables, labels):
        y = table["pattern_score"].sel(group=group).values
        if np.isfinite(y).any():
            ax.plot(_training_x(table), y, color=colours[label], marker="o", label=label)
    ax.axhline(1.0, **BASELINE_STYLE)
    tokens = all("train_tokens" in t.coords for t in tables)
    _steps_axis(ax, np.unique(np.concatenate([_training_x(t) for t in tables])), tokens)
    ax.set_title(TRAJECTORY_GROUPS[group][1], loc="left")
    return ax


def _run_labels(tables, labels=None) -> list[str]:
    labels = [run_label(t) for t in tables] if labels is None else [str(x) for x in labels]
    if len(labels) != len(tables):
        raise ValueError(f"{len(labels)} labels for {len(tables)} trajectories")
    return labels


def _run_colors(tables, labels=None) -> dict[str, str]:
    schemes = [str(t["scheme"].values[0]) if "scheme" in t.coords else "" for t in tables]
    return model_colors(zip(_run_labels(tables, labels), schemes))


@styled
def plot_trajectories(tables, labels=None):
    """Several runs' pattern over training on one figure: a panel per consumer group.

    ``tables``: a list of ``analysis.summary`` tables of trajectories (as for
    ``plot_trajectory``), one per run, named by ``labels`` (default: each run's ``variant``).
    Each panel is ``plot_group_over_training`` of one group of ``TRAJECTORY_GROUPS`` (all
    sublayer inputs, attention inputs, MLP inputs, read-out): every
    run's pattern score, one colour per scheme, the uniform row at 1. A run without a group (no
    attention inputs) leaves that panel without its line.

    Returns:
        The Figure.
    """
    tables = list(tables)
    if not tables:
        raise ValueError("plot_trajectories needs at least one trajectory")
    labels = _run_labels(tables, labels)
    colours = _run_colors(tables, labels)
    fig, axes = subplots(1, len(TRAJECTORY_GROUPS), figsize=(14.0, 3.6), sharey=True)
    for ax, group in zip(axes, TRAJECTORY_GROUPS):
        plot_group_over_training(tables, ax, group=group, colours=colours, labels=labels)
    axes[0].set_ylabel(f"pattern score (k = {tables[0].attrs.get('k', 'k')})")
    handles = [Line2D([], [], color=c, marker="o", label=label) for label, c in colours.items()]
    handles.append(Line2D([], [], label="uniform row (1.0)", **BASELINE_STYLE))
    _outside_legend(axes[-1], handles, None, "upper left", (1.02, 1.0))
    fig.suptitle("The input-and-recent pattern over training")
    return fig
