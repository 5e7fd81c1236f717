"""The claims figure draws what the claims hold: one curve and band per variant, one bar per ratio."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from depthscope.figures.claims import plot_claims


def test_the_claims_figure_draws_each_variant_from_its_numbers():
    curves = {
        "dca": {"steps": [100, 200, 300], "diff": [[-0.01, -0.02, -0.03], [-0.03, -0.04, -0.05]]},
        "standard-9blocks": {"steps": [100, 200, 300], "diff": [[0.01, 0.0, -0.01]]},
    }
    speed = {"dca": [1.5, 1.7], "standard-9blocks": [float("nan")], "hc": [1.2, 1.4, 1.3]}
    fig = plot_claims(curves, speed, {"dca": "dca", "standard-9blocks": "standard", "hc": "hc"})
    left, right = fig.axes[:2]
    lines = {ln.get_label(): ln for ln in left.get_lines() if not ln.get_label().startswith("_")}
    assert set(lines) == {"dca (n=2)", "standard-9blocks (n=1)"}
    np.testing.assert_allclose(lines["dca (n=2)"].get_ydata(), [-0.02, -0.03, -0.04])
    assert lines["standard-9blocks (n=1)"].get_linestyle() == "--"  # a grown baseline, dashed
    assert len(left.collections) == 1  # a band only where there are several seeds
    bars = [p.get_width() for p in right.patches]
    assert bars == pytest.approx([1.6, 1.3])  # a variant that never reached the loss has no bar
    assert [t.get_text() for t in right.get_yticklabels()] == ["dca", "hc"]
    for text in [*left.get_yticklabels(), *right.get_xticklabels(), left.yaxis.label, right.xaxis.label]:
        assert "$" not in text.get_text() and "mathdefault" not in text.get_text()
    plt.close(fig)
