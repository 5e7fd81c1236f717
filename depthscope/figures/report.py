"""The report page: which figures it holds, and the HTML it renders (a Jinja2 template).

``planned_figures`` lists every figure of a report with the function that draws it: the one
place where the report's traces meet the estimators of ``depthscope.analysis`` and their output
meets the ``plot_*`` primitives (nothing is captured here; ``report_figures`` draws them all at
once);
``render_page`` fills ``templates/report.html`` with the tables (computed by the estimators of
``depthscope.analysis``) and the figures. Every string that comes from a trace, a file or the
settings is escaped by the template. Orchestration (capturing, writing files) lives in
``depthscope.pipelines.report``.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import xarray as xr
from markupsafe import Markup

from depthscope._version import __version__
from depthscope.analysis.causal import views, weight_effect_correlation
from depthscope.analysis.depth import n_layers
from depthscope.analysis.dilution import (
    block_view,
    consumer_table,
    dilution_curves,
    mean_retention,
    pattern_curves,
    relative_retention,
    row_normalized,
    summary,
)
from depthscope.analysis.rank import conclusion, rank_profile
from depthscope.errors import DepthscopeError
from depthscope.figures.causal import has_native, native_figure, read_depth_figure, weight_effect_figure
from depthscope.figures.curves import (
    plot_dilution_panels,
    plot_pattern_scores,
    plot_retention,
    plot_trajectories,
    plot_trajectory,
)
from depthscope.figures.data import run_label, trace_label
from depthscope.figures.depth import depth_figure
from depthscope.figures.heatmaps import heatmap_size, plot_heatmap, plot_heatmap_grid
from depthscope.figures.rank import plot_rank_profile
from depthscope.figures.style import styled, subplots
from depthscope.trace import STACK, select_model

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


# (title, caption) of every figure kind; {label}, {k}, {scale} are filled in
CAPTIONS = {
    "grid-weights": (
        "Depth-mixing weights of every model (row-normalised)",
        "Row-normalised weight |M[l, s]| / sum_s |M[l, s]| of each source (columns) in each consumer's input "
        "(rows), token mean, in the delta basis (embedding + sublayer outputs), on a log scale. Every "
        "consumer "
        "of a pre-norm model passes through a norm, so a row's scale is irrelevant; a standard residual "
        "reads "
        "1/n (the 1/T baseline) on every available cell. Blank cells are sources not yet written. Shared "
        "colour scale. The raw weights M are one click below.",
    ),
    "grid-share": (
        "Contribution shares of every model",
        "Share of each source in each consumer's input: sum <c[l,s], h_l> / sum |h_l|^2 (each row sums to "
        "1; a "
        "ratio of sums over tokens, so high-norm tokens weigh more). The uniform 1/T share is 1/(sources).",
    ),
    "dilution": (
        "Dilution against the 1/T baseline",
        "Contribution share of the embedding, the first sublayer and the latest source at each consumer "
        "depth; "
        "the dashed line is the uniform share 1/T.",
    ),
    "grid-mixing": (
        "Raw depth-mixing weights M of every model",
        "The effective weight M[l, s] itself (token mean), not row-normalised: a standard residual is 1 "
        "everywhere, and multi-stream read-outs (HC, mHC) sum their n streams. Shared colour scale{scale}.",
    ),
    "pattern": (
        "Input-and-recent pattern scores",
        "Mass of |M| on the embedding and the last {k} sources over what a uniform row puts there: 1 is "
        "uniform (a standard residual), above 1 is the pattern the papers report.",
    ),
    "retention": (
        "Retention of sources",
        "Contribution share of each source at the consumers after it, by lag in sublayers, in units of the "
        "uniform 1/T share.",
    ),
    "weight-effect": (
        "Does the weight matter?",
        "Each (consumer, source) cell's contribution share (left) and row-normalised weight (right) "
        "against its "
        "ablation effect: the loss increase when the source's term is removed from that consumer's input "
        "alone. Spearman's rho in each title.",
    ),
    "read-depth": (
        "{label}: how far back q, k and v read",
        "Mass-weighted mean lag over the sources (row-normalised |M|) and the weight on the embedding, for "
        "the "
        "query, key and value inputs of every attention.",
    ),
    "trajectory": (
        "{label}: the pattern over training",
        "Pattern score (all sublayer inputs, attention inputs, MLP inputs, read-out), the read-out's share "
        "of "
        "the embedding, the dilution index of the first and latest sources, and the validation loss, against "
        "the training tokens seen.",
    ),
    "trajectories": (
        "The pattern over training, every run",
        "Pattern score of each bundled or given run against the training tokens seen, per consumer group "
        "(all sublayer inputs, attention inputs, MLP inputs, read-out); 1 is a uniform row.",
    ),
    "trajectory-weights": (
        "{label}: weights at each step",
        "Row-normalised weights at each step, on one scale.",
    ),
    "rank": (
        "Effective rank of each sublayer's outputs",
        "Numerical rank (0.99 of the energy) of each sublayer's outputs over tokens; their sum is the "
        "collective rank r* of DCA's theory (arXiv 2502.06785, Sec. 4).",
    ),
    "versus-depth": (
        "The same schemes at several depths",
        "Per scheme, against the number of blocks (each depth at the step all depths reached): the "
        "pattern score of the sublayer inputs and of the read-out, the read-out's share of the embedding "
        "and of block 0's MLP write beside the uniform 1/T share (dashed), the validation-loss gain over "
        "the standard residual at the same depth, r*/d where spectra were captured, and how far back DCA's "
        "q, k and v read.",
    ),
    "model": ("{label}", "Mixing weights (left) and contribution shares (right){blocks}."),
    "native": (
        "{label} in its own parametrisation",
        "The weights as the scheme's paper draws them (axes, orientation and scale as cited in the title), "
        "beside the delta-basis matrix above.",
    ),
}


def spec(kind: str, label: str = "", *, key: str | None = None, **fill) -> FigureSpec:
    """The FigureSpec of a figure kind (named ``kind``, ``kind-{key}`` or ``kind-{slug(label)}``)."""
    title, caption = CAPTIONS[kind]
    key = key if key is not None else slug(label) if label else None
    name = f"{kind}-{key}" if key else kind
    return FigureSpec(name, title.format(label=label, **fill), caption.format(label=label, **fill))


def report_figures(
    stacked: xr.Dataset, traces: list[xr.Dataset], k: int, trajectories: list[xr.Dataset] = ()
) -> list[tuple[FigureSpec, Any]]:
    """(description, matplotlib Figure) for every figure of the report, in page order."""
    return [(s, draw()) for s, draw in planned_figures(stacked, traces, k, trajectories)]


def planned_figures(
    stacked: xr.Dataset,
    traces: list[xr.Dataset],
    k: int,
    trajectories: list[xr.Dataset] = (),
    depth: xr.Dataset | None = None,
) -> list[tuple[FigureSpec, Callable[[], Any]]]:
    """(description, function drawing the Figure) for every figure of the report, in page order.

    Drawing is deferred so that a report draws, saves and closes one figure at a time.
    """
    signed = any(_is_signed(t) for t in traces)
    out: list[tuple[FigureSpec, Callable[[], Any]]] = [
        (spec("grid-weights"), lambda: plot_heatmap_grid(row_normalized(stacked))),
        (spec("grid-share"), lambda: plot_heatmap_grid(stacked, "contribution_share")),
        (spec("dilution"), lambda: plot_dilution_panels(dilution_curves(stacked))),
        (
            spec("grid-mixing", scale=", symmetric-log (weights are signed)" if signed else ""),
            lambda: plot_heatmap_grid(stacked, "mixing", symlog=signed),
        ),
        (spec("pattern", k=k), lambda: plot_pattern_scores(pattern_curves(stacked, k)).figure),
        (spec("retention"), lambda: plot_retention(retention(stacked)).figure),
    ]
    with_cells = [t for t in traces if "ablation_effect_cell" in t]
    if with_cells:
        out.append((spec("weight-effect"), lambda: weight_effect_figure(with_cells)))
    for t in traces:
        if views(t).sizes.get("view", 0):
            out.append((spec("read-depth", trace_label(t)), lambda t=t: read_depth_figure(t)))
    out += _trajectory_figures(trajectories, k)
    if depth is not None:
        out.append((spec("versus-depth"), lambda: depth_figure(depth)))
    if "source_spectrum" in stacked:
        out.append((spec("rank"), lambda: plot_rank_profile(rank_profile(stacked)).figure))
    for t in traces:
        deep = t.sizes["layer"] > DEEP
        blocks = "; the shares per block on the right (a block's sources summed, its consumers averaged)"
        out.append(
            (
                spec("model", trace_label(t), blocks=blocks if deep else ""),
                lambda t=t, deep=deep: model_figure(t, deep),
            )
        )
        if has_native(t):
            out.append((spec("native", trace_label(t)), lambda t=t: native_figure(t)))
    return out


def _trajectory_figures(trajectories: list[xr.Dataset], k: int) -> list[tuple[FigureSpec, Callable[[], Any]]]:
    """The trajectory section's figures, each named after its run (``trajectory_runs``)."""
    runs = trajectory_runs(trajectories)
    out: list[tuple[FigureSpec, Callable[[], Any]]] = []
    if len(trajectories) > 1:
        legends = [r.legend for r in runs]
        out.append(
            (
                spec("trajectories"),
                lambda: plot_trajectories([summary(tr, k) for tr in trajectories], labels=legends),
            )
        )
    for tr, run in zip(trajectories, runs):
        out.append(
            (
                spec("trajectory", run.heading, key=run.name),
                lambda tr=tr, title=run.heading: plot_trajectory(summary(tr, k), title=title),
            )
        )
        out.append(
            (
                spec("trajectory-weights", run.heading, key=run.name),
                lambda tr=tr: plot_heatmap_grid(row_normalized(tr), ncols=tr.sizes[STACK]),
            )
        )
    return out


