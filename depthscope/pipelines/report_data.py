"""What the report page shows, computed once: traces in, ``figures.report.ReportData`` out.

Every estimator runs here once per model or run (``summary`` once per model and once per
trajectory; the heatmaps' arrays once for the overview, the model sections and the files), and
each figure keeps the estimator output it draws: ``figures.report`` only draws it (the PNG and
SVG files, the page's interactive charts) and renders the page. Figure names, titles, captions
and drawings come from ``figures.report.FIGURES`` through ``figure(kind, data)``: a kind is spelled
once per figure.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from markupsafe import Markup

from depthscope.analysis.causal import views, weight_effect, weight_effect_correlation
from depthscope.analysis.depth import depth_table, several_depths
from depthscope.analysis.dilution import (
    block_view,
    consumer_table,
    dilution_curves,
    pattern_curves,
    row_normalized,
    summary,
    unit_weights,
)
from depthscope.analysis.rank import rank_profile, rank_summary
from depthscope.corpus import short_name
from depthscope.figures.causal import has_native
from depthscope.figures.data import trace_label
from depthscope.figures.report import (
    DEEP,
    Column,
    Note,
    ReportData,
    Section,
    Table,
    _is_signed,
    figure,
    model_heading,
    retention,
    slug,
    trajectory_runs,
)
from depthscope.trace import STACK, split_models, stack_traces


def report_data(
    traces: list[xr.Dataset], trajectories: list[xr.Dataset], settings, claims=None
) -> tuple[ReportData, xr.Dataset]:
    """(the page's data, the models stacked along ``model``) of a report's traces and trajectories
    (``pipelines.report.collect``); ``settings``: the ``ReportSettings``.

    A report of trajectories alone takes each run's last step as its model (see
    ``pipelines.report``). ``claims``: a ``pipelines.claims.Claims`` to show in a section of its
    own (the report of the bundled zoo shows the several-seed collection's).
    """
    k = settings.k
    runs = trajectory_runs(trajectories)  # refuses a run given twice before anything is computed
    members = [m for tr in trajectories for m in split_models(tr)]
    if traces:
        members = [*traces, *members]
    else:
        from depthscope.pipelines.report_settings import _ranked, last_step

        traces = [_ranked(last_step(tr), settings.energy) for tr in trajectories]
    stacked = stack_traces(traces)
    traces = split_models(stacked)  # unique labels
    depth = depth_table(members, k) if several_depths(members) else None
    tables = [summary(tr, k) for tr in trajectories]  # once per run: its table and its figures
    sections = [
        _overview(stacked, traces),
        _scores(stacked, traces, k),
        *_causal(traces),
        *_trajectories(trajectories, runs, tables),
        *_versus_depth(depth),
        _rank(stacked, traces, settings.energy),
        _claims(claims) if claims is not None else None,
        _models(traces, k),
    ]
    sections = [s for s in sections if s is not None]
    read_depth = [
        figure("read-depth", {"trace": t, "views": v}, trace_label(t))
        for t in traces
        if (v := views(t)).sizes.get("view", 0)
    ]
    if read_depth:  # after the causal section where there is one, else after the scores
        at = max(i for i, s in enumerate(sections) if s.anchor in ("weight-matters", "scores"))
        sections[at] = replace(sections[at], content=[*sections[at].content, *read_depth])
    data = ReportData(
        models=[trace_label(t) for t in traces],
        sections=sections,
        settings=settings.table(traces, trajectories),
        corpus=_corpus(traces),
        k=k,
    )
    return data, stacked


# --- the sections ---------------------------------------------------------------------------------


def _f(x) -> float:
    return float(x) if x is not None else float("nan")


def _overview(stacked: xr.Dataset, traces: list[xr.Dataset]) -> Section:
    signed = any(_is_signed(t) for t in traces)
    curves = dilution_curves(stacked)  # the shares' figure and the norm growth's
    scale = ", symmetric-log (weights are signed)" if signed else ""
    return Section(
        "overview",
        "How each model mixes depth",
        "overview",
        [
            figure(
                "grid-weights",
                {
                    "data": row_normalized(stacked),
                    "key": "weights",
                    "value": "row-normalised weight",
                    "scale": "log",
                },
            ),
            figure(
                "grid-share",
                {
                    "data": stacked["contribution_share"],
                    "key": "share",
                    "value": "share",
                    "scale": "diverging",
                },
            ),
            figure("dilution", {"curves": curves}),
            figure("norm-growth", {"curves": curves}),
            figure(
                "grid-mixing",
                {
                    "data": stacked["mixing"],
                    "key": "mixing",
                    "value": "M",
                    "scale": "symlog" if signed else "diverging",
                    "symlog": signed,
                },
                folded="raw weights M (not row-normalised)",
                scale=scale,
            ),
        ],
    )


SCORES = Markup(
    "Means over each group of consumer inputs (all sublayer inputs, attention inputs, MLP inputs, the inputs "
    "of a hybrid's state-space, convolution or linear-attention mixers; DCA's three q/k/v views of one "
    "attention input averaged first), and the read-out's own values. Dilution index = share &times; number "
    "of available sources (1 = the uniform 1/T share). Pattern score: |M| mass on the embedding and the last "
    "{k} sources over the uniform mass (1 = uniform; &gt; 1 = the input-and-recent-layers pattern); shown "
    "only for learned weights: a model read with unit weights scores 1 by construction. The embedding's "
    "index is the embedding group's (a token and a position embedding together) against its own uniform "
    "share, k/n for k embeddings. Norm growth: the RMS over tokens of the last sublayer input over the "
    "first's, how much the residual stream's magnitude grew (the indices measure shares of an input, this "
    "its size)."
)


def _corpus(traces: list[xr.Dataset]) -> str:
    """The page header's corpus: its short name where every model read the same, else where to look."""
    names = {short_name(str(t.attrs.get("corpus", ""))) for t in traces}
    if len(names) == 1:
        return names.pop() or "-"
    return "differs by model (see Settings)"


def checkpoint_cell(t: xr.Dataset) -> str:
    """Where a trace's model came from, in a table cell: the checkpoint's file or directory name, the
    hub id it was loaded as, or that the model was captured from Python (no path recorded).
    """
    a = t.attrs
    hub = a.get("hub_id")
    if hub:
        return f"{hub}@{str(a.get('hub_revision', ''))[:8]}" if a.get("hub_revision") else str(hub)
    name = Path(str(a.get("checkpoint") or "")).name
    return name or f"captured in Python ({a.get('label') or 'unlabelled'})"


# a table's summary cells by row key: (consumer group, ``summary`` variable); the scores table and
# each trajectory's table read them from here
SUMMARY_CELLS = {
    "pattern": ("sublayers", "pattern_score"),
    "pattern_attn": ("attn", "pattern_score"),
    "pattern_mlp": ("mlp", "pattern_score"),
    "pattern_ssm": ("ssm", "pattern_score"),
    "pattern_readout": ("readout", "pattern_score"),
    "embed_index": ("sublayers", "embed_index"),
    "first_index": ("sublayers", "first_index"),
    "latest_index": ("sublayers", "latest_index"),
    "readout_embed_share": ("readout", "embed_share"),
    "readout_latest_share": ("readout", "latest_share"),
    "norm_growth": ("sublayers", "norm_growth_ratio"),  # a scalar per model: no group
}


def summary_cells(s: xr.Dataset, keys: tuple[str, ...], *, unit: bool = False) -> dict[str, float]:
    """The ``SUMMARY_CELLS`` named by ``keys`` of one model's ``summary``; with ``unit`` (unit weights:
    a standard residual read as it is) the pattern scores are NaN, being 1 by construction.
    """
    cells = {key: _f(s.sel(group=SUMMARY_CELLS[key][0])[SUMMARY_CELLS[key][1]]) for key in keys}
    return {key: float("nan") if unit and key.startswith("pattern") else v for key, v in cells.items()}


SCORE_CELLS = ("pattern", "pattern_attn", "pattern_mlp", "pattern_ssm", "pattern_readout", "embed_index")
SCORE_CELLS += ("latest_index", "norm_growth", "readout_embed_share", "readout_latest_share")
TRAJECTORY_CELLS = ("pattern", "pattern_attn", "pattern_mlp", "pattern_readout", "readout_embed_share")
TRAJECTORY_CELLS += ("first_index", "latest_index", "norm_growth")


def _model_scores(t: xr.Dataset, s: xr.Dataset) -> dict[str, Any]:
    unit = unit_weights(t)
    return {
        "model": trace_label(t),
        "checkpoint": checkpoint_cell(t),
        "tokens": int(t.attrs.get("tokens", 0)),
        "weights": "unit (pattern 1 by construction)" if unit else "learned",
        **summary_cells(s, SCORE_CELLS, unit=unit),
        "max_error": _f(s["max_residual_error"]),
    }


def _scores(stacked: xr.Dataset, traces: list[xr.Dataset], k: int) -> Section:
    columns = [
        Column("model", "model", "text"),
        Column("checkpoint / trace", "checkpoint", "text"),
        Column("tokens", "tokens", "text"),
        Column("weights", "weights", "text"),
        Column(f"pattern score (k={k})", "pattern", cls="pattern"),
        Column("attention inputs", "pattern_attn"),
        Column("MLP inputs", "pattern_mlp"),
        Column("SSM inputs", "pattern_ssm"),
        Column("read-out", "pattern_readout"),
        Column("embedding dilution index", "embed_index"),
        Column("latest-source dilution index", "latest_index"),
        Column("norm growth (last / first input RMS)", "norm_growth", digits=2, cls="norm-growth"),
        Column("read-out share: embedding", "readout_embed_share"),
        Column("read-out share: latest", "readout_latest_share"),
        Column("max residual error", "max_error", "sci"),
    ]
    rows = [_model_scores(t, summary(t, k)) for t in traces]
    return Section(
        "scores",
        "Pattern scores and dilution indices",
        "scores",
        [
            Note(SCORES.format(k=k)),
            Table(columns, rows, anchor="summary", attr="model"),
            figure("pattern", {"curves": pattern_curves(stacked, k)}, k=k),
            figure("retention", {"data": retention(stacked)}),
        ],
    )


CAUSAL = Markup(
    "A heatmap says where a layer reads from, not whether that reading matters. Each cell's ablation effect "
    "is the increase in loss (nats per token) when the source's term is removed from that one consumer's "
    "input; Spearman's rho ranks it against the cell's contribution share and against its row-normalised "
    "weight."
)


def _causal(traces: list[xr.Dataset]) -> list[Section]:
    with_cells = [t for t in traces if "ablation_effect_cell" in t]
    if not with_cells:
        return []
    rows = []
    for t in with_cells:
        rho = weight_effect_correlation(t)
        cells = t["ablation_effect_cell"].stack(cell=("layer", "source")).dropna("cell")
        top = cells.isel(cell=int(cells.argmax("cell")))
        rows.append(
            {
                "model": trace_label(t),
                "loss": _f(t.attrs.get("loss")),
                "cells": int(rho["cells"]),
                "rho_share": _f(rho["rho_share"]),
                "rho_weight": _f(rho["rho_weight"]),
                "top": f"{top['source'].item()} -> {top['layer'].item()}",
                "top_effect": _f(top),
            }
        )
    columns = [
        Column("model", "model", "text"),
        Column("loss", "loss", digits=4),
        Column("cells", "cells", "text"),
        Column("rho: share vs effect", "rho_share", cls="rho-share"),
        Column("rho: weight vs effect", "rho_weight", cls="rho-weight"),
        Column("largest effect", "top", "text"),
        Column("its effect", "top_effect", digits=4),
    ]
    cells = {trace_label(t): weight_effect(t) for t in with_cells}
    return [
        Section(
            "weight-matters",
            "Does the weight matter?",
            "does the weight matter?",
            [
                Note(CAUSAL),
                Table(columns, rows, anchor="causal", attr="model"),
                figure("weight-effect", {"traces": with_cells, "cells": cells}),
            ],
        )
    ]


def _trajectories(trajectories, runs, tables) -> list[Section]:
    if not trajectories:
        return []
    content: list = [
        Note("Several checkpoints of one run, in step order: how the mixing pattern forms during training.")
    ]
    if len(trajectories) > 1:
        content.append(figure("trajectories", {"tables": tables, "labels": [r.legend for r in runs]}))
    columns = [
        Column("step", "step", "text"),
        Column("training tokens", "tokens", "text"),
        Column("validation loss", "val_loss", digits=4),
        Column("pattern score", "pattern"),
        Column("attention inputs", "pattern_attn"),
        Column("MLP inputs", "pattern_mlp"),
        Column("read-out", "pattern_readout"),
        Column("read-out share: embedding", "readout_embed_share"),
        Column("first-source dilution index", "first_index"),
        Column("latest-source dilution index", "latest_index"),
        Column("norm growth (last / first input RMS)", "norm_growth", digits=2),
    ]
    children = []
    for tr, run, s in zip(trajectories, runs, tables):
        rows = []
        for i, m in enumerate(tr[STACK].values):
            rows.append(
                {
                    "step": int(tr["step"].values[i]),
                    "tokens": int(tr["train_tokens"].values[i]) if "train_tokens" in tr.coords else 0,
                    "val_loss": _f(tr["val_loss"].values[i]) if "val_loss" in tr.coords else float("nan"),
                    **summary_cells(s.sel({STACK: m}), TRAJECTORY_CELLS),
                }
            )
        grid = {
            "data": row_normalized(tr),
            "value": "row-normalised weight",
            "scale": "log",
            "select": "step",
            "ncols": tr.sizes[STACK],
        }
        weights = figure("trajectory-weights", grid, run.heading, key=run.name)
        weights = replace(weights, data={**grid, "key": weights.spec.name})  # its charts' data, by its name
        children.append(
            Section(
                f"run-{run.name}",
                run.heading,
                content=[
                    Table(columns, rows, cls="trajectory", attr="step"),
                    figure("trajectory", {"table": s, "title": run.heading}, run.heading, key=run.name),
                    weights,
                ],
            )
        )
    return [Section("trajectory", "Training trajectories", "trajectory", content, children)]


DEPTH = Markup(
    "The same schemes at several depths, each compared at the largest training step every depth reached "
    "(equal tokens seen). Dilution predicts that learned depth weights matter more in deeper stacks: a "
    "pattern score and a loss gain that grow with the blocks; the read-out's share of an early write beside "
    "the uniform 1/T share."
)


def _versus_depth(table: xr.Dataset | None) -> list[Section]:
    if table is None:
        return []
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
    columns = [
        Column("scheme", "group", "text"),
        Column("blocks", "n_layers", "text"),
        Column("step", "step", "text"),
        Column("validation loss", "val_loss", digits=4),
        Column("loss gain", "loss_gain", digits=4),
        Column("pattern score", "pattern"),
        Column("read-out pattern", "pattern_readout"),
        Column("read-out share: embedding", "embed"),
        Column("block 0 MLP", "mlp0"),
        Column("1/T", "baseline"),
        Column("q lag", "q", digits=2),
        Column("k lag", "k", digits=2),
        Column("v lag", "v", digits=2),
        Column("r*/d", "rank"),
    ]
    return [
        Section(
            "versus-depth",
            "Versus depth",
            "versus depth",
            [
                Note(DEPTH),
                Table(columns, rows, anchor="depth"),
                figure("versus-depth", {"table": table}),
            ],
        )
    ]


RANK = Markup(
    "DCA (arXiv 2502.06785, Sec. 4) predicts that learnable depth weights help most when the collective rank "
    "r* (sum of the layers' ranks) is small compared with the width d. Ranks are effective ranks of each "
    "sublayer's outputs over the captured tokens."
)


def _rank(stacked: xr.Dataset, traces: list[xr.Dataset], energy: float) -> Section:
    rows, sentences = [], []
    for t in traces:
        if "collective_rank" not in t:
            continue
        label, d = trace_label(t), t.sizes["component"]
        row: dict[str, Any] = {"model": label, "d": d}
        for kind in ("numerical", "entropy", "participation"):
            row[f"r_{kind}"] = _f(t["collective_rank"].sel(rank_kind=kind))
            row[f"ratio_{kind}"] = _f(t["collective_rank_ratio"].sel(rank_kind=kind))
        rows.append(row)
        sentences.append((label, rank_summary(t, energy)["conclusion"]))
    content: list = [Note(RANK)]
    if rows:
        columns = [Column("model", "model", "text"), Column("d", "d", "text")]
        for kind in ("numerical", "entropy", "participation"):
            columns += [Column(f"r* {kind}", f"r_{kind}", digits=1), Column("r*/d", f"ratio_{kind}")]
        content += [
            Table(columns, rows, anchor="rank", attr="model"),
            Note(items=sentences, cls="conclusions"),
        ]
    else:
        content.append(
            Note(Markup("No trace here holds output covariances (capture with <code>--rank</code>)."))
        )
    if "source_spectrum" in stacked:
        content.append(figure("rank", {"profile": rank_profile(stacked)}))
    return Section("rank-section", "Collective rank versus width", "collective rank", content)


def _claims(claims) -> Section:
    from depthscope import zoo

    text = [
        Column("claim", "claim", "text"),
        Column("source", "source", "text"),
        Column("paper", "paper", "text"),
        Column("ours (mean ± sd over seeds)", "ours", "text"),
        Column("verdict", "verdict", "text", cls="verdict"),
    ]
    speed = [
        Column("variant", "variant", "text"),
        Column("standard's steps / steps to its final loss", "ratio", "text"),
    ]
    costs = [
        Column("variant", "variant", "text"),
        Column("params", "params", "text"),
        Column("FLOPs/token", "flops", "text"),
        Column("time/step", "time", "text"),
        Column("gain (nats/byte)", "gain", "text"),
        Column("gain per +1% params", "per_param", "text"),
        Column("per +1% FLOPs", "per_flop", "text"),
        Column("per +1% time", "per_time", "text"),
    ]
    schemes = {e.name: e.scheme for e in zoo.SEEDS.entries}
    return Section(
        "claims",
        "Claims, with seeds",
        "claims",
        [
            Note(
                Markup(
                    "{} Verdicts: see <code>depthscope.analysis.claims</code>; "
                    "<code>depthscope claims</code> prints this table."
                ).format(claims.caveat)
            ),
            Table(text, claims.rows, anchor="claims-table", cls="claims"),
            figure("claims", {"curves": claims.curves, "speed": claims.speed, "schemes": schemes}),
            Table(speed, claims.speedups, anchor="claims-speed"),
            Table(costs, claims.costs, anchor="claims-costs"),
        ],
    )


def _models(traces: list[xr.Dataset], k: int) -> Section:
    children = []
    numbers = [  # (header, variable of the consumer table, decimals)
        ("1/T", "baseline", 3),
        ("embedding share", "embed_share", 3),
        ("latest share", "latest_share", 3),
        ("embedding index", "embed_index", 2),
        ("latest index", "latest_index", 2),
        ("norm growth", "norm_growth", 2),
        (f"pattern (k={k})", "pattern_score", 2),
    ]
    columns = [Column("consumer", "layer", "text"), Column("sources", "n", "text")]
    columns += [Column(header, var, digits=digits) for header, var, digits in numbers]
    for t in traces:
        label = trace_label(t)
        table = consumer_table(t, k)
        rows = [
            {
                "layer": str(r["layer"].item()),
                "n": int(r["n_sources"]),
                **{v: _f(r[v]) for _, v, _ in numbers},
            }
            for r in (table.isel(layer=i) for i in range(table.sizes["layer"]))
        ]
        deep = t.sizes["layer"] > DEEP
        blocks = "; the shares per block on the right (a block's sources summed, its consumers averaged)"
        content: list = [
            figure(
                "model",
                {"trace": t, "blocks": block_view(t) if deep else None, "signed": _is_signed(t)},
                label,
                blocks=blocks if deep else "",
            )
        ]
        if has_native(t):
            content.append(figure("native", {"trace": t}, label))
        content.append(Table(columns, rows, cls="consumers", folded="per-consumer table"))
        note = str(t.attrs.get("consumer_input", ""))
        a = t.attrs
        sub = f"scheme {a.get('scheme', '')}; {checkpoint_cell(t)}; config {a.get('config', '')}"
        children.append(
            Section(
                f"section-{slug(label)}",
                model_heading(t),
                content=content,
                sub=sub + (f"; {note}" if note else ""),
                model=label,
            )
        )
    return Section("models", "Models", "models", children=children)
