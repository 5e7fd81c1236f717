"""Rank with a conclusion: one sentence of what DCA's theory expects of a model, from its r*/d, by
one function (``verdict``) wherever it is printed: the command line, the report, the notebooks."""

from __future__ import annotations

import pytest

from depthscope.analysis.rank import KAPPAS, conclusion, least_kappa, verdict
from depthscope.analysis.theory import derived_bound, threshold


@pytest.mark.parametrize("ratio", [0.01, 0.2, 0.5, 0.8])
def test_the_least_kappa_inverts_the_derived_bound(ratio):
    k = least_kappa(ratio)
    assert float(derived_bound(k)) == pytest.approx(ratio, abs=1e-9)
    assert float(derived_bound(k * 0.99)) < ratio < float(derived_bound(min(1.0, k * 1.01)))
    assert least_kappa(0.9) is None and least_kappa(float(derived_bound(1.0))) is None


def conclusion_of(ratio: float, d: int = 64, kappa: float | None = None) -> str:
    return conclusion({"label": "m", "d": d, "ratio": {"numerical": ratio}, **verdict(ratio, d, kappa)})


def test_without_kappa_the_sentence_names_the_kappas_scanned_where_grn_wins():
    """No kappa given: the exact-risk threshold at every kappa scanned decides, the same function
    the command line uses with a kappa."""
    d = 64
    wins = [k for k in KAPPAS if 0.95 < threshold(d, k)]
    assert 0 < len(wins) < len(KAPPAS)  # the case this test is about: some kappas, not all
    assert f"at kappa {', '.join(f'{k:g}' for k in wins)} of those scanned" in conclusion_of(0.95, d)
    assert "every task complexity scanned" in conclusion_of(0.5, d)
    assert "any task complexity scanned" in conclusion_of(1.2, d) and "no gain" in conclusion_of(1.2, d)


def test_the_sentence_follows_the_threshold_at_a_kappa():
    d, kappa = 64, 0.05
    t = threshold(d, kappa)
    assert 0 < t < (d - 1) / d  # a threshold inside the scan
    below = conclusion_of(t - 0.01, d, kappa)
    assert "to help m" in below and f"below {t:.3f}" in below and "kappa = 0.05" in below
    assert "no gain" in conclusion_of(t + 0.005, d, kappa)


def test_the_end_of_the_scan_is_never_printed_as_a_threshold():
    """At kappa 0.5 GRN wins at every r*/d the scan has (its largest r*/d is (d-1)/d): the sentence
    says so instead of calling (d-1)/d a threshold; a ratio past it (r* >= d) gains nothing."""
    d, kappa = 64, 0.5
    assert threshold(d, kappa) == (d - 1) / d
    text = conclusion_of(0.8, d, kappa)
    assert "GRN wins at every r*/d scanned (1/64 to 63/64)" in text and f"{(d - 1) / d:.3f}" not in text
    past = conclusion_of(1.5, d, kappa)
    assert "no gain" in past and "beyond them" in past


def test_an_unconverged_rank_is_said_to_be():
    res = {"label": "m", "d": 64, "ratio": {"numerical": 0.83}, "ratio_half": 0.86, "tokens": 16384}
    assert "Not converged: r*/d is 0.860 from half of the 16384 tokens" in conclusion(
        {**res, **verdict(0.83, 64)}
    )
    assert "Not converged" not in conclusion({**res, "ratio_half": 0.835, **verdict(0.83, 64)})
