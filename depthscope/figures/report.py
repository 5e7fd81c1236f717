"""The report page: its sections, tables and figures as one plain structure, each figure drawn from
the data it holds, and the HTML rendered from it (a Jinja2 template).

``depthscope.pipelines.report`` computes everything the page shows once (``ReportData``:
sections of tables, notes and figures; each ``ReportFigure`` holds the estimator output it
draws); this module only draws it: ``ReportFigure.draw`` the matplotlib figure (PNG and SVG
files, for papers) and ``ReportFigure.charts`` its interactive panels
(``figures.interactive``, Vega-Lite); ``render_page`` fills ``templates/report.html``. Figure
names, titles, captions and drawings come from one table (``FIGURES``, a ``FigureKind`` per kind;
``figure`` makes one from its kind and data). Every string that
comes from a trace, a file or the settings is escaped by the template, and by
``Charts.payload`` inside the page's script.

Adding a section is one entry in ``ReportData.sections``: ``Section(anchor, title, short,
content=[Note(...), Table(...), figure(kind, data)])``; a new kind of figure is one ``FigureKind``
row of ``FIGURES``.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import xarray as xr
from markupsafe import Markup

from depthscope._version import __version__
from depthscope.analysis.depth import n_layers
from depthscope.analysis.dilution import mean_retention, relative_retention
from depthscope.errors import DepthscopeError
from depthscope.figures import interactive as ia
from depthscope.figures.causal import native_figure, read_depth_figure, weight_effect_figure
from depthscope.figures.claims import plot_claims
from depthscope.figures.curves import (
    BASELINE_STYLE,
    SHARE_LINES,
    TRAJECTORY_GROUPS,
    plot_dilution_panels,
    plot_pattern_scores,
    plot_retention,
    plot_trajectories,
    plot_trajectory,
)
from depthscope.figures.data import by_model, colors, run_label, trace_label, unpadded
from depthscope.figures.depth import PANELS, depth_figure
from depthscope.figures.heatmaps import heatmap_size, plot_heatmap, plot_heatmap_grid
from depthscope.figures.rank import plot_rank_profile
from depthscope.figures.style import model_colors, styled, subplots
from depthscope.trace import STACK, select_model
from depthscope.trace.labels import EMBED

DEEP = 40  # more consumers than this: the model's section adds a block-level view


@dataclass(frozen=True)
class FigureSpec:
    """One figure of the report: its file and anchor name, its title and its caption."""

    name: str
    title: str
    caption: str


def slug(label: str) -> str:
    """A label as a file and anchor name: runs of other characters than ``[A-Za-z0-9_.@-]`` -> ``-``,
    and where that changed the label, a digest of it appended, so two labels never share a name
    (``m>1`` and ``m<1``).
    """
    safe = re.sub(r"[^A-Za-z0-9_.@-]+", "-", label).strip("-")
    if safe == label and safe:
        return safe
    return f"{safe or 'model'}-{zlib.crc32(label.encode()):08x}"


def _is_signed(t: xr.Dataset) -> bool:
    return bool(np.nanmin(t["mixing"].values) < 0)


def spec(kind: str, label: str = "", *, key: str | None = None, **fill) -> FigureSpec:
    """The FigureSpec of a figure kind (named ``kind``, ``kind-{key}`` or ``kind-{slug(label)}``)."""
    title, caption = FIGURES[kind].title, FIGURES[kind].caption
    key = key if key is not None else slug(label) if label else None
    name = f"{kind}-{key}" if key else kind
    return FigureSpec(name, title.format(label=label, **fill), caption.format(label=label, **fill))


def retention(stacked: xr.Dataset) -> xr.DataArray:
    """What the report's retention figure draws: one model's ``relative_retention`` (a line per
    source), or several models' ``mean_retention`` (a line per model).
    """
    one = STACK not in stacked.dims or stacked.sizes[STACK] == 1
    return relative_retention(stacked) if one else mean_retention(stacked)


@styled
def model_figure(t: xr.Dataset, blocks: xr.Dataset | None = None):
    """One model's section figure: M and the shares (and, given ``blocks``, a deep model's
    ``analysis.block_view``, the shares per block).
    """
    panels = [(t, "mixing", "mixing weights M"), (t, "contribution_share", "contribution shares")]
    if blocks is not None:
        panels.append((blocks, "contribution_share", "contribution shares, per block"))
    width, height = heatmap_size(t.sizes["layer"], t.sizes["source"])
    fig, axes = subplots(1, len(panels), figsize=(width * len(panels), height), squeeze=False)
    for ax, (data, var, title) in zip(axes[0], panels):
        plot_heatmap(data, ax, var=var, symlog=var == "mixing" and _is_signed(t), title=title)
    fig.suptitle(trace_label(t))
    return fig


NORM_GROWTH = "input RMS / first sublayer input's"  # the norm-growth figure's y axis


@styled
def norm_growth_figure(curves: xr.Dataset):
    """The residual norm growth of ``analysis.dilution_curves`` (its ``norm_growth``) per consumer
    depth, a line per model, each legend entry with its ``norm_growth_ratio``; dashed: no growth.
    """
    fig, ax = subplots(figsize=(7.0, 4.2))
    palette = colors(curves)
    for label, _, part in by_model(curves):
        g = part["norm_growth"].dropna("layer_depth")
        ratio = float(part["norm_growth_ratio"])
        text = f"{label} (last / first {ratio:.2f}x)" if ratio == ratio else f"{label} (no input norms)"
        ax.plot(g["layer_depth"].values, g.values, color=palette[label], marker="o", label=text)
    ax.axhline(1.0, label="no growth (1.0)", **BASELINE_STYLE)
    ax.set_yscale("log")
    ax.set_xlabel("consumer depth (layer_depth; the read-out is last)")
    ax.set_ylabel(NORM_GROWTH)
    ax.set_title("Residual norm growth (the stream's magnitude, not the shares)", loc="left")
    ax.legend(
        title="model (norm growth ratio)", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0
    )
    return fig


def trajectory_label(trajectory: xr.Dataset) -> str:
    """The run of a trajectory: its ``variant`` (``data.run_label``)."""
    return run_label(trajectory)


@dataclass(frozen=True)
class Run:
    """A trajectory's run as the report names it: its variant, number of blocks and step range,
    then whatever else tells it from a run that shares those (``extra``: width, directory).

    ``heading`` titles its section ("standard, 8 blocks, steps 250-4000"); ``name`` is its file and
    anchor name (``standard-8blocks-steps250-4000``); ``legend`` labels it among all runs.
    """

    variant: str
    blocks: int
    first: int
    last: int
    extra: tuple[tuple[str, str], ...] = ()
    legend: str = ""

    @property
    def heading(self) -> str:
        """Variant, blocks, steps and the extras, in words."""
        parts = [self.variant, f"{self.blocks} blocks", f"steps {self.first}-{self.last}"]
        return ", ".join([*parts, *(f"{key} {value}" for key, value in self.extra)])

    @property
    def name(self) -> str:
        """The heading as a file name: each part slugged on its own, so distinct runs never share it."""
        parts = [slug(self.variant), f"{self.blocks}blocks", f"steps{self.first}-{self.last}"]
        return "-".join([*parts, *(f"{key}{slug(value)}" for key, value in self.extra)])


def _run_identity(trajectory: xr.Dataset) -> tuple[tuple[str, int, int, int], tuple[tuple[str, str], ...]]:
    """(variant, blocks, first step, last step) of a trajectory, and what else may tell it apart."""
    last = select_model(trajectory, str(trajectory[STACK].values[-1]))
    steps = [int(s) for s in trajectory["step"].values]
    try:
        width = str(json.loads(str(last.attrs.get("config", "")))["d_model"])
    except (KeyError, TypeError, ValueError):
        width = str(last.sizes.get("component", "?"))
    where = str(Path(str(last.attrs.get("checkpoint", ""))).parent)
    base = (trajectory_label(trajectory), n_layers(last), min(steps), max(steps))
    return base, (("width", width), ("in", where))


def trajectory_runs(trajectories: list[xr.Dataset]) -> list[Run]:
    """The run of each trajectory, named from what distinguishes it (``Run``): variant, blocks and
    steps always; the width and the checkpoints' directory where runs share the rest. Two
    trajectories that share all of it are the same run given twice: refused.
    """
    ids = [_run_identity(tr) for tr in trajectories]
    runs = []
    for base, tells in ids:
        alike = [t for b, t in ids if b == base]
        extra = tuple(kv for i, kv in enumerate(tells) if len({t[i] for t in alike}) > 1)
        runs.append(Run(*base, extra=extra))
    by_name: dict[str, Run] = {}
    for run in runs:
        if run.name in by_name:
            raise DepthscopeError(f"the same run is given twice ({run.heading}): give each trajectory once")
        by_name[run.name] = run
    return _with_legends(runs)


def _with_legends(runs: list[Run]) -> list[Run]:
    """Each run's legend: its variant where no other run has it, else with its blocks, else its heading."""
    levels = [(r.variant, f"{r.variant}, {r.blocks} blocks", r.heading) for r in runs]
    out = []
    for run, mine in zip(runs, levels):
        unique = [text for i, text in enumerate(mine) if sum(other[i] == text for other in levels) == 1]
        out.append(replace(run, legend=(unique or [run.heading])[0]))
    return out


