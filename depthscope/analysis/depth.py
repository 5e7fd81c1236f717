"""Dilution versus depth: the same schemes at several depths, compared where they saw the same tokens.

Each trace given is one model (a checkpoint, or one step of a trajectory) with, as attrs: ``zoo_group``
(which models are "the same scheme" across depths: a zoo entry's group, else its variant),
``config`` (JSON with ``n_layers``), ``step`` and ``val_loss`` when known. ``depth_table`` picks,
per group and depth, the model at the largest step that every depth of the group reached (equal
tokens seen: the 16-block zoo at 2000 steps against the 8-block trajectories at step 2000), and
gives per (group, n_layers):

    pattern_score[group, n_layers, kind]  the summary's mean pattern score per consumer group
    retention[group, n_layers, source]    the read-out's share of a fixed early write: the
                                          embedding and block 0's MLP (``0.mlp``)
    baseline[n_layers]                    1/n of the read-out: the uniform (1/T) share
    val_loss, loss_gain                   the validation loss, and the standard residual's at the
                                          same depth minus it (> 0: the scheme does better)
    view_lag[group, n_layers, view]       mean read depth (sublayers back) of the q, k, v (and r)
                                          views, averaged over blocks (DCA's q/k/v, MUDDFormer's
                                          q/k/v/r), NaN elsewhere
    rank_ratio[group, n_layers]           r*/d (numerical rank), where spectra were captured
    step[group, n_layers]                 the step compared

Legend: group, n_layers, kind (sublayers, attn, mlp, readout), source (embed, 0.mlp), view.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from depthscope.analysis.causal import views
from depthscope.analysis.dilution import summary
from depthscope.analysis.rank import collective_rank

KINDS = ("sublayers", "attn", "mlp", "readout")
EARLY = ("embed", "0.mlp")  # the fixed early writes whose retention at the read-out is followed
VIEWS = ("q", "k", "v", "r")  # r: MUDDFormer's residual way
STANDARD = "standard"  # the group every loss gain is measured against


def n_layers(trace: xr.Dataset) -> int:
    """The number of blocks a trace's model has (its ``config``'s ``n_layers``; else from its labels)."""
    try:
        return int(json.loads(str(trace.attrs.get("config", "{}")))["n_layers"])
    except (KeyError, TypeError, ValueError, json.JSONDecodeError):
        blocks = [str(b) for b in trace["source_block"].values if str(b).isdigit()]
        return len(set(blocks))


def group_of(trace: xr.Dataset) -> str:
    """Which models are one scheme across depths: the ``zoo_group`` attr (``zoo build``), else ``variant``."""
    return str(trace.attrs.get("zoo_group") or trace.attrs.get("variant") or trace.attrs.get("label", ""))


def comparable(traces: list[xr.Dataset]) -> dict[tuple[str, int], xr.Dataset]:
    """Per (group, n_layers), the model at the largest step every depth of its group reached; only
    groups seen at two depths or more.
    """
    by: dict[str, dict[int, list[xr.Dataset]]] = {}
    for t in traces:
        by.setdefault(group_of(t), {}).setdefault(n_layers(t), []).append(t)
    out = {}
    for group, depths in by.items():
        if len(depths) < 2:
            continue
        steps = [{int(t.attrs.get("step", -1)) for t in ts} for ts in depths.values()]
        common = set.intersection(*steps)
        step = max(common) if common else None
        for depth, ts in depths.items():
            pick = [t for t in ts if step is None or int(t.attrs.get("step", -1)) == step]
            out[group, depth] = max(pick or ts, key=lambda t: int(t.attrs.get("step", -1)))
    return out


def several_depths(traces: list[xr.Dataset]) -> bool:
    """Whether some group has models at two or more depths (what the versus-depth section needs)."""
    depths: dict[str, set[int]] = {}
    for t in traces:
        depths.setdefault(group_of(t), set()).add(n_layers(t))
    return any(len(d) > 1 for d in depths.values())


def _row(t: xr.Dataset, k: int) -> dict[str, np.ndarray | float]:
    s = summary(t, k)
    ro = t["contribution_share"].sel(layer="readout") if "readout" in t["layer"].values else None
    sources = set(map(str, t["source"].values))
    retention = [float(ro.sel(source=src)) if ro is not None and src in sources else np.nan for src in EARLY]
    v = views(t)
    lag = [float(v["mean_lag"].sel(view=x).mean()) if x in v["view"].values else np.nan for x in VIEWS]
    rank = np.nan
    if "source_spectrum" in t:
        rank = float(collective_rank(t)["collective_rank_ratio"].sel(rank_kind="numerical"))
    n_read = float(t["mixing"].sel(layer="readout").notnull().sum()) if ro is not None else np.nan
    return {
        "pattern_score": np.array([float(s["pattern_score"].sel(group=g)) for g in KINDS]),
        "retention": np.array(retention),
        "baseline": 1.0 / n_read,
        "val_loss": float(t.attrs.get("val_loss", np.nan)),
        "view_lag": np.array(lag),
        "rank_ratio": rank,
        "step": float(t.attrs.get("step", -1)),
    }


def depth_table(traces: list[xr.Dataset], k: int = 2) -> xr.Dataset:
    """The versus-depth table of the module docstring, from single-model traces."""
    picked = comparable(traces)
    groups = list(dict.fromkeys(g for g, _ in picked))
    schemes = {g: str(t.attrs.get("scheme", "")) for (g, _), t in picked.items()}
    depths = sorted({d for _, d in picked})
    shapes = {"pattern_score": (len(KINDS),), "retention": (len(EARLY),), "view_lag": (len(VIEWS),)}
    arrays = {
        name: np.full((len(groups), len(depths), *shapes.get(name, ())), np.nan)
        for name in ("pattern_score", "retention", "val_loss", "view_lag", "rank_ratio", "step")
    }
    baseline = np.full(len(depths), np.nan)
    for (g, d), t in picked.items():
        row = _row(t, k)
        i, j = groups.index(g), depths.index(d)
        for name in arrays:
            arrays[name][i, j] = row[name]
        baseline[j] = row["baseline"]
    dims = ("group", "n_layers")
    out = xr.Dataset(
        {
            "pattern_score": ((*dims, "kind"), arrays["pattern_score"]),
            "retention": ((*dims, "source"), arrays["retention"]),
            "view_lag": ((*dims, "view"), arrays["view_lag"]),
            **{name: (dims, arrays[name]) for name in ("val_loss", "rank_ratio", "step")},
            "baseline": (("n_layers",), baseline),
        },
        coords={
            "group": np.array(groups, dtype=object),
            "scheme": ("group", np.array([schemes[g] for g in groups], dtype=object)),
            "n_layers": np.array(depths, dtype=np.int64),
            "kind": np.array(KINDS, dtype=object),
            "source": np.array(EARLY, dtype=object),
            "view": np.array(VIEWS, dtype=object),
        },
        attrs={"k": k},
    )
    if STANDARD in groups:
        out["loss_gain"] = out["val_loss"].sel(group=STANDARD) - out["val_loss"]
    else:
        out["loss_gain"] = xr.full_like(out["val_loss"], np.nan)
    units = {
        "pattern_score": ("mean pattern score (input and recent layers; 1 = uniform)", "1"),
        "retention": ("read-out share of an early write", "fraction"),
        "view_lag": ("mean read depth of a view, over blocks", "sublayers"),
        "val_loss": ("validation loss", "nats/byte"),
        "loss_gain": ("the standard residual's validation loss minus this one's", "nats/byte"),
        "rank_ratio": ("r*/d (numerical rank)", "1"),
        "step": ("training step compared", "steps"),
        "baseline": ("uniform share 1/n at the read-out (the 1/T baseline)", "fraction"),
    }
    for name, (long_name, unit) in units.items():
        out[name].attrs.update(long_name=long_name, units=unit)
    return out
