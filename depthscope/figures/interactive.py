"""The report's interactive charts: estimator output in, Vega-Lite specifications and compact data out.

Why Vega-Lite: a chart is a small declarative JSON specification (the rest is data), hover
values are a ``tooltip`` channel, zoom and pan are an interval selection bound to the scales,
and a model selector is a parameter that filters the data. Its runtime (Vega, Vega-Lite and
vega-embed, about 0.9 MB minified) comes in the ``vl-convert-python`` wheel
(``vl_convert.javascript_bundle()``), so the report embeds it once, inline, with no network
at build or view time. Plotly's single bundle is about 4.5 MB, which leaves little of the
5 MB page for data; hand-written canvas charts would be smaller but would make us keep axes,
legends, colour scales, tooltips and zoom ourselves.

A chart here is ``Chart(id, data, spec)``: ``data`` names one entry of the page's data table,
stored column by column, each column of repeated labels as a dictionary and indices
(``columns``), numbers rounded to ``DIGITS`` significant digits; the page's script
(``templates/report.js``) turns it into rows and embeds the specification. Several charts may
share one data entry (a model's heatmaps and the overview's).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from depthscope.figures.data import by_model, unpadded

DIGITS = 4  # significant digits of every number a chart holds
WIDTH = 340  # one panel's plot area, px
ZOOM = {  # shift + wheel zooms, drag pans, double-click resets (plain wheel scrolls the page)
    "name": "zoom",
    "select": {"type": "interval", "zoom": "wheel![event.shiftKey]"},
    "bind": "scales",
}


@dataclass(frozen=True)
class Chart:
    """One interactive panel: its element id, the data entry it draws and its Vega-Lite spec.

    ``follows``: the panel's ``pick`` parameter follows the page's model selector.
    """

    id: str
    data: str
    spec: dict[str, Any]
    follows: bool = False


@dataclass
class Charts:
    """The page's data entries (name -> columns) and charts, filled figure by figure."""

    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    charts: list[Chart] = field(default_factory=list)

    def add(self, chart: Chart) -> Chart:
        """Append ``chart`` and return it."""
        self.charts.append(chart)
        return chart

    def payload(self, models: list[str]) -> str:
        """The page's data as a JavaScript expression, safe inside a ``<script>`` element."""
        doc = {
            "models": models,
            "data": self.data,
            "charts": [
                {"id": c.id, "data": c.data, "spec": c.spec, "follows": c.follows} for c in self.charts
            ],
        }
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
        # no "</script>", "<!--" or markup from a label can end or open anything in the element
        return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def rounded(x: float) -> float | None:
    """``x`` to ``DIGITS`` significant digits (None for NaN and infinities: dropped before)."""
    x = float(x)
    if not math.isfinite(x):
        return None
    if x == 0:
        return 0.0
    return float(f"{x:.{DIGITS}g}")


def columns(rows: dict[str, list]) -> dict[str, Any]:
    """Columns for the page: numbers rounded; a column of strings as ``{"dict", "idx"}``."""
    out: dict[str, Any] = {}
    n = {len(v) for v in rows.values()}
    if len(n) > 1:
        raise ValueError(f"columns of different lengths: {n}")
    for name, values in rows.items():
        if values and isinstance(values[0], str):
            names = list(dict.fromkeys(values))
            index = {v: i for i, v in enumerate(names)}
            out[name] = {"dict": names, "idx": [index[v] for v in values]}
        elif values and isinstance(values[0], (int, np.integer)) and not isinstance(values[0], bool):
            out[name] = [int(v) for v in values]
        else:
            out[name] = [rounded(v) for v in values]
    return {"n": n.pop() if n else 0, "columns": out}


# --- heatmaps ------------------------------------------------------------------------------------


def heatmap_data(da: xr.DataArray) -> tuple[dict[str, Any], dict[str, dict[str, list[str]]], tuple]:
    """(columns, axis labels per model, colour range) of a (model?, layer, source) DataArray.

    Each model's cells without its padding (``unpadded``) and without the unavailable (NaN)
    ones; ``i``, ``j`` are a cell's row and column among that model's own consumers and sources.
    """
    rows: dict[str, list] = {"m": [], "l": [], "s": [], "i": [], "j": [], "v": []}
    labels: dict[str, dict[str, list[str]]] = {}
    for label, _, part in by_model(da):
        part = unpadded(part).transpose("layer", "source")
        layers = [str(v) for v in part["layer"].values]
        sources = [str(v) for v in part["source"].values]
        labels[label] = {"y": layers, "x": sources}
        values = np.asarray(part.values, dtype=float)
        for i, j in zip(*np.nonzero(np.isfinite(values))):
            rows["m"].append(label)
            rows["l"].append(layers[i])
            rows["s"].append(sources[j])
            rows["i"].append(int(i))
            rows["j"].append(int(j))
            rows["v"].append(values[i, j])
    finite = [v for v in rows["v"] if math.isfinite(v)]
    span = (min(finite), max(finite)) if finite else (0.0, 1.0)
    return columns(rows), labels, span