# --- the page's structure ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportFigure:
    """One figure of the page: its name, title and caption (``spec``), its ``kind`` (a key of
    ``FIGURES``: how it is drawn) and ``data``, the estimator output it draws (keyword arguments of
    the kind's drawing functions). ``folded``: shown under a ``<details>`` with this summary.
    """

    spec: FigureSpec
    kind: str
    data: dict[str, Any]
    folded: str = ""
    type: str = "figure"

    def draw(self):
        """The matplotlib Figure (for the PNG and SVG files)."""
        return FIGURES[self.kind].draw(**self.data)

    def charts(self, out: ia.Charts) -> list[ia.Chart]:
        """Its interactive panels, added to ``out`` (none: the page shows the PNG)."""
        make = FIGURES[self.kind].charts
        return make(out, f"chart-{self.spec.name}", **self.data) if make else []


def figure(
    kind: str, data: dict[str, Any], label: str = "", *, key: str | None = None, folded: str = "", **fill
) -> ReportFigure:
    """A figure of the page from its kind (a key of ``FIGURES``, spelled once) and the data it draws:
    its name, title and caption from the kind's row (``spec``: ``label``, ``key`` and ``fill``).
    """
    return ReportFigure(spec(kind, label, key=key, **fill), kind, data, folded)


@dataclass(frozen=True)
class Column:
    """A table column: its header, the row key it shows, and how (``num``: ``digits`` decimals,
    ``sci``: one-digit scientific, ``text``); ``cls`` marks the cells (tests read them).
    """

    header: str
    key: str
    kind: str = "num"
    digits: int = 3
    cls: str = ""


