"""Dilution, retention and pattern-score curves across models.

Every function takes a trace, a trace stacked along ``model`` or a list of traces, calls the
estimators of ``depthscope.analysis.dilution`` and draws; nothing is computed here beyond that.
Colour = scheme (``style.scheme_colors``). Data lines are drawn first, in scheme order (then
source order), each labelled ``"<scheme>: <what>"``; reference lines (the 1/T baseline, the
uniform pattern score) come after them, so ``ax.lines`` can be read back in a known order.

Several consumers at one depth (DCA's q/k/v views of one attention input) are averaged into one
point at that ``layer_depth``; for every other scheme each point is exactly one consumer's value.

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

from depthscope.analysis import dilution as est
from depthscope.figures.heatmaps import traces_by_model
from depthscope.figures.style import (
    SEQUENTIAL_CMAP,
    new_axes,
    scheme_colors,
    style_axes,
    styled,
)
from depthscope.trace.labels import EMBED

SOURCE_STYLE = {  # share_of(which) -> line style, marker, legend text
    "embed": ("-", "o", "embedding"),
    "first": (":", "s", "first sublayer"),
    "latest": ("-.", "^", "latest source"),
}
BASELINE_STYLE = dict(color="black", linestyle="--", linewidth=1.0)


def by_depth(da: xr.DataArray) -> tuple[np.ndarray, np.ndarray]:
    """(layer_depth values, mean of ``da`` over the consumers at each depth), NaN points dropped."""
    depth = np.asarray(da["layer_depth"].values)
    values = np.asarray(da.values, dtype=float)
    xs = np.unique(depth)
    ys = np.array([_nanmean(values[depth == x]) for x in xs])
    keep = np.isfinite(ys)
    return xs[keep], ys[keep]


def _nanmean(v: np.ndarray) -> float:
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


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


@styled
def plot_dilution(traces, ax=None, sources=("embed", "first", "latest"), *, yscale: str = "auto"):
    """Contribution share of the embedding / first sublayer / latest source versus consumer depth.

    One line per scheme and source (colour = model, line style = source), ``share_of`` values;
    then the 1/T baseline (``baseline``) as a dashed black line. ``yscale``: "auto" (log, or symlog
    when a share is <= 0), "log", "symlog" or "linear".

    Returns:
        The Axes.
    """
    items = traces_by_model(traces)
    unknown = [s for s in sources if s not in SOURCE_STYLE]
    if unknown:
        raise ValueError(f"sources must be among {tuple(SOURCE_STYLE)}, got {unknown[0]!r}")
    ax = style_axes(ax) if ax is not None else new_axes((7.0, 4.2))
    colours = scheme_colors(label for label, _ in items)
    plotted, refs = [], []
    for label, t in items:
        for which in sources:
            x, y = by_depth(est.share_of(t, which))
            ls, marker, _ = SOURCE_STYLE[which]
            ax.plot(x, y, color=colours[label], linestyle=ls, marker=marker, label=f"{label}: {which}")
            plotted.append(y)
        refs.append(by_depth(est.baseline(t)))
    _baselines(ax, refs, "1/T baseline")
    _set_yscale(ax, plotted, min((float(y.min()) for _, y in refs if y.size), default=0.01), yscale)
    _depth_axis(ax)
    ax.set_ylabel("contribution share of the source")
    ax.set_title("Dilution: shares versus the 1/T baseline", loc="left")
    model_handles = [Line2D([], [], color=colours[label], label=label) for label, _ in items]
    source_handles = [
        Line2D(
            [],
            [],
            color="0.35",
            linestyle=SOURCE_STYLE[w][0],
            marker=SOURCE_STYLE[w][1],
            label=SOURCE_STYLE[w][2],
        )
        for w in sources
    ] + [Line2D([], [], label="1/T baseline", **BASELINE_STYLE)]
    ax.add_artist(_outside_legend(ax, model_handles, "model", "upper left", (1.02, 1.0)))
    _outside_legend(ax, source_handles, "source", "lower left", (1.02, 0.0))
    return ax


@styled
def plot_dilution_panels(traces, sources=("embed", "first", "latest"), *, yscale: str = "auto"):
    """``plot_dilution`` as small multiples: one panel per source, one line per scheme.

    Easier to read than one crowded panel when many schemes are compared. Returns the Figure;
    its first ``len(sources)`` axes are the panels.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(sources), figsize=(4.2 * len(sources) + 1.8, 4.0), sharey=True, squeeze=False
    )
    for i, (ax, which) in enumerate(zip(axes[0], sources)):
        plot_dilution(traces, ax, sources=(which,), yscale=yscale)
        ax.set_title(f"{SOURCE_STYLE[which][2]}", loc="left")
        if i < len(sources) - 1:
            for legend in [c for c in ax.get_children() if isinstance(c, Legend)]:
                legend.remove()
        if i:
            ax.set_ylabel("")
    fig.suptitle("Dilution: contribution shares versus the 1/T baseline")
    return fig


