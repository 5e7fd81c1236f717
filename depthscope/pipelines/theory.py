"""DCA's Fig. 5 (arXiv 2502.06785) with exact risks: the curves, their JSON record and figures.

``depthscope rank theory``: gain versus r* (d = 100, 200, 300) and versus lambda_min, and the
equal-budget threshold versus kappa, for GRN-v1 and GRN-v2; the numbers come from
``depthscope.analysis.theory``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from depthscope.analysis.theory import derived_bound_curve, gain_curve, gain_lambda_curve, threshold_curve
from depthscope.pipelines.files import save_figures, write_json


def figure_5(variants=("v1", "v2"), n_tasks: int = 2, seed: int = 0) -> dict:
    """The curves of the paper's Fig. 5 (exact risks) and the threshold versus kappa.

    Returns {"gains": gain_curve at d = 100, 200, 300 (r* from 1 to 99, lambda_min 5, lambda_max 10),
    "lambda": gain_lambda_curve at d = 100, r* = 50 (lambda_min 2..10), "threshold":
    threshold_curve at d = 100, "bound": derived_bound_curve}, each a list over ``variants``.
    """
    r_values, lambdas, kappas = np.arange(1, 100, 3), np.linspace(2, 10, 9), np.linspace(0.05, 1.0, 12)
    return {
        "gains": [
            gain_curve(d, r_values, 5.0, 10.0, v, n_tasks, seed) for v in variants for d in (100, 200, 300)
        ],
        "lambda": [gain_lambda_curve(100, 50, lambdas, 10.0, v, n_tasks, seed) for v in variants],
        "threshold": [threshold_curve(kappas, 100, v, 10.0, n_tasks, seed) for v in variants],
        "bound": [derived_bound_curve(kappas, v, d=100) for v in variants],
    }


def _row(curve, x: str, y: str, **fixed) -> dict:
    """One curve of ``figure_5`` as a JSON row: its variant, the fixed settings, then x and y."""
    return {"variant": curve.attrs["variant"], **fixed, x: curve[x].values.tolist(), y: curve.values.tolist()}


def figure_5_document(curves: dict, n_tasks: int, seed: int) -> dict:
    """JSON-ready record of ``figure_5``'s curves."""
    return {
        "settings": {
            "variants": sorted({c.attrs["variant"] for c in curves["gains"]}),
            "tasks": n_tasks,
            "seed": seed,
            "lambda_min": 5.0,
            "lambda_max": 10.0,
        },
        "gain_vs_r_star": [_row(g, "r_star", "gain", d=g.attrs["d"]) for g in curves["gains"]],
        "gain_vs_lambda_min": [_row(g, "lambda_min", "gain", d=100, r_star=50) for g in curves["lambda"]],
        "threshold_vs_kappa": [
            {
                "variant": t.attrs["variant"],
                "d": 100,
                "kappa": t["kappa"].values.tolist(),
                "threshold": t.values.tolist(),
                "derived_bound": b.values.tolist(),
            }
            for t, b in zip(curves["threshold"], curves["bound"])
        ],
    }


def run(out_dir: Path, variants=("v1", "v2"), n_tasks: int = 2, seed: int = 0) -> dict:
    """Compute the curves, write ``theory.json`` and the three figures into ``out_dir``.

    Returns:
        The JSON record.
    """
    from depthscope.figures.theory import plot_gain_vs_lambda_min, plot_gain_vs_rank, plot_threshold_vs_kappa

    curves = figure_5(variants, n_tasks, seed)
    doc = figure_5_document(curves, n_tasks, seed)
    write_json(out_dir / "theory.json", doc)
    save_figures(
        out_dir,
        {
            "gain-vs-rank": plot_gain_vs_rank(curves["gains"]).figure,
            "gain-vs-lambda": plot_gain_vs_lambda_min(curves["lambda"]).figure,
            "threshold-vs-kappa": plot_threshold_vs_kappa(curves["threshold"], curves["bound"]).figure,
        },
    )
    return doc