@dataclass(frozen=True)
class Table:
    """A table: ``rows`` are dicts keyed by the columns' keys; ``attr`` names the row key written
    as each row's ``data-{attr}`` (e.g. ``model``); ``folded``: under a ``<details>``.
    """

    columns: list[Column]
    rows: list[dict[str, Any]]
    anchor: str = ""
    cls: str = ""
    attr: str = ""
    folded: str = ""
    type: str = "table"


@dataclass(frozen=True)
class Note:
    """A paragraph (``html``: trusted text written here, never a string from a trace) or a list of
    sentences (``items``: (model, text), escaped).
    """

    html: Markup | str = ""
    items: list[tuple[str, str]] = field(default_factory=list)
    cls: str = ""
    type: str = "note"


@dataclass(frozen=True)
class Section:
    """A section: anchor, title, the name in the table of contents, then its content in order and
    its subsections. A section with ``model`` set belongs to that model (the selector shows it).
    """

    anchor: str
    title: str
    short: str = ""
    content: list[ReportFigure | Table | Note] = field(default_factory=list)
    children: list[Section] = field(default_factory=list)
    sub: str = ""  # a plain-text line under the title
    model: str = ""

    def figures(self) -> list[ReportFigure]:
        """Every figure of the section and its subsections, in page order."""
        own = [c for c in self.content if isinstance(c, ReportFigure)]
        return own + [f for child in self.children for f in child.figures()]