def retention(stacked: xr.Dataset) -> xr.DataArray:
    """What the report's retention figure draws: one model's ``relative_retention`` (a line per
    source), or several models' ``mean_retention`` (a line per model).
    """
    one = STACK not in stacked.dims or stacked.sizes[STACK] == 1
    return relative_retention(stacked) if one else mean_retention(stacked)


@styled
def model_figure(t: xr.Dataset, deep: bool):
    """One model's section figure: M and the shares (and, for a deep model, the shares per block)."""
    panels = [(t, "mixing", "mixing weights M"), (t, "contribution_share", "contribution shares")]
    if deep:
        panels.append((block_view(t), "contribution_share", "contribution shares, per block"))
    width, height = heatmap_size(t.sizes["layer"], t.sizes["source"])
    fig, axes = subplots(1, len(panels), figsize=(width * len(panels), height), squeeze=False)
    for ax, (data, var, title) in zip(axes[0], panels):
        plot_heatmap(data, ax, var=var, symlog=var == "mixing" and _is_signed(t), title=title)
    fig.suptitle(trace_label(t))
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


def figure_html(spec: FigureSpec, png: bytes) -> Markup:
    """One figure: the PNG embedded, its caption, links to the PNG and SVG files."""
    data = base64.b64encode(png).decode("ascii")
    return Markup(
        '<figure id="{id}"><img src="data:image/png;base64,{data}" alt="{title}">'
        '<figcaption><b>{title}.</b> {caption}<a href="{id}.png">PNG</a><a '
        'href="{id}.svg">SVG</a></figcaption></figure>'
    ).format(id=spec.name, data=data, title=spec.title, caption=spec.caption)