def color_scale(kind: str, span: tuple[float, float]) -> dict[str, Any]:
    """The Vega-Lite colour scale of a heatmap: ``log`` (positive weights), ``diverging``
    (centred at 0, symmetric), ``symlog`` (signed weights) or ``linear``; one domain for every
    model, so switching models keeps the colours comparable.
    """
    lo, hi = span
    if kind == "log":
        return {"type": "log", "scheme": "viridis", "domain": [rounded(max(lo, 1e-6)), rounded(hi)]}
    if kind in ("diverging", "symlog"):
        m = rounded(max(abs(lo), abs(hi), 1e-12))
        scale = {"scheme": "redblue", "reverse": True, "domain": [-m, 0, m]}
        return {**scale, "type": "symlog"} if kind == "symlog" else scale
    return {"scheme": "viridis", "domain": [rounded(lo), rounded(hi)]}


def heatmap(
    out: Charts,
    key: str,
    da: xr.DataArray,
    *,
    chart_id: str,
    title: str,
    value: str,
    scale: str = "linear",
    pick: str | None = None,
    follows: bool = True,
    select: str | None = None,
) -> Chart:
    """A heatmap of one model of ``da`` at a time, hover values (consumer, source, value), zoom.

    ``key``: the data entry (made once; charts of the same ``key`` share it). ``pick``: the
    model shown first (default the first); ``follows``: the page's model selector switches it;
    ``select``: a selector of its own with this name (e.g. "step" of a trajectory).
    """
    if key not in out.data:
        cols, labels, span = heatmap_data(da)
        out.data[key] = {**cols, "labels": labels, "span": [rounded(v) for v in span]}
    entry = out.data[key]
    labels, span = entry["labels"], tuple(entry["span"])
    models = list(labels)
    n_rows = max(len(v["y"]) for v in labels.values())
    n_cols = max(len(v["x"]) for v in labels.values())
    cell = max(6, min(18, 560 // max(n_rows, n_cols, 1)))
    param: dict[str, Any] = {"name": "pick", "value": pick if pick is not None else models[0]}
    if select:
        param["bind"] = {"input": "select", "options": models, "name": f"{select} "}
    spec = {
        "title": {"text": title, "anchor": "start", "fontSize": 12},
        "width": n_cols * cell,
        "height": n_rows * cell,
        "params": [param, {"name": "names", "value": labels}, ZOOM],
        "transform": [
            {"filter": "datum.m === pick"},
            {"calculate": "datum.j - 0.5", "as": "x0"},
            {"calculate": "datum.j + 0.5", "as": "x1"},
            {"calculate": "datum.i - 0.5", "as": "y0"},
            {"calculate": "datum.i + 0.5", "as": "y1"},
        ],
        "mark": {"type": "rect"},
        "encoding": {
            "x": _index_axis("x0", "source", "x"),
            "x2": {"field": "x1"},
            "y": {
                **_index_axis("y0", "consumer", "y"),
                "scale": {"nice": False, "zero": False, "reverse": True},
            },
            "y2": {"field": "y1"},
            "color": {
                "field": "v",
                "type": "quantitative",
                "title": value,
                "scale": color_scale(scale, span),
                "legend": {"format": ".3g"},
            },
            "tooltip": [
                {"field": "m", "title": select or "model"},
                {"field": "l", "title": "consumer"},
                {"field": "s", "title": "source"},
                {"field": "v", "title": value, "format": ".4g"},
            ],
        },
    }
    return out.add(Chart(chart_id, key, spec, follows=follows and not select))


def _index_axis(field_name: str, title: str, axis: str) -> dict[str, Any]:
    """A position axis of cell indices labelled with the picked model's labels."""
    return {
        "field": field_name,
        "type": "quantitative",
        "title": title,
        "scale": {"nice": False, "zero": False},
        "axis": {
            "tickMinStep": 1,
            "labelExpr": f"names[pick] ? (names[pick].{axis}[datum.value] || '') : ''",
            "labelAngle": -90 if axis == "x" else 0,
            "grid": False,
        },
    }


# --- curves and points ---------------------------------------------------------------------------


def series_rows(panels: list[tuple[str, str, xr.DataArray]], x: str) -> dict[str, list]:
    """Rows (panel, series, x, y) of curves: each ``(panel, series, DataArray over x)``, NaNs dropped."""
    rows: dict[str, list] = {"p": [], "c": [], "x": [], "y": []}
    for panel, series, da in panels:
        xs = np.asarray(da[x].values, dtype=float)
        for xv, yv in zip(xs, np.asarray(da.values, dtype=float)):
            if math.isfinite(xv) and math.isfinite(yv):
                rows["p"].append(panel)
                rows["c"].append(series)
                rows["x"].append(float(xv))
                rows["y"].append(float(yv))
    return rows


def log_scale(rows: dict[str, list], panel: str | None, axis: str = "y") -> dict[str, Any]:
    """A log axis for the values of ``panel`` (every panel: None) where every one is > 0, else a
    symlog one, linear below the decade of the smallest positive value (within 1e-3..0.1), as the
    PNG figures draw it: a log domain that includes 0 or less draws nothing at all in Vega.
    """
    values = np.array([v for p, v in zip(rows["p"], rows[axis]) if panel is None or p == panel], dtype=float)
    if values.size == 0 or values.min() > 0:
        return {"type": "log"}
    positive = values[values > 0]
    floor = float(np.clip(10 ** math.floor(math.log10(positive.min())), 1e-3, 0.1)) if positive.size else 0.01
    return {"type": "symlog", "constant": floor}


def symlog_ticks(
    scale: dict[str, Any], rows: dict[str, list], panel: str | None, axis: str = "y"
) -> list[float]:
    """Tick values of a symlog axis: 0 and the decades from its linear threshold out to the data,
    both signs (Vega's own ticks on a symlog scale are linear ones, crowded at the top).
    """
    values = np.array([v for p, v in zip(rows["p"], rows[axis]) if panel is None or p == panel], dtype=float)
    floor, top = scale["constant"], float(np.abs(values).max()) if values.size else 1.0
    decades = [10.0**e for e in range(round(math.log10(floor)), math.ceil(math.log10(max(top, floor))) + 1)]
    low = float(values.min()) if values.size else 0.0
    negative = [-d for d in decades if d <= 10 * -low] if low < 0 else []
    return sorted({0.0, *decades, *negative})


EDGE = 8  # pixels between the outermost point and the plot's edge, so no point is cut in half


def _y(rows: dict[str, list], panel: str, title: str, log: bool) -> dict[str, Any]:
    """A curves panel's y encoding: linear, or log (symlog with decade ticks where a value is <= 0)."""
    y: dict[str, Any] = {"field": "y", "type": "quantitative", "title": title, "scale": {"zero": False}}
    if log:
        y["scale"] = log_scale(rows, panel)
        if y["scale"]["type"] == "symlog":
            y["axis"] = {"values": symlog_ticks(y["scale"], rows, panel), "format": "~g"}
    y["scale"]["padding"] = EDGE
    return y


def curves(
    out: Charts,
    key: str,
    rows: dict[str, list],
    *,
    x: str,
    y: dict[str, str],
    series: str = "model",
    colors: dict[str, str] | None = None,
    logx: bool = False,
    logy: tuple[str, ...] = (),
    points: bool = False,
) -> list[Chart]:
    """A panel per entry of ``y`` (panel name -> y-axis title), chart ``{key}-{n}``: one line (or
    point cloud, ``points``) per series, hover values (series, x, y), zoom. ``rows`` from ``series_rows`` (or
    with more columns, shown in the tooltip as they are named).
    """
    if key not in out.data:
        out.data[key] = columns(rows)
    extra = [c for c in rows if c not in ("p", "c", "x", "y")]
    order = list(dict.fromkeys(rows["c"]))
    color: dict[str, Any] = {"field": "c", "type": "nominal", "title": series, "sort": order}
    if colors:
        color["scale"] = {"domain": order, "range": [colors.get(c, "#888888") for c in order]}
    charts = []
    # a reference series (the uniform share 1/T) is drawn dashed and black, apart from every model
    dash = {"condition": {"test": "datum.c === '1/T'", "value": [5, 3]}, "value": [1, 0]}
    if colors and "1/T" in order:
        color["scale"]["range"] = [colors.get(c, "#000000" if c == "1/T" else "#888888") for c in order]
    for n, (panel, ytitle) in enumerate(y.items()):
        mark: dict[str, Any] = (
            {"type": "point", "filled": True, "size": 18} if points else {"type": "line", "point": True}
        )
        spec = {
            "title": {"text": panel, "anchor": "start", "fontSize": 12},
            "width": WIDTH,
            "height": 220,
            "params": [ZOOM],
            "transform": [{"filter": {"field": "p", "equal": panel}}],
            "mark": mark,
            "encoding": {
                "x": {
                    "field": "x",
                    "type": "quantitative",
                    "title": x,
                    "scale": {**(log_scale(rows, None, "x") if logx else {"zero": False}), "padding": EDGE},
                },
                "y": _y(rows, panel, ytitle, panel in logy),
                "color": color,
                "tooltip": [
                    {"field": "c", "title": series},
                    *({"field": c, "title": c} for c in extra),
                    {"field": "x", "title": x, "format": ".4g"},
                    {"field": "y", "title": ytitle, "format": ".4g"},
                ],
            },
        }
        if not points:
            spec["encoding"]["order"] = {"field": "x", "type": "quantitative"}
            if "1/T" in order:
                spec["encoding"]["strokeDash"] = dash
        charts.append(out.add(Chart(f"{key}-{n}", key, spec)))
    return charts


@functools.lru_cache(maxsize=1)
def runtime() -> str:
    """Vega, Vega-Lite and vega-embed as one script (``vegaEmbed`` on ``window``), offline."""
    import vl_convert

    return vl_convert.javascript_bundle()