@dataclass(frozen=True)
class ReportData:
    """Everything the page shows, computed once: the models (the selector), the sections, the
    settings table and the corpus.
    """

    models: list[str]
    sections: list[Section]
    settings: dict[str, Any]
    corpus: str = ""
    k: int = 2

    def figures(self) -> list[ReportFigure]:
        """Every figure, in page order (file names are ``figure.spec.name``)."""
        return [f for s in self.sections for f in s.figures()]


# --- what each kind of figure draws: (matplotlib, interactive) -----------------------------------


def _grid(data: xr.DataArray, symlog: bool = False, ncols: int | None = None, **_):
    return plot_heatmap_grid(data, symlog=symlog, ncols=ncols)


def _grid_charts(out, cid, data, key, value, scale, select=None, symlog=False, **_):
    return [ia.heatmap(out, key, data, chart_id=cid, title=value, value=value, scale=scale, select=select)]


def _model_colors(data) -> dict[str, str]:
    return colors(data)


def _dilution_charts(out, cid, curves: xr.Dataset):
    panels, longest = [], None
    for label, _, part in by_model(curves):
        for var in ("embed_share", "first_share", "latest_share"):
            panels.append((var.replace("_", " "), label, part[var]))
        n = int(np.isfinite(part["baseline"].values).sum())
        longest = (n, part["baseline"]) if longest is None or n > longest[0] else longest
    rows = ia.series_rows(panels, "layer_depth")
    if longest is not None:  # the uniform share 1/T, in every panel
        for var in ("embed_share", "first_share", "latest_share"):
            for key, value in ia.series_rows(
                [(var.replace("_", " "), "1/T", longest[1])], "layer_depth"
            ).items():
                rows[key] += value
    y = {p: "contribution share" for p in ("embed share", "first share", "latest share")}
    return ia.curves(out, cid, rows, x="consumer depth", y=y, colors=_model_colors(curves), logy=tuple(y))


def _norm_growth_charts(out, cid, curves: xr.Dataset):
    rows = ia.series_rows(
        [("norm growth", label, part["norm_growth"]) for label, _, part in by_model(curves)], "layer_depth"
    )
    y = {"norm growth": NORM_GROWTH}
    return ia.curves(out, cid, rows, x="consumer depth", y=y, colors=_model_colors(curves), logy=tuple(y))


def _pattern_charts(out, cid, curves: xr.Dataset):
    rows = ia.series_rows(
        [("pattern score", label, part["pattern_score"]) for label, _, part in by_model(curves)],
        "layer_depth",
    )
    k = curves.attrs.get("k", "k")
    return ia.curves(
        out,
        cid,
        rows,
        x="consumer depth",
        y={"pattern score": f"pattern score (k = {k})"},
        colors=_model_colors(curves),
    )


def _retention_charts(out, cid, data: xr.DataArray):
    if STACK in data.dims and data.sizes[STACK] == 1 and "source" in data.dims:  # one model: per source
        data = data.isel({STACK: 0}, drop=True)
    if STACK in data.dims:
        panels = [("retention", label, part) for label, _, part in by_model(data)]
        palette, series = _model_colors(data), "model"
    else:
        panels = [("retention", str(s), data.sel(source=s)) for s in data["source"].values]
        palette, series = None, "source"
    rows, y = ia.series_rows(panels, "lag"), {"retention": "share in units of 1/T"}
    return ia.curves(out, cid, rows, x="lag (sublayers)", y=y, series=series, colors=palette, logy=tuple(y))