def _f(x) -> float:
    return float(x) if x is not None else float("nan")


def _model_row(t: xr.Dataset, k: int) -> dict[str, Any]:
    s = summary(t, k)
    g = s.sel
    label = str(t.attrs.get("label", ""))
    table = consumer_table(t, k)
    return {
        "label": label,
        "heading": model_heading(t),
        "slug": slug(label),
        "figure": f"model-{slug(label)}",
        "native": f"native-{slug(label)}",
        "scheme": str(t.attrs.get("scheme", "")),
        "checkpoint": Path(str(t.attrs.get("checkpoint", ""))).name,
        "checkpoint_path": str(t.attrs.get("checkpoint", "")),
        "config": str(t.attrs.get("config", "")),
        "note": str(t.attrs.get("consumer_input", "")),
        "tokens": int(t.attrs.get("tokens", 0)),
        "pattern": _f(g(group="sublayers")["pattern_score"]),
        "pattern_attn": _f(g(group="attn")["pattern_score"]),
        "pattern_mlp": _f(g(group="mlp")["pattern_score"]),
        "pattern_ssm": _f(g(group="ssm")["pattern_score"]),
        "pattern_readout": _f(g(group="readout")["pattern_score"]),
        "embed_index": _f(g(group="sublayers")["embed_index"]),
        "latest_index": _f(g(group="sublayers")["latest_index"]),
        "readout_embed_share": _f(g(group="readout")["embed_share"]),
        "readout_latest_share": _f(g(group="readout")["latest_share"]),
        "max_error": _f(s["max_residual_error"]),
        "consumers": [
            {
                "layer": str(r["layer"].item()),
                "n": int(r["n_sources"]),
                **{
                    key: _f(r[var])
                    for key, var in (
                        ("baseline", "baseline"),
                        ("embed_share", "embed_share"),
                        ("latest_share", "latest_share"),
                        ("embed_index", "embed_index"),
                        ("latest_index", "latest_index"),
                        ("pattern", "pattern_score"),
                    )
                },
            }
            for r in (table.isel(layer=i) for i in range(table.sizes["layer"]))
        ],
    }