def _lag_curve(da: xr.DataArray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(da.values)
    return np.asarray(da["lag"].values)[keep], np.asarray(da.values, dtype=float)[keep]


@styled
def plot_retention(trace_or_stacked, ax=None, *, yscale: str = "auto"):
    """How a source's share fades with lag (sublayers after it was written), relative to 1/T.

    Plotted: ``analysis.relative_retention``, i.e. ``retention(t) / uniform_retention(t)``: each source's
    share at the consumers ``lag`` sublayers later over the uniform 1/n_l share of those same
    consumers, so one reference line at 1 (dashed) serves every source; a raw-share plot would
    need one 1/T curve per source depth. One trace: one line per source, coloured by source depth
    (colour bar instead of a 17-entry legend). Several schemes: one line per scheme, the mean over
    the sublayer sources (the embedding, whose share dominates untrained models, is followed by
    ``plot_dilution``). Y scale as in ``plot_dilution``.

    Returns:
        The Axes.
    """
    items = traces_by_model(trace_or_stacked)
    ax = style_axes(ax) if ax is not None else new_axes((7.0, 4.2))
    plotted = []
    if len(items) == 1:
        label, t = items[0]
        r = est.relative_retention(t)
        depths = t["source_depth"].values
        norm = Normalize(vmin=0, vmax=max(int(depths.max()), 1))
        cmap = colormaps[SEQUENTIAL_CMAP]
        for s, d in zip(r["source"].values, depths):
            x, y = _lag_curve(r.sel(source=s))
            ax.plot(x, y, color=cmap(norm(d)), marker=".", label=f"{label}: {s}")
            plotted.append(y)
        cb = ax.figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.02, aspect=30)
        cb.set_label("source depth (embed = 0)")
        cb.outline.set_visible(False)
        ax.set_title(f"Retention of each source: {label}", loc="left")
        handles = []
    else:
        colours = scheme_colors(label for label, _ in items)
        handles = []
        for label, t in items:
            r = est.relative_retention(t)
            x, y = _lag_curve(r.where(t["source_kind"] != EMBED).mean("source"))
            ax.plot(x, y, color=colours[label], marker="o", label=f"{label}: mean over sublayer sources")
            handles.append(Line2D([], [], color=colours[label], marker="o", label=label))
            plotted.append(y)
        ax.set_title("Retention of sublayer outputs (mean over sources)", loc="left")
    ax.axhline(1.0, label="1/T (uniform share)", zorder=1.5, **BASELINE_STYLE)
    handles.append(Line2D([], [], label="1/T (uniform share)", **BASELINE_STYLE))
    positive = np.abs(np.concatenate(plotted)) if plotted else np.array([])
    positive = positive[np.isfinite(positive) & (positive > 0)]
    _set_yscale(ax, plotted, float(np.clip(positive.min(), 1e-3, 0.1)) if positive.size else 0.1, yscale)
    ax.set_xlabel("lag (sublayers after the source was written)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share / uniform share (1 = 1/T)")
    if len(items) > 1:
        ax.legend(
            handles=handles, title="model", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0
        )
    else:
        ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.2)
    return ax


@styled
def plot_pattern_scores(stacked_or_list, ax=None, k: int = 2):
    """Input-and-recent pattern score per consumer depth, one line per scheme, reference at 1.

    Lines are ``pattern_score(trace, k)``; each legend entry carries the scheme's summary mean
    (``summary(trace, k)["pattern_score"]``). Above the dashed line at 1.0 (a uniform row) the
    mass of |M| is concentrated on the embedding and the last k sources.

    Returns:
        The Axes.
    """
    items = traces_by_model(stacked_or_list)
    ax = style_axes(ax) if ax is not None else new_axes((7.0, 4.2))
    colours = scheme_colors(label for label, _ in items)
    handles = []
    for label, t in items:
        x, y = by_depth(est.pattern_score(t, k))
        mean = float(est.summary(t, k)["pattern_score"].sel(group="sublayers"))
        ax.plot(x, y, color=colours[label], marker="o", label=f"{label}: pattern score")
        handles.append(Line2D([], [], color=colours[label], marker="o", label=f"{label} (mean {mean:.2f})"))
    ax.axhline(1.0, label="uniform (1.0)", **BASELINE_STYLE)
    handles.append(Line2D([], [], label="uniform row (1.0)", **BASELINE_STYLE))
    _depth_axis(ax)
    ax.set_ylabel(f"pattern score (k = {k})\n> 1: input-and-recent pattern")
    ax.set_title(f"Input-and-recent pattern (|M| on the embedding + last {k} sources)", loc="left")
    ax.legend(
        handles=handles,
        title="model (mean score)",
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
    )
    return ax


def _steps_axis(ax, x, tokens: bool) -> None:
    """Log x axis ticked at the checkpoints themselves (tokens in millions, or steps)."""
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    x = np.asarray(x, dtype=float)
    if len(x) <= 8:  # a tick per checkpoint; more would crowd, and the decades remain
        ax.set_xticks(x, [f"{v / 1e6:.3g}M" if tokens and v >= 1e5 else f"{v:.0f}" for v in x])
    ax.set_xlabel("training tokens" if tokens else "step")