def _weight_effect_charts(out, cid, traces, cells):
    charts = []
    palette = model_colors((label, str(t.attrs.get("scheme", ""))) for label, t in zip(cells, traces))
    for x, title in (("share", "contribution share"), ("weight", "row-normalised weight")):
        rows: dict[str, list] = {"p": [], "c": [], "x": [], "y": [], "consumer": [], "source": []}
        for label, c in cells.items():
            for xv, yv, lv, sv in zip(c[x].values, c["effect"].values, c["layer"].values, c["source"].values):
                if np.isfinite(xv) and np.isfinite(yv):
                    for key, v in zip(rows, (title, label, float(xv), float(yv), str(lv), str(sv))):
                        rows[key].append(v)
        charts += ia.curves(
            out,
            f"{cid}-{x}",
            rows,
            x=title,
            y={title: "ablation effect (nats/token)"},
            colors=palette,
            points=True,
        )
    return charts


def _read_depth_charts(out, cid, trace, views):
    panels = [
        (var, str(view), views[var].sel(view=view))
        for var in ("mean_lag", "embed_mass")
        for view in views["view"].values
    ]
    rows = ia.series_rows(panels, "block")
    y = {"mean_lag": "mean lag (sublayers back)", "embed_mass": "weight on the embedding"}
    return ia.curves(out, cid, rows, x="block", y=y, series="view")


def _training_x(table: xr.Dataset) -> tuple[str, str]:
    return ("train_tokens", "training tokens") if "train_tokens" in table.coords else ("step", "step")


def _over_training(table: xr.Dataset, var: str, group: str | None = None) -> xr.DataArray:
    """``table[var]`` (at ``group``) along ``model``, indexed by the training tokens (or steps)."""
    coord, _ = _training_x(table)
    da = table[var] if group is None else table[var].sel(group=group)
    x = np.asarray(table[coord].values, dtype=float)
    return xr.DataArray(np.asarray(da.values, dtype=float), dims="t", coords={"t": x})


def _trajectories_charts(out, cid, tables, labels):
    panels = [
        (text, label, _over_training(t, "pattern_score", group))
        for group, (_, text) in TRAJECTORY_GROUPS.items()
        for t, label in zip(tables, labels)
    ]
    rows = ia.series_rows(panels, "t")
    schemes = [str(t["scheme"].values[0]) if "scheme" in t.coords else "" for t in tables]
    y = {text: "pattern score" for _, text in TRAJECTORY_GROUPS.values()}
    x = "training tokens" if all("train_tokens" in t.coords for t in tables) else "step"
    return ia.curves(
        out,
        cid,
        rows,
        x=x,
        y=y,
        series="run",
        colors=model_colors(zip(labels, schemes)),
        logx=True,
    )


def _trajectory_charts(out, cid, table, title):
    panels = [
        ("pattern score", text, _over_training(table, "pattern_score", group))
        for group, (_, text) in TRAJECTORY_GROUPS.items()
    ]
    panels += [
        ("shares and dilution", text, _over_training(table, var, g)) for var, g, _, _, text in SHARE_LINES
    ]
    if "val_loss" in table.coords:
        panels.append(("loss", "validation loss", _over_training(table, "val_loss")))
    y = {
        "pattern score": "pattern score",
        "shares and dilution": "share / dilution index",
        "loss": "nats/token",
    }
    if "val_loss" not in table.coords:
        y.pop("loss")
    rows = ia.series_rows(panels, "t")
    return ia.curves(
        out,
        cid,
        rows,
        x=_training_x(table)[1],
        y=y,
        series="line",
        logx=True,
        logy=("shares and dilution",),
    )


