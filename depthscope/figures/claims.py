"""The claims figure: each variant against the standard residual along training, over seeds.

Data in: ``pipelines.claims.Claims`` (``curves``: per variant the validation steps and, per seed,
the loss minus the standard's of the same seed; ``speed``: per seed, the standard's steps over the
steps the variant needs to reach the standard's final loss); a matplotlib Figure out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from depthscope.figures.style import scheme_color, style_axes, styled, subplots

STYLES = ("-", ":", "-.")  # the first, second, third variant of one scheme
GROWN_STYLES = ("--", "-.", ":")  # the standard residual grown deeper, wider
DCA_CLAIM = 3.0  # DCA (arXiv 2502.06785): the same perplexity up to 3x faster


@styled
def plot_claims(curves: dict[str, dict[str, Any]], speed: dict[str, list[float]], schemes: dict[str, str]):
    """Left: seed-paired validation-loss difference from the standard residual along training
    (mean over seeds, band = min..max); right: steps-to-equal-loss ratio per variant (seeds as
    dots, their mean as a bar), DCA's claimed 3x dashed. ``schemes`` maps a variant to its scheme
    (its colour).

    Returns:
        The Figure.
    """
    fig, (left, right) = subplots(1, 2, figsize=(11.0, 4.2), width_ratios=(1.5, 1.0))
    style_axes(left)
    style_axes(right)
    seen: dict[str, int] = {}  # variants of one scheme share its colour: told apart by line style
    styles = {}
    for name in [*curves, *speed]:
        if name not in styles:
            scheme = schemes.get(name, name)
            k = seen[scheme] = seen.get(scheme, -1) + 1
            styles[name] = (GROWN_STYLES if scheme == "standard" else STYLES)[k % 3]
    for name, c in curves.items():
        diff = np.asarray(c["diff"], dtype=float)
        colour = scheme_color(schemes.get(name, name))
        left.plot(
            c["steps"], diff.mean(0), color=colour, ls=styles[name], lw=1.4, label=f"{name} (n={len(diff)})"
        )
        if len(diff) > 1:
            left.fill_between(c["steps"], diff.min(0), diff.max(0), color=colour, alpha=0.12, lw=0)
    left.axhline(0, color="black", lw=0.8)
    left.set_xlabel("training step")
    left.set_ylabel("validation loss - standard's (nats/byte)")
    left.set_title("against the standard residual, seed-paired (band: min..max)")
    left.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
    names = [n for n in speed if np.isfinite(speed[n]).any()]
    for i, name in enumerate(names):
        x = np.asarray(speed[name], dtype=float)
        x = x[np.isfinite(x)]
        colour = scheme_color(schemes.get(name, name))
        hatch = {"-": None, "--": None}.get(styles[name], "///")  # a scheme's second variant hatched
        right.barh(i, x.mean(), color=colour, alpha=0.35, hatch=hatch)
        right.plot(x, np.full(len(x), i), "o", color=colour, ms=4)
    right.set_yticks(range(len(names)), names)
    right.invert_yaxis()
    right.axvline(1, color="black", lw=0.8)
    right.axvline(DCA_CLAIM, color="black", ls="--", lw=0.8, label="DCA's claim (3x)")
    right.legend(loc="lower right", fontsize=7, frameon=False)
    right.set_xlabel("standard's steps / steps to its final loss")
    right.set_title("steps to equal loss (dots: seeds)")
    return fig
