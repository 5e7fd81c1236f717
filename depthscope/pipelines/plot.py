"""One publication figure of a trace: ``depthscope plot TRACE --out FIG.pdf``.

The quantity (``analysis.select.QUANTITIES``: row-normalised weights, raw weights, contribution
shares, or the departure from the 1/T baseline as share x n_l on a scale centred at 1), one model
of a stacked trace, a selection of consumers and sources (labels, kinds, blocks and block ranges:
``analysis.select``), the block-level view of a deep model, the colour map, the scale and the size.
The colour bar carries a short label; the formula is the figure's caption, printed by the command
and kept in the file's metadata (PDF subject, SVG description), so a paper can quote it.

Defaults: weights on a log scale (rows fall as 1/n_l with depth), departure linear centred at 1,
the others linear centred at 0. The figure is written atomically in the format its suffix names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthscope.errors import DepthscopeError

FORMATS = ("pdf", "svg", "png")
SCALES = ("log", "linear", "symlog")


def check_figure_path(out: Path) -> str:
    """The format ``out``'s suffix names; DepthscopeError for any other suffix."""
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise DepthscopeError(f"{out}: the figure's name must end in .pdf, .svg or .png")
    return fmt


def plot_trace(
    trace_path: str | Path,
    out: str | Path,
    *,
    var: str = "weights",
    model: str | None = None,
    layers: str | None = None,
    sources: str | None = None,
    blocks: bool = False,
    cmap: str | None = None,
    scale: str | None = None,
    size: tuple[float, float] | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
) -> tuple[Path, str]:
    """Write one heatmap of the trace at ``trace_path`` to ``out``; (the path, its caption)."""
    import matplotlib.pyplot as plt

    from depthscope.analysis.select import QUANTITIES, caption, pick, quantity
    from depthscope.figures.heatmaps import plot_heatmap
    from depthscope.figures.style import save
    from depthscope.trace import STACK, load_trace, select_model

    out = Path(out)
    fmt = check_figure_path(out)
    if var not in QUANTITIES:
        raise DepthscopeError(f"unknown --var {var!r} (one of {', '.join(QUANTITIES)})")
    if scale is not None and scale not in SCALES:
        raise DepthscopeError(f"unknown --scale {scale!r} (one of {', '.join(SCALES)})")
    from matplotlib import colormaps

    if cmap is not None and cmap not in colormaps:
        raise DepthscopeError(f"unknown colour map {cmap!r} (matplotlib's, e.g. viridis, magma, RdBu_r)")
    trace = load_trace(trace_path)
    if STACK in trace.dims:
        labels = [str(m) for m in trace[STACK].values]
        if model is None and len(labels) > 1:
            raise DepthscopeError(
                f"{trace_path} holds {len(labels)} models: choose one with --model ({', '.join(labels)})"
            )
        trace = select_model(trace, model or labels[0])
    elif model is not None and model != trace.attrs.get("label"):
        raise DepthscopeError(f"{trace_path} holds one model, {trace.attrs.get('label')!r}, not {model!r}")
    da = pick(pick(quantity(trace, var, blocks=blocks), "layer", layers), "source", sources)
    scale = scale or ("log" if var == "weights" else "linear")
    center = 1.0 if var == "departure" and scale == "linear" else None
    said = f"{trace.attrs.get('label', '')}: {caption(var, blocks=blocks, sources=sources)}."
    ax = plot_heatmap(
        da,
        log=scale == "log",
        symlog=scale == "symlog",
        center=center,
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        figsize=size,
        title=str(trace.attrs.get("label", "")),
    )
    fig = ax.figure
    try:
        (written,) = save(fig, out, formats=(fmt,), caption=said)
    finally:
        plt.close(fig)
    return written, said


def inspect_prompt(
    model_path: str | Path,
    text: str,
    out: str | Path,
    *,
    position: int | None = None,
    layer: str | None = None,
    var: str = "share",
    spec_file: Any = None,
    trust_remote_code: bool = False,
    tokenizer: str | None = None,
) -> tuple[Path, str]:
    """``depthscope inspect``: one prompt through a model, drawn (``out`` .pdf/.svg/.png) or saved as
    the per-position dataset (``out`` .nc). The figure is one position's consumer x source heatmap
    (``position``, default the last), or with ``layer`` that consumer's sources along the prompt;
    ``spec_file`` (a ``probes.specfile.SpecFile``) says how to load and read a model no family knows.
    Returns (the path written, what it shows).
    """
    import matplotlib.pyplot as plt

    from depthscope.atomic import atomic_path
    from depthscope.figures.heatmaps import plot_heatmap
    from depthscope.figures.style import save
    from depthscope.probes import inspect
    from depthscope.probes.load import load_tokenizer
    from depthscope.probes.specfile import load_model_with, set_up

    out = Path(out)
    table = out.suffix.lower() == ".nc"
    if not table:
        check_figure_path(out)
    name = {"share": "contribution_share", "mixing": "mixing"}.get(var)
    if name is None:
        raise DepthscopeError(f"unknown --var {var!r} (share or mixing)")
    model = load_model_with(spec_file, model_path, trust_remote_code=trust_remote_code)
    set_up(spec_file, model, 1, None)
    spec = spec_file.require_spec() if spec_file is not None else None
    ds = inspect(model, text, spec=spec, tokenizer=load_tokenizer(tokenizer) if tokenizer else None)
    if table:
        with atomic_path(out) as tmp:
            ds.to_netcdf(tmp)
        return (
            out,
            f"{ds.sizes['pos']} positions x {ds.sizes['layer']} consumers x {ds.sizes['source']} sources",
        )
    n = ds.sizes["pos"]
    if layer is not None:
        if layer not in [str(v) for v in ds.layer.values]:
            raise DepthscopeError(f"no consumer {layer!r} (e.g. {', '.join(map(str, ds.layer.values[:4]))})")
        da = ds[name].sel(layer=layer).dropna("source", how="all").transpose("source", "pos")
        da = da.assign_coords(pos=[f"{i}:{t!r}"[:14] for i, t in enumerate(ds["token"].values)])
        what = f"{layer}'s sources along the prompt"
    else:
        p = n - 1 if position is None else position
        if not -n <= p < n:
            raise DepthscopeError(f"--position must be within the prompt's {n} positions, got {p}")
        p %= n
        da = ds[name].isel(pos=p)
        what = f"position {p} ({ds['token'].values[p]!r})"
    da.attrs = {"long_name": "contribution share" if var == "share" else "weight M[l, s]", "units": "1"}
    ax = plot_heatmap(da, title=f"{ds.attrs.get('label', '')}: {what}")
    try:
        (written,) = save(ax.figure, out, formats=(out.suffix.lower().lstrip("."),), caption=what)
    finally:
        plt.close(ax.figure)
    return written, what