def _depth_charts(out, cid, table):
    panels = []
    for var, select, title in PANELS:
        if var not in table:
            continue
        da = table[var].sel(select)
        for g in map(str, table["group"].values):
            panels.append((title, g, da.sel(group=g)))
    if "view_lag" in table:
        for g in map(str, table["group"].values):
            for v in table["view"].values:
                panels.append(("q, k, v read depth", f"{g} {v}", table["view_lag"].sel(group=g, view=v)))
    rows = ia.series_rows(panels, "n_layers")
    titles = list(dict.fromkeys(p for p, _, _ in panels))
    palette = model_colors(zip(map(str, table["group"].values), map(str, table["scheme"].values)))
    return ia.curves(out, cid, rows, x="blocks", y={t: t for t in titles}, series="scheme", colors=palette)


def _rank_draw(profile):
    return plot_rank_profile(profile).figure


def _rank_charts(out, cid, profile):
    panels = []
    for label, _, part in by_model(profile):
        part = unpadded(part)
        if "effective_rank" not in part or bool(part["effective_rank"].isnull().all()):
            continue
        keep = np.flatnonzero(np.asarray(part["source_kind"].values) != EMBED)
        da = part["effective_rank"].sel(rank_kind="numerical").isel(source=keep)
        da = xr.DataArray(da.values, dims="d", coords={"d": np.asarray(part["source_depth"].values)[keep]})
        panels.append(("effective rank", label, da))
    rows, y = ia.series_rows(panels, "d"), {"effective rank": "numerical effective rank"}
    return ia.curves(out, cid, rows, x="source depth", y=y, colors=_model_colors(profile))


def _model_charts(out, cid, trace, blocks=None, signed=False, **_):
    label = trace_label(trace)
    # (data entry, chart id's suffix, values, title, value name, scale, model shown first)
    mixing_scale = "symlog" if signed else "diverging"
    views = [
        ("mixing", "mixing", trace["mixing"], "mixing weights M", "M", mixing_scale, label),
        ("share", "share", trace["contribution_share"], "contribution shares", "share", "diverging", label),
    ]
    if blocks is not None:
        per_block = "contribution shares, per block"
        views.append(
            (f"blocks-{cid}", "blocks", blocks["contribution_share"], per_block, "share", "diverging", None)
        )
    return [
        ia.heatmap(out, key, da, chart_id=f"{cid}-{sfx}", title=t, value=v, scale=sc, pick=pk, follows=False)
        for key, sfx, da, t, v, sc, pk in views
    ]


@dataclass(frozen=True)
class FigureKind:
    """One kind of figure, in one row of ``FIGURES``: its title and caption (``{label}``, ``{k}``,
    ``{scale}``, ``{blocks}`` filled in by ``spec``), how it is drawn for the files (``draw``: the
    figure's data as keyword arguments -> a matplotlib Figure) and for the page (``charts``: its
    interactive panels; None: the page shows its PNG, as the paper draws it).
    """

    title: str
    caption: str
    draw: Callable[..., Any]
    charts: Callable[..., list] | None