def model_heading(t: xr.Dataset) -> str:
    """A model section's heading: its label, blocks and, where known, training step."""
    step = f", step {int(t.attrs['step'])}" if "step" in t.attrs else ""
    return f"{t.attrs.get('label', '')}: {n_layers(t)} blocks{step}"


def _causal_rows(traces: list[xr.Dataset]) -> list[dict[str, Any]]:
    """Per model with cell ablations: the rank correlations, the loss, the largest effects."""
    rows = []
    for t in traces:
        if "ablation_effect_cell" not in t:
            continue
        rho = weight_effect_correlation(t)
        cells = t["ablation_effect_cell"].stack(cell=("layer", "source")).dropna("cell")
        top = cells.isel(cell=int(cells.argmax("cell")))
        rows.append(
            {
                "label": str(t.attrs.get("label", "")),
                "loss": _f(t.attrs.get("loss")),
                "rho_share": _f(rho["rho_share"]),
                "rho_weight": _f(rho["rho_weight"]),
                "cells": int(rho["cells"]),
                "top": f"{top['source'].item()} -> {top['layer'].item()}",
                "top_effect": _f(top),
            }
        )
    return rows


def _trajectory_rows(tr: xr.Dataset, run: Run, k: int) -> dict[str, Any]:
    s = summary(tr, k)
    rows = []
    for i, m in enumerate(tr[STACK].values):
        g = s.sel({STACK: m}).sel
        rows.append(
            {
                "step": int(tr["step"].values[i]),
                "tokens": int(tr["train_tokens"].values[i]) if "train_tokens" in tr.coords else 0,
                "val_loss": _f(tr["val_loss"].values[i]) if "val_loss" in tr.coords else float("nan"),
                "pattern": _f(g(group="sublayers")["pattern_score"]),
                "pattern_attn": _f(g(group="attn")["pattern_score"]),
                "pattern_mlp": _f(g(group="mlp")["pattern_score"]),
                "pattern_readout": _f(g(group="readout")["pattern_score"]),
                "readout_embed_share": _f(g(group="readout")["embed_share"]),
                "first_index": _f(g(group="sublayers")["first_index"]),
                "latest_index": _f(g(group="sublayers")["latest_index"]),
            }
        )
    return {
        "label": run.heading,
        "slug": run.name,
        "rows": rows,
        "figure": f"trajectory-{run.name}",
        "heatmaps": f"trajectory-weights-{run.name}",
    }


