"""The report: checkpoints or traces in, one self-contained web page with every figure out.

``build_report`` captures each checkpoint (or reads each trace), stacks the traces along a
``scheme`` dimension, and writes into the output directory:

* ``index.html``: self-contained (figures embedded as PNG data), with the cross-scheme heatmap
  grids and dilution curves first, the table of pattern scores and dilution indices, the
  collective-rank section, one section per scheme, the settings used and the depthscope version;
  every figure also links to its PNG and SVG files;
* ``traces.nc``: all traces along ``scheme`` (``depthscope.probes.load_trace`` reads it);
* every figure as PNG and SVG.

Everything is first written to a temporary directory beside the output and moved into place at
the end, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import base64
import html
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from depthscope.analysis.dilution import consumer_table, summary
from depthscope.analysis.rank import add_ranks
from depthscope.errors import DepthscopeError
from depthscope.probes import capture, load_trace, save_trace
from depthscope.probes.trace import select_scheme, stack_traces
from depthscope.progress import bar


@dataclass(frozen=True)
class ReportSettings:
    """How traces are captured and summarised."""

    tokens: int = 8192  # tokens captured per checkpoint
    batch_size: int = 16
    seed: int = 0
    k: int = 2  # recent sources counted by the pattern score
    corpus: str | None = None  # None = the Python standard library
    energy: float = 0.99  # energy fraction of the numerical rank


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    caption: str


def input_kind(path: Path) -> str:
    """'checkpoint', 'trace' or 'model-dir', from the file's content; DepthscopeError otherwise."""
    if path.is_dir() and (path / "config.json").is_file():
        return "model-dir"
    if path.is_file():
        with path.open("rb") as f:
            head = f.read(9)
        if head[:3] == b"CDF" or head[:4] == b"\x89HDF":  # netCDF3 / netCDF4 (HDF5)
            return "trace"
        if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size:
            return "checkpoint"  # safetensors: 8-byte header length, then a JSON header
    elif not path.exists():
        raise DepthscopeError(f"{path}: no such file or directory")
    raise DepthscopeError(f"{path}: neither a checkpoint (.safetensors), a trace (.nc) nor a Hugging Face model directory")


def collect_traces(paths: list[Path], settings: ReportSettings, *, progress: bool = True) -> list[xr.Dataset]:
    """One trace per input (a stacked trace file contributes each of its schemes)."""
    from depthscope.probes.bridge import load_model

    kinds = [input_kind(p) for p in paths]  # check every input before the slow work starts
    traces: list[xr.Dataset] = []
    with bar("report: capture", len(paths), enabled=progress) as pb:
        for path, kind in zip(paths, kinds):
            if kind == "trace":
                t = load_trace(path)
                traces += [select_scheme(t, s) for s in t["scheme"].values] if "scheme" in t.dims else [t]
            else:
                model = load_model(str(path))
                traces.append(
                    capture(
                        model, settings.corpus, n_tokens=settings.tokens, batch_size=settings.batch_size,
                        seed=settings.seed, checkpoint=str(path), rank=True,
                    )
                )
            pb.advance(1)
    return [add_ranks(t, settings.energy) if "source_spectrum" in t else t for t in traces]


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-") or "scheme"


def _is_signed(t: xr.Dataset) -> bool:
    m = t["mixing"].values
    return bool(np.nanmin(m) < 0)


def _make_figures(stacked: xr.Dataset, traces: list[xr.Dataset], k: int) -> list[tuple[Figure, Any]]:
    """(description, matplotlib Figure) for every figure of the report, in page order."""
    import matplotlib.pyplot as plt

    from depthscope.figures.curves import dilution_panels, pattern_scores, retention
    from depthscope.figures.heatmaps import heatmap, heatmap_grid
    from depthscope.figures.rank import rank_profile

    signed = any(_is_signed(t) for t in traces)
    out = [
        (
            Figure("grid-mixing", "Depth-mixing weights of every scheme",
                   "Effective weight M[l, s] of each source (columns) in each consumer's input (rows), "
                   "token mean, in the delta basis (embedding + sublayer outputs). A standard residual is "
                   "1 everywhere; blank cells are sources not yet written. Shared colour scale"
                   + (", symmetric-log (weights are signed)." if signed else ".")),
            heatmap_grid(stacked, "mixing", symlog=signed),
        ),
        (
            Figure("grid-share", "Contribution shares of every scheme",
                   "Share of each source in each consumer's input: sum <c[l,s], h_l> / sum |h_l|^2 "
                   "(each row sums to 1). The uniform 1/T share is 1/(number of sources)."),
            heatmap_grid(stacked, "contribution_share"),
        ),
        (
            Figure("dilution", "Dilution against the 1/T baseline",
                   "Contribution share of the embedding, the first sublayer and the latest source at each "
                   "consumer depth; the dashed line is the uniform share 1/T."),
            dilution_panels(stacked),
        ),
        (
            Figure("pattern", "Input-and-recent pattern scores",
                   f"Mass of |mixing| on the embedding and the last {k} sources over what a uniform row "
                   "puts there: 1 is uniform (a standard residual), above 1 is the pattern the papers report."),
            pattern_scores(stacked, k=k).figure,
        ),
        (
            Figure("retention", "Retention of sources",
                   "Contribution share of each source at the consumers after it, by lag in sublayers."),
            retention(stacked).figure,
        ),
    ]
    if "source_spectrum" in stacked:
        out.append(
            (
                Figure("rank", "Effective rank of each sublayer's outputs",
                       "Numerical rank (0.99 of the energy) of each sublayer's outputs over tokens; their sum "
                       "is the collective rank r* of DCA's theory (arXiv 2502.06785, Sec. 4)."),
                rank_profile(stacked).figure,
            )
        )
    for t in traces:
        label = t.attrs.get("label", t.attrs.get("scheme", "trace"))
        fig, axes = plt.subplots(1, 2, figsize=(12, 5.2))
        heatmap(t, axes[0], var="mixing", symlog=_is_signed(t), title="mixing weights")
        heatmap(t, axes[1], var="contribution_share", title="contribution shares")
        fig.suptitle(label)
        out.append((Figure(f"scheme-{_slug(label)}", label, "Mixing weights (left) and contribution shares (right)."), fig))
    return out