FIGURES: dict[str, FigureKind] = {
    "claims": FigureKind(
        "Each variant against the standard residual, over seeds",
        "Left: validation loss minus the standard residual's of the same seed, along training (mean over "
        "seeds; band: min..max; dashed: the standard grown a block deeper or 8 features wider). Right: the "
        "standard's steps over the steps each variant needs to reach the standard's final validation loss "
        "(linear interpolation between the validation points, every 100 steps); dots are seeds, bars their "
        "mean, the dashed line DCA's claimed 3x. ",
        lambda curves, speed, schemes: plot_claims(curves, speed, schemes),
        None,
    ),
    "grid-weights": FigureKind(
        "Depth-mixing weights of every model (row-normalised)",
        "Row-normalised weight |M[l, s]| / sum_s |M[l, s]| of each source (columns) in each consumer's input "
        "(rows), token mean, in the delta basis (embedding + sublayer outputs), on a log scale. Every "
        "consumer "
        "of a pre-norm model passes through a norm, so a row's scale is irrelevant; a standard residual "
        "reads "
        "1/n (the 1/T baseline) on every available cell. Blank cells are sources not yet written. Shared "
        "colour scale. The raw weights M are one click below.",
        _grid,
        _grid_charts,
    ),
    "grid-share": FigureKind(
        "Contribution shares of every model",
        "Share of each source in each consumer's input: sum <c[l,s], h_l> / sum |h_l|^2 (each row sums to "
        "1; a "
        "ratio of sums over tokens, so high-norm tokens weigh more). The uniform 1/T share is 1/(sources).",
        _grid,
        _grid_charts,
    ),
    "dilution": FigureKind(
        "Dilution against the 1/T baseline",
        "Contribution share of the embedding, the first sublayer and the latest source at each consumer "
        "depth; "
        "the dashed line is the uniform share 1/T.",
        lambda curves: plot_dilution_panels(curves),
        _dilution_charts,
    ),
    "norm-growth": FigureKind(
        "Residual norm growth beside the shares",
        "RMS of each consumer's input over the captured tokens, sqrt(sum |h_l|^2 / (tokens x d)), over that "
        "of the first sublayer input, at each consumer depth (log scale; the read-out is last): how much "
        "the residual stream's magnitude grew. The shares above say how much of an input each write still "
        "makes up; a growing stream makes each new write a smaller part of it. The legend and the summary "
        "table give each model's norm growth ratio, the last sublayer input's RMS over the first's.",
        lambda curves: norm_growth_figure(curves),
        _norm_growth_charts,
    ),
    "grid-mixing": FigureKind(
        "Raw depth-mixing weights M of every model",
        "The effective weight M[l, s] itself (token mean), not row-normalised: a standard residual is 1 "
        "everywhere, and multi-stream read-outs (HC, mHC) sum their n streams. Shared colour scale{scale}.",
        _grid,
        _grid_charts,
    ),
    "pattern": FigureKind(
        "Input-and-recent pattern scores",
        "Mass of |M| on the embedding and the last {k} sources over what a uniform row puts there: 1 is "
        "uniform (a standard residual), above 1 is the pattern the papers report.",
        lambda curves: plot_pattern_scores(curves).figure,
        _pattern_charts,
    ),
    "retention": FigureKind(
        "Retention of sources",
        "Contribution share of each source at the consumers after it, by lag in sublayers, in units of the "
        "uniform 1/T share.",
        lambda data: plot_retention(data).figure,
        _retention_charts,
    ),
    "weight-effect": FigureKind(
        "Does the weight matter?",
        "Each (consumer, source) cell's contribution share (left) and row-normalised weight (right) "
        "against its "
        "ablation effect: the loss increase when the source's term is removed from that consumer's input "
        "alone. Spearman's rho in each title.",
        lambda traces, cells: weight_effect_figure(traces),
        _weight_effect_charts,
    ),
    "read-depth": FigureKind(
        "{label}: how far back q, k and v read",
        "Mass-weighted mean lag over the sources (row-normalised |M|) and the weight on the embedding, for "
        "the "
        "query, key and value inputs of every attention.",
        lambda trace, views: read_depth_figure(trace),
        _read_depth_charts,
    ),
    "trajectory": FigureKind(
        "{label}: the pattern over training",
        "Pattern score (all sublayer inputs, attention inputs, MLP inputs, read-out), the read-out's share "
        "of "
        "the embedding, the dilution index of the first and latest sources, and the validation loss, against "
        "the training tokens seen.",
        lambda table, title: plot_trajectory(table, title=title),
        _trajectory_charts,
    ),
    "trajectories": FigureKind(
        "The pattern over training, every run",
        "Pattern score of each bundled or given run against the training tokens seen, per consumer group "
        "(all sublayer inputs, attention inputs, MLP inputs, read-out); 1 is a uniform row.",
        lambda tables, labels: plot_trajectories(tables, labels=labels),
        _trajectories_charts,
    ),
    "trajectory-weights": FigureKind(
        "{label}: weights at each step",
        "Row-normalised weights at each step, on one scale.",
        _grid,
        _grid_charts,
    ),
    "rank": FigureKind(
        "Effective rank of each sublayer's outputs",
        "Numerical rank (0.99 of the energy) of each sublayer's outputs over tokens; their sum is the "
        "collective rank r* of DCA's theory (arXiv 2502.06785, Sec. 4).",
        _rank_draw,
        _rank_charts,
    ),
    "versus-depth": FigureKind(
        "The same schemes at several depths",
        "Per scheme, against the number of blocks (each depth at the step all depths reached): the "
        "pattern score of the sublayer inputs and of the read-out, the read-out's share of the embedding "
        "and of block 0's MLP write beside the uniform 1/T share (dashed), the validation-loss gain over "
        "the standard residual at the same depth, r*/d where spectra were captured, and how far back DCA's "
        "q, k and v read.",
        lambda table: depth_figure(table),
        _depth_charts,
    ),
    "model": FigureKind(
        "{label}",
        "Mixing weights (left) and contribution shares (right){blocks}.",
        lambda trace, blocks=None, signed=False: model_figure(trace, blocks),
        _model_charts,
    ),
    "native": FigureKind(
        "{label} in its own parametrisation",
        "The weights as the scheme's paper draws them (axes, orientation and scale as cited in the title), "
        "beside the delta-basis matrix above; for a scheme that attends over depth inside attention, the "
        "depth rows: the attention mass on each block's memory, each block's share of the attention's write "
        "(checked every batch to add up to it) and the read-out's shares by block counting that route.",
        lambda trace: native_figure(trace),
        None,
    ),
}