def _rank_rows(traces: list[xr.Dataset]) -> list[dict[str, Any]]:
    rows = []
    for t in traces:
        if "collective_rank" not in t:
            continue
        rows.append(
            {
                "label": str(t.attrs.get("label", "")),
                "d": t.sizes["component"],
                "ranks": [
                    (
                        _f(t["collective_rank"].sel(rank_kind=kind)),
                        _f(t["collective_rank_ratio"].sel(rank_kind=kind)),
                    )
                    for kind in ("numerical", "entropy", "participation")
                ],
                "conclusion": conclusion(
                    {
                        "label": str(t.attrs.get("label", "")),
                        "d": t.sizes["component"],
                        "ratio": {"numerical": float(t["collective_rank_ratio"].sel(rank_kind="numerical"))},
                    }
                ),
            }
        )
    return rows


def _depth_rows(table: xr.Dataset) -> list[dict[str, Any]]:
    """The versus-depth table's rows: one per (scheme group, depth) that has a model."""
    rows = []
    for g in map(str, table["group"].values):
        for n in table["n_layers"].values:
            r = table.sel(group=g, n_layers=n)
            if not float(r["step"]) >= 0 and not np.isfinite(float(r["val_loss"])):
                continue
            lag = {v: _f(r["view_lag"].sel(view=v)) for v in ("q", "k", "v")}
            rows.append(
                {
                    "group": g,
                    "n_layers": int(n),
                    "step": int(r["step"]) if float(r["step"]) >= 0 else "-",
                    "val_loss": _f(r["val_loss"]),
                    "loss_gain": _f(r["loss_gain"]),
                    "pattern": _f(r["pattern_score"].sel(kind="sublayers")),
                    "pattern_readout": _f(r["pattern_score"].sel(kind="readout")),
                    "embed": _f(r["retention"].sel(source="embed")),
                    "mlp0": _f(r["retention"].sel(source="0.mlp")),
                    "baseline": _f(table["baseline"].sel(n_layers=n)),
                    "rank": _f(r["rank_ratio"]),
                    **lag,
                }
            )
    return rows


def render_page(
    traces: list[xr.Dataset],
    figures: dict[str, Markup],
    settings: dict[str, Any],
    *,
    k: int = 2,
    elapsed: float = 0.0,
    trajectories: list[xr.Dataset] = (),
    depth: xr.Dataset | None = None,
) -> str:
    """The report's index.html: tables from the estimators, the figures as given."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("depthscope.figures", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template("report.html").render(
        models=[_model_row(t, k) for t in traces],
        trajectories=[
            _trajectory_rows(tr, run, k) for tr, run in zip(trajectories, trajectory_runs(trajectories))
        ],
        ranks=_rank_rows(traces),
        causal=_causal_rows(traces),
        read_depth=[
            f"read-depth-{slug(str(t.attrs.get('label', '')))}"
            for t in traces
            if views(t).sizes.get("view", 0)
        ],
        depth=[] if depth is None else _depth_rows(depth),
        figures=figures,
        settings=settings,
        corpus=str(traces[0].attrs.get("corpus", "")) if traces else "",
        version=__version__,
        k=k,
        elapsed=elapsed,
    )