def _num(v: Any, digits: int = 3) -> str:
    f = float(v)
    if not np.isfinite(f):
        return '<td data-value="nan">-</td>'
    return f'<td data-value="{f!r}">{f:.{digits}f}</td>'


def _summary_table(traces: list[xr.Dataset], k: int) -> str:
    head = (
        "<tr><th>scheme</th><th>checkpoint / trace</th><th>tokens</th>"
        f"<th>pattern score (k={k})</th><th>embedding dilution index</th><th>latest-source dilution index</th>"
        "<th>read-out share: embedding</th><th>read-out share: latest</th><th>max residual error</th></tr>"
    )
    rows = []
    for t in traces:
        s = summary(t, k)
        label = html.escape(str(t.attrs.get("label", "")))
        rows.append(
            f'<tr data-scheme="{label}"><td>{label}</td><td>{html.escape(Path(str(t.attrs.get("checkpoint", ""))).name)}</td>'
            f'<td>{int(t.attrs.get("tokens", 0))}</td>'
            + _num(s["pattern_score"]).replace("<td", '<td class="pattern"', 1)
            + _num(s["embed_index"]) + _num(s["latest_index"]) + _num(s["readout_embed_share"])
            + _num(s["readout_latest_share"])
            + f'<td>{float(s["max_residual_error"]):.1e}</td></tr>'
        )
    return f'<table id="summary">{head}{"".join(rows)}</table>'


def _rank_table(traces: list[xr.Dataset]) -> str:
    rows = []
    for t in traces:
        if "collective_rank" not in t:
            continue
        label = html.escape(str(t.attrs.get("label", "")))
        d = t.sizes["component"]
        cells = "".join(
            _num(t["collective_rank"].sel(rank_kind=kind), 1) + _num(t["collective_rank_ratio"].sel(rank_kind=kind), 3)
            for kind in ("numerical", "entropy", "participation")
        )
        rows.append(f'<tr data-scheme="{label}"><td>{label}</td><td>{d}</td>{cells}</tr>')
    if not rows:
        return "<p>No trace here holds output covariances (capture with <code>--rank</code>).</p>"
    head = (
        "<tr><th>scheme</th><th>d</th><th>r* numerical</th><th>r*/d</th><th>r* entropy</th><th>r*/d</th>"
        "<th>r* participation</th><th>r*/d</th></tr>"
    )
    return f'<table id="rank">{head}{"".join(rows)}</table>'


def _consumer_table(t: xr.Dataset, k: int) -> str:
    c = consumer_table(t, k)
    head = (
        "<tr><th>consumer</th><th>sources</th><th>1/T</th><th>embedding share</th><th>latest share</th>"
        f"<th>embedding index</th><th>latest index</th><th>pattern (k={k})</th></tr>"
    )
    rows = []
    for i in range(c.sizes["layer"]):
        r = c.isel(layer=i)
        rows.append(
            f"<tr><td>{html.escape(str(r['layer'].item()))}</td><td>{int(r['n_sources'])}</td>"
            + _num(r["baseline"]) + _num(r["embed_share"]) + _num(r["latest_share"])
            + _num(r["embed_index"], 2) + _num(r["latest_index"], 2) + _num(r["pattern_score"], 2) + "</tr>"
        )
    return f'<table class="consumers">{head}{"".join(rows)}</table>'


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0 auto;max-width:1180px;padding:24px;color:#222;line-height:1.45}
h1{margin-bottom:0}h2{margin-top:2.2em;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;margin-top:4px}figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:0.9em}figcaption a{margin-left:0.6em}
table{border-collapse:collapse;font-size:0.88em;margin:0.6em 0}th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f6f6f6}td:first-child,th:first-child{text-align:left}code{background:#f4f4f4;padding:0 3px}
details{margin:0.6em 0}nav a{margin-right:0.8em}
"""

SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images-loaded', ok + '/' + imgs.length);
});
"""


def _figure_html(fig: Figure, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure id="{fig.name}"><img src="data:image/png;base64,{data}" alt="{html.escape(fig.title)}">'
        f"<figcaption><b>{html.escape(fig.title)}.</b> {html.escape(fig.caption)}"
        f'<a href="{fig.name}.png">PNG</a><a href="{fig.name}.svg">SVG</a></figcaption></figure>'
    )


def _page(traces, stacked, figures: dict[str, str], settings: ReportSettings, elapsed: float) -> str:
    from depthscope import __version__

    labels = [str(t.attrs.get("label", "")) for t in traces]
    per_scheme = []
    for t, label in zip(traces, labels):
        name = f"scheme-{_slug(label)}"
        cfg = html.escape(str(t.attrs.get("config", "")))
        per_scheme.append(
            f'<section id="section-{_slug(label)}"><h3>{html.escape(label)}</h3>'
            f'<p class="sub">scheme <code>{html.escape(str(t.attrs.get("scheme", "")))}</code>; '
            f'{html.escape(str(t.attrs.get("checkpoint", "")))}; config <code>{cfg}</code></p>'
            f"{figures[name]}<details><summary>per-consumer table</summary>{_consumer_table(t, settings.k)}</details></section>"
        )
    corpus = html.escape(str(traces[0].attrs.get("corpus", "")) if traces else "")
    settings_rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in asdict(settings).items())
    top = ["grid-mixing", "grid-share", "dilution"]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>depthscope report</title><style>{CSS}</style></head>