# --- the page ------------------------------------------------------------------------------------


def figure_html(fig: ReportFigure, charts: list[ia.Chart], png: bytes | None) -> Markup:
    """One figure: its interactive panels (or, with none, the PNG embedded), its caption, links to
    the PNG and SVG files beside the page.
    """
    if charts:
        body = Markup("").join(Markup('<div class="chart" id="{}"></div>').format(c.id) for c in charts)
        body = Markup('<div class="charts">{}</div>').format(body)
    else:
        data = base64.b64encode(png or b"").decode("ascii")
        body = Markup('<img src="data:image/png;base64,{}" alt="{}">').format(data, fig.spec.title)
    title = fig.spec.title if fig.spec.title.endswith((".", "?", "!")) else fig.spec.title + "."
    html = Markup(
        '<figure id="{id}">{body}<figcaption><b>{title}</b> {caption}<a href="{id}.png">PNG</a><a '
        'href="{id}.svg">SVG</a></figcaption></figure>'
    ).format(id=fig.spec.name, body=body, title=title, caption=fig.spec.caption)
    if fig.folded:
        html = Markup("<details><summary>{}</summary>{}</details>").format(fig.folded, html)
    return html


def render_page(report: ReportData, pngs: dict[str, bytes], *, elapsed: float = 0.0) -> str:
    """The report's index.html: every section, the figures' interactive panels (the PNG of those
    without), the charting runtime and the data once, inline: no file or network needed to view it.

    ``pngs``: figure name -> its PNG bytes (embedded only for figures without panels).
    """
    out = ia.Charts()
    figures = {}
    for fig in report.figures():
        charts = fig.charts(out)
        figures[fig.spec.name] = figure_html(fig, charts, None if charts else pngs.get(fig.spec.name))
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("depthscope.figures", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    script = "\n".join(
        [
            ia.runtime(),
            "var REPORT = " + out.payload(report.models) + ";",
            (Path(__file__).parent / "templates" / "report.js").read_text(encoding="utf-8"),
        ]
    )
    if "</script" in script.lower():  # nothing may end the page's one script element early
        raise DepthscopeError("the report's script would end early: </script> in its text")
    return env.get_template("report.html").render(
        report=report,
        figures=figures,
        script=Markup(script),
        version=__version__,
        elapsed=elapsed,
        charts=len(out.charts),
    )


def model_heading(t: xr.Dataset) -> str:
    """A model section's heading: its label, blocks and, where known, training step."""
    step = f", step {int(t.attrs['step'])}" if "step" in t.attrs else ""
    return f"{t.attrs.get('label', '')}: {n_layers(t)} blocks{step}"
