"""Figures for the DeepCrossAttention theory and the identity experiment (arXiv 2502.06785).

Data in (DataArrays from ``depthscope.analysis.theory``, dicts from
``depthscope.analysis.identity``), matplotlib Axes or Figure out, drawn in the house style
(``figures.style``: colour-blind-safe palette, ResNet in the standard residual's grey, GRN in
DCA's colour). Nothing here shows or saves. Data lines are drawn first and in input
order, so ``ax.lines[i]`` is the i-th input; reference lines (the zero gain) come after them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr
from matplotlib.ticker import NullFormatter

from depthscope.figures.style import PALETTE, new_axes, scheme_color, styled, subplots

MODEL_STYLE = {  # a ResNet is the standard residual; GRN is DCA's mixing (arXiv 2502.06785)
    "resnet": {"color": scheme_color("standard"), "label": "ResNet"},
    "grn_v1": {"color": scheme_color("dca"), "label": "GRN-v1"},
}
VARIANT_LINESTYLE = {"v1": "-", "v2": "--"}
TASK_TITLE = {"identity": "(a) identity, y = x", "random": "(b) random map, y = Ax + b"}
TASK_LINESTYLE = {"identity": "-", "random": ":"}


def _axes(ax):
    return new_axes() if ax is None else ax


def _as_list(data) -> list[xr.DataArray]:
    return [data] if isinstance(data, xr.DataArray) else list(data)


def _colour_by(curves: Sequence[xr.DataArray], key: str) -> dict:
    """One palette colour per distinct value of attrs[key], in order of first appearance."""
    values = list(dict.fromkeys(c.attrs.get(key) for c in curves))
    return {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(values)}


def _gain_lines(ax, curves, x: str, extra) -> None:
    """One gain curve per (variant, d): colour by d, line style by variant; a zero line."""
    colours = _colour_by(curves, "d")
    for c in curves:
        v = c.attrs.get("variant", "v1")
        ax.plot(
            c[x].values,
            c.values,
            color=colours[c.attrs.get("d")],
            linestyle=VARIANT_LINESTYLE.get(v, "-"),
            label=f"GRN-{v}, d = {c.attrs.get('d')}{extra(c)}",
        )
    ax.axhline(0.0, color="0.6", linewidth=0.8)


@styled
def plot_gain_vs_rank(gains, ax=None):
    """Excess-risk gain (ResNet minus GRN at equal parameters) versus r* (paper Fig. 5, left).

    ``gains``: one DataArray from ``theory.gain_curve`` or a sequence of them (e.g. d = 100,
    200, 300 for v1 and v2); colour follows d, line style the variant.
    """
    ax = _axes(ax)
    curves = _as_list(gains)
    _gain_lines(ax, curves, "r_star", lambda c: "")
    ax.set_xlabel("collective rank r*")
    ax.set_ylabel("excess-risk gain (ResNet - GRN)")
    ax.set_title(_lambda_title(curves))
    ax.legend()
    return ax


@styled
def plot_gain_vs_lambda_min(gains, ax=None):
    """Excess-risk gain versus lambda_min at fixed r* and lambda_max (paper Fig. 5, right).

    ``gains``: one DataArray from ``theory.gain_lambda_curve`` or a sequence of them.
    """
    ax = _axes(ax)
    curves = _as_list(gains)
    _gain_lines(ax, curves, "lambda_min", lambda c: f", r* = {c.attrs.get('r_star')}")
    ax.set_xlabel("lambda_min (smallest eigenvalue of A - I)")
    ax.set_ylabel("excess-risk gain (ResNet - GRN)")
    ax.set_title(f"lambda_max = {curves[0].attrs.get('lambda_max')}" if curves else "")
    ax.legend()
    return ax


def _lambda_title(curves) -> str:
    if not curves:
        return ""
    a = curves[0].attrs
    return f"lambda_min = {a.get('lambda_min')}, lambda_max = {a.get('lambda_max')}"


@styled
def plot_threshold_vs_kappa(numerical, derived=None, ax=None):
    """Largest winning r*/d versus kappa: numerical (solid) and the derived closed form (dashed).

    ``numerical``: DataArray(s) from ``theory.threshold_curve``; ``derived``: DataArray(s) from
    ``theory.derived_bound_curve``, labelled "derived here" (our reconstruction, not the
    paper's printed threshold). Numerical lines come first, then derived ones.
    """
    ax = _axes(ax)
    nums = _as_list(numerical)
    ders = [] if derived is None else _as_list(derived)
    colours = _colour_by(nums + ders, "variant")
    for c, numerical in [(c, True) for c in nums] + [(c, False) for c in ders]:
        v = c.attrs.get("variant", "v1")
        what = f"numerical (d = {c.attrs.get('d')})" if numerical else "sufficient condition (derived here)"
        style = {"marker": "o"} if numerical else {"linestyle": "--"}
        ax.plot(c["kappa"].values, c.values, color=colours[v], label=f"GRN-{v}, {what}", **style)
    ax.set_xlabel("task complexity kappa = lambda_min / lambda_max")
    ax.set_ylabel("threshold r*/d")
    ax.set_ylim(0.0, 1.05)
    ax.legend(loc="lower right")
    return ax


@styled
def plot_identity_task(curves: dict, ax=None, *, task: str = "identity"):
    """One task of the identity experiment: MSE versus steps, one line per model, log y.

    ``curves``: ``identity.run_identity``'s dict for that task (model -> MSE per step: ResNet
    and GRN-v1); lines in its order.

    Returns:
        The Axes.
    """
    ax = _axes(ax)
    for model, curve in curves.items():
        style = MODEL_STYLE.get(model, {"label": model})
        curve = np.asarray(curve, dtype=float)
        ax.plot(np.arange(curve.size), curve, **style)
    ax.set_yscale("log")
    ax.set_xlabel("SGD step (batch of 100)")
    ax.set_ylabel("mean squared error")
    ax.set_title(TASK_TITLE.get(task, task))
    ax.legend()
    return ax


@styled
def plot_identity_curves(results: dict):
    """The identity experiment (paper Fig. 1): ``plot_identity_task`` of each task present.

    ``results`` is ``identity.run_identity``'s dict; one panel per task present, in the order
    identity, random. Returns the Figure; panel i is ``fig.axes[i]`` with the ResNet line first.
    """
    tasks = [t for t in TASK_TITLE if t in results]
    fig, axes = subplots(1, len(tasks), figsize=(5.0 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        plot_identity_task(results[task], ax, task=task)
    return fig


@styled
def plot_identity_sweep(sweep: dict, ax=None):
    """Final MSE versus width d at fixed r*, for each model and each task in ``sweep``.

    ``sweep`` is ``identity.width_sweep``'s dict. Lines in order: for each task (identity,
    random) present, ResNet then GRN-v1. Log-log axes; the top axis reads r*/d.
    """
    ax = _axes(ax)
    ds = np.asarray(sweep["d"], dtype=float)
    for task in (t for t in TASK_TITLE if t in sweep):
        for model, finals in sweep[task].items():
            style = MODEL_STYLE.get(model, {"label": model})
            ax.plot(
                ds,
                np.asarray(finals, dtype=float),
                color=style.get("color"),
                linestyle=TASK_LINESTYLE[task],
                marker="o",
                label=f"{style['label']}, {task}",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"width d (collective rank r* = {sweep.get('r_star')})")
    ax.set_ylabel("final mean squared error")
    r_star = float(sweep.get("r_star", 1))

    def ratio(v):  # r*/d and back are the same map; matplotlib probes it at 0 too
        with np.errstate(divide="ignore"):
            return r_star / np.asarray(v, dtype=float)

    top = ax.secondary_xaxis("top", functions=(ratio, ratio))
    top.set_xticks(ratio(ds), [f"{x:.2g}" for x in ratio(ds)])
    top.xaxis.set_minor_formatter(NullFormatter())
    top.set_xlabel("r*/d")
    ax.legend()
    return ax