TRAJECTORY_GROUPS = {  # summary group -> line style, legend text
    "sublayers": ("-", "all sublayer inputs"),
    "attn": ("--", "attention inputs"),
    "mlp": (":", "MLP inputs"),
    "readout": ("-.", "read-out"),
}


@styled
def plot_trajectory(trajectory: xr.Dataset, k: int = 2):
    """How a run's mixing pattern forms: three panels against the training tokens seen.

    ``trajectory``: traces of one run's checkpoints stacked along ``model`` in step order, with
    ``step`` and ``train_tokens`` (and ``val_loss``) coordinates along ``model``. Left: the pattern
    score per consumer group (``summary``); middle: the read-out's share of the embedding and the
    dilution index of the first and the latest sources (mean over sublayer inputs); right: the
    validation loss. Log-scaled token axis.

    Returns:
        The Figure.
    """
    import matplotlib.pyplot as plt

    s = est.summary(trajectory, k)
    x = (
        trajectory["train_tokens"].values
        if "train_tokens" in trajectory.coords
        else trajectory["step"].values
    )
    colour = scheme_colors([str(trajectory["model"].values[0])])
    c = next(iter(colour.values()))
    fig, axes = plt.subplots(1, 3, figsize=(13.0, 3.6))
    for group, (ls, text) in TRAJECTORY_GROUPS.items():
        y = s["pattern_score"].sel(group=group).values
        if np.isfinite(y).any():
            axes[0].plot(x, y, color=c, linestyle=ls, marker="o", label=text)
    axes[0].axhline(1.0, **BASELINE_STYLE, label="uniform row")
    axes[0].set_ylabel(f"pattern score (k = {k})")
    axes[0].legend()
    axes[1].plot(
        x,
        s["embed_share"].sel(group="readout").values,
        color=c,
        marker="o",
        label="read-out share of the embedding",
    )
    axes[1].plot(
        x,
        s["first_index"].sel(group="sublayers").values,
        color=c,
        linestyle=":",
        marker="s",
        label="first source: dilution index",
    )
    axes[1].plot(
        x,
        s["latest_index"].sel(group="sublayers").values,
        color=c,
        linestyle="-.",
        marker="^",
        label="latest source: dilution index",
    )
    axes[1].axhline(1.0, **BASELINE_STYLE, label="uniform 1/T (index 1)")
    axes[1].set_yscale("log")
    axes[1].legend()
    if "val_loss" in trajectory.coords:
        axes[2].plot(x, trajectory["val_loss"].values, color=c, marker="o")
    axes[2].set_ylabel("validation loss (nats/token)")
    for ax, title in zip(axes, ("pattern score", "shares and dilution", "loss")):
        _steps_axis(ax, x, "train_tokens" in trajectory.coords)
        ax.set_title(title, loc="left")
        style_axes(ax)
    label = str(trajectory["model"].values[0]).split("@", 1)[0]
    fig.suptitle(f"{label}: steps " + ", ".join(str(int(v)) for v in trajectory["step"].values))
    return fig


@styled
def plot_trajectories(trajectories, k: int = 2):
    """Several runs' pattern over training on one figure: a panel per consumer group.

    ``trajectories``: a list of trajectory stacks (as for ``plot_trajectory``), one per run. Each
    panel draws, for one consumer group of ``summary`` (all sublayer inputs, attention inputs,
    MLP inputs, read-out), every run's pattern score against its training tokens (log axis), one
    colour per scheme, with the uniform row at 1. A run without a group (no attention inputs)
    leaves that panel without its line.

    Returns:
        The Figure.
    """
    import matplotlib.pyplot as plt

    if not trajectories:
        raise ValueError("plot_trajectories needs at least one trajectory")
    labels = [str(tr["model"].values[0]).split("@", 1)[0] for tr in trajectories]
    xs = []
    colours = scheme_colors(labels)
    fig, axes = plt.subplots(1, len(TRAJECTORY_GROUPS), figsize=(14.0, 3.6), sharey=True)
    for label, tr in zip(labels, trajectories):
        s = est.summary(tr, k)
        x = tr["train_tokens"].values if "train_tokens" in tr.coords else tr["step"].values
        xs.append(np.asarray(x, dtype=float))
        for ax, group in zip(axes, TRAJECTORY_GROUPS):
            y = s["pattern_score"].sel(group=group).values
            if np.isfinite(y).any():
                ax.plot(x, y, color=colours[label], marker="o", label=label)
    tokens = all("train_tokens" in tr.coords for tr in trajectories)
    for ax, (_, text) in zip(axes, TRAJECTORY_GROUPS.values()):
        ax.axhline(1.0, **BASELINE_STYLE)
        _steps_axis(ax, np.unique(np.concatenate(xs)), tokens)
        ax.set_title(text, loc="left")
        style_axes(ax)
    axes[0].set_ylabel(f"pattern score (k = {k})")
    handles = [Line2D([], [], color=colours[label], marker="o", label=label) for label in labels]
    handles.append(Line2D([], [], label="uniform row (1.0)", **BASELINE_STYLE))
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle("The input-and-recent pattern over training")
    return fig