<body>
<h1>depthscope report</h1>
<p class="sub">{len(traces)} schemes: {html.escape(", ".join(labels))}. Corpus: {corpus}. depthscope {__version__}.</p>
<nav><a href="#overview">overview</a><a href="#scores">scores</a><a href="#rank-section">collective rank</a><a href="#schemes">schemes</a><a href="#settings">settings</a></nav>
<h2 id="overview">How each scheme mixes depth</h2>
{"".join(figures[n] for n in top)}
<h2 id="scores">Pattern scores and dilution indices</h2>
<p>Means over consumers (read-out reported separately). Dilution index = share x number of available sources
(1 = the uniform 1/T share). Pattern score: |mixing| mass on the embedding and the last {settings.k} sources over the
uniform mass (1 = uniform; &gt; 1 = the input-and-recent-layers pattern).</p>
{_summary_table(traces, settings.k)}
{figures["pattern"]}
{figures["retention"]}
<h2 id="rank-section">Collective rank versus width</h2>
<p>DCA (arXiv 2502.06785, Sec. 4) predicts that learnable depth weights help most when the collective rank r*
(sum of the layers' ranks) is small compared with the width d. Ranks are effective ranks of each sublayer's outputs
over the captured tokens.</p>
{_rank_table(traces)}
{figures.get("rank", "")}
<h2 id="schemes">Schemes</h2>
{"".join(per_scheme)}
<h2 id="settings">Settings</h2>
<table>{settings_rows}<tr><td>depthscope version</td><td>{__version__}</td></tr>
<tr><td>traces file</td><td><a href="traces.nc">traces.nc</a></td></tr><tr><td>time</td><td>{elapsed:.1f} s</td></tr></table>
<script>{SCRIPT}</script>
</body></html>
"""


def build_report(
    inputs: list[str | Path], out_dir: str | Path, settings: ReportSettings = ReportSettings(), *, progress: bool = True
) -> Path:
    """Write the report of ``inputs`` (checkpoints, traces, model dirs; none = the bundled zoo)."""
    import matplotlib.pyplot as plt

    from depthscope import zoo
    from depthscope.figures.style import save

    start = time.perf_counter()
    out_dir = Path(out_dir)
    paths = [Path(p) for p in inputs] or zoo.checkpoints()
    for p in paths:
        input_kind(p)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    except OSError as err:
        raise DepthscopeError(f"cannot write the report to {out_dir}: {err.strerror or err}") from None
    try:
        traces = collect_traces(paths, settings, progress=progress)
        stacked = stack_traces(traces)
        traces = [select_scheme(stacked, s) for s in stacked["scheme"].values]  # unique labels
        figures: dict[str, str] = {}
        made = _make_figures(stacked, traces, settings.k)
        with bar("report: figures", len(made), enabled=progress) as pb:
            for desc, fig in made:
                written = save(fig, tmp / desc.name, formats=("png", "svg"))
                png = next(p for p in written if p.suffix == ".png")
                figures[desc.name] = _figure_html(desc, png.read_bytes())
                plt.close(fig)
                pb.advance(1)
        save_trace(stacked, tmp / "traces.nc")
        (tmp / "index.html").write_text(_page(traces, stacked, figures, settings, time.perf_counter() - start), encoding="utf-8")
        for f in sorted(tmp.iterdir()):  # index.html last: a complete page appears only at the end
            if f.name != "index.html":
                os.replace(f, out_dir / f.name)
        os.replace(tmp / "index.html", out_dir / "index.html")
    except OSError as err:
        raise DepthscopeError(f"cannot write the report to {out_dir}: {err.strerror or err}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        plt.close("all")
    return out_dir / "index.html"
