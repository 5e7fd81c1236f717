"""Rank with a conclusion: one sentence of what DCA's theory expects of a model, from its r*/d."""

from __future__ import annotations

import pytest

from depthscope.analysis.rank import conclusion, least_kappa
from depthscope.analysis.theory import derived_bound, threshold


@pytest.mark.parametrize("ratio", [0.01, 0.2, 0.5, 0.8])
def test_the_least_kappa_inverts_the_derived_bound(ratio):
    k = least_kappa(ratio)
    assert float(derived_bound(k)) == pytest.approx(ratio, abs=1e-9)
    assert float(derived_bound(k * 0.99)) < ratio < float(derived_bound(min(1.0, k * 1.01)))


def test_no_kappa_where_the_ratio_exceeds_the_bound_at_one():
    assert least_kappa(0.9) is None and least_kappa(float(derived_bound(1.0))) is None
    assert "at no task complexity" in conclusion({"label": "m", "d": 64, "ratio": {"numerical": 0.95}})


def test_the_sentence_follows_the_threshold_at_a_kappa():
    t = threshold(40, 0.5)
    assert 0 < t < 1
    base = {"label": "m", "d": 40, "kappa": 0.5, "variant": "v1", "threshold": t}
    below = conclusion({**base, "ratio": {"numerical": t / 2}})
    above = conclusion({**base, "ratio": {"numerical": min(0.99, t + 0.1)}})
    assert "expects learned depth weights to help m" in below and f"{t:.3f}" in below
    assert "expects no gain" in above and "above the threshold" in above
    none = conclusion({**base, "threshold": 0.0, "ratio": {"numerical": 0.1}})
    assert "GRN wins at no r*/d" in none


def test_without_kappa_the_sentence_names_the_least_kappa():
    text = conclusion({"label": "m", "d": 64, "ratio": {"numerical": 0.3}})
    assert f"above {least_kappa(0.3):.2f}" in text and "r*/d = 0.300" in text
