"""DCA theory (arXiv 2502.06785 Sec. 4): exact risks, equal budgets, closed forms, sweeps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from depthscope.analysis import theory as th


def _tasks(n, d, lo, hi, seed=0, **kw):
    rng = np.random.default_rng(seed)
    return [th.random_task(d, lo, hi, rng, **kw) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# Tasks


def test_random_task_is_symmetric_with_the_requested_spectrum():
    s = th.random_task(40, 2.0, 10.0, np.random.default_rng(3))
    np.testing.assert_array_equal(s, s.T)
    mu = np.linalg.eigvalsh(s)
    assert mu[0] == pytest.approx(2.0, abs=1e-12)
    assert mu[-1] == pytest.approx(10.0, abs=1e-12)
    two = th.random_task(40, 2.0, 10.0, np.random.default_rng(3), spectrum="two_level", n_high=7)
    np.testing.assert_allclose(np.linalg.eigvalsh(two), [2.0] * 33 + [10.0] * 7, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Exact risks


@pytest.mark.parametrize("r", [0, 1, 4, 11, 19])
def test_resnet_risk_is_the_eckart_young_tail(r):
    """Independent path: ||M - best rank-r approximation||_F^2 built from numpy's SVD."""
    rng = np.random.default_rng(r)
    mats = [rng.standard_normal((20, 20)), th.random_task(20, 1.0, 4.0, rng)]
    for m in mats:
        u, s, vt = np.linalg.svd(m)
        approx = (u[:, :r] * s[:r]) @ vt[:r]
        assert th.resnet_risk(m, r) == pytest.approx(np.linalg.norm(m - approx) ** 2, rel=1e-10, abs=1e-10)
    # For a PSD task the tail is the sum of the d - r smallest squared eigenvalues.
    mu = np.sort(np.linalg.eigvalsh(mats[1]))
    assert th.resnet_risk(mats[1], r) == pytest.approx(np.sum(mu[: 20 - r] ** 2), rel=1e-10)


def test_grn_v1_never_above_resnet_and_below_the_theorem_4_2_bound():
    for s in _tasks(12, 25, 0.5, 6.0, seed=1):
        for r in (0, 3, 8, 15, 24):
            v1 = th.grn_v1_risk(s, r)
            assert 0.0 <= v1 <= th.resnet_risk(s, r) + 1e-9
            assert v1 <= th.theorem_4_2_v1_bound(s, r) + 1e-9


def test_grn_v1_exact_minimum_matches_a_fine_scan_over_alpha():
    s = _tasks(1, 12, 1.0, 5.0, seed=2)[0]
    alphas = np.linspace(-6.0, 8.0, 14001)  # step 1e-3, spans the spectrum shifted by 1
    shifted = s[None] + (1 - alphas)[:, None, None] * np.eye(12)[None]
    sv = np.linalg.svd(shifted, compute_uv=False)  # independent path: SVD at every alpha
    for r in (0, 2, 5, 9):
        scan = np.sum(sv[:, r:] ** 2, axis=1).min()
        exact = th.grn_v1_risk(s, r)
        assert exact <= scan + 1e-12
        assert scan - exact < 1e-3 * max(scan, 1.0)  # the scan is within its resolution


def test_grn_v1_general_matrix_never_above_resnet():
    rng = np.random.default_rng(4)
    for _ in range(4):
        m = rng.standard_normal((15, 15))
        for r in (2, 7):
            assert th.grn_v1_risk(m, r) <= th.resnet_risk(m, r) + 1e-9


def test_grn_v1_absorbs_a_level_that_fills_the_tail():
    # Two levels, 12 at lambda_max: for r = 20 the 10-wide tail window fits inside one level.
    s = th.random_task(30, 3.0, 9.0, np.random.default_rng(5), spectrum="two_level", n_high=12)
    assert th.grn_v1_risk(s, 20) == pytest.approx(0.0, abs=1e-20)
    assert th.resnet_risk(s, 20) == pytest.approx(10 * 3.0**2, rel=1e-12)


def test_grn_v2_between_zero_and_v1():
    for s in _tasks(4, 20, 1.0, 5.0, seed=6):
        for r in (1, 4, 10):
            v2 = th.grn_v2_risk(s, r)
            assert 0.0 <= v2 <= th.grn_v1_risk(s, r) + 1e-12
    # On a random rotation a diagonal beats a scaled identity by a little, not by nothing.
    s = _tasks(1, 20, 1.0, 5.0, seed=7)[0]
    assert th.grn_v2_risk(s, 4) < 0.999 * th.grn_v1_risk(s, 4)


def test_grn_v2_recovers_diagonal_plus_low_rank():
    rng = np.random.default_rng(8)
    g = rng.standard_normal((30, 2))
    s = np.diag(rng.uniform(0.0, 3.0, 30)) + g @ g.T
    assert th.grn_v1_risk(s, 2) > 1.0
    assert th.grn_v2_risk(s, 2) < 1e-6 * np.sum(s**2)


# ---------------------------------------------------------------------------------------------
# Equal parameter budget


@pytest.mark.parametrize("d", [20, 100, 300])
def test_equal_budget_rank_is_the_largest_that_fits(d):
    for r_star in range(1, d):
        for variant in ("v1", "v2"):
            r = th.equal_budget_rank(d, r_star, variant)
            assert th.grn_params(d, r, variant) <= 2 * d * r_star < th.grn_params(d, r + 1, variant)
            assert r <= r_star


def test_equal_budget_rank_respects_lemma_c1():
    for d in (50, 100, 200):
        for r_star in range(1, d):
            # Lemma C.1 bounds the continuous ranks; the integer ones lose less than one more.
            r2 = th.equal_budget_rank(d, r_star, "v2")
            assert r_star - r2 < (math.sqrt(1 + r_star) - 1) ** 2 + 1
            r1 = th.equal_budget_rank(d, r_star, "v1")
            assert r_star - r1 < (math.sqrt(d * d + d * r_star) - d) ** 2 / d + 1
    assert th.grn_params(100, 5, "v1") == 2 * 100 * 5 + 10
    assert th.grn_params(100, 5, "v2") == 2 * 100 * 5 + 100 * 10


# ---------------------------------------------------------------------------------------------
# Closed forms


def test_sources_table():
    assert th.SOURCES == {
        "proposition_4_4_rank": "paper",
        "theorem_4_2_v1_bound": "derived here",
        "derived_sufficient_condition": "derived here",
        "derived_bound": "derived here",
    }


def test_proposition_4_4_rank_values():
    assert th.proposition_4_4_rank(100, 50, 0.5) == pytest.approx((50 - 25) / 0.75)
    assert th.proposition_4_4_rank(100, 50, 1.0) == -np.inf
    np.testing.assert_allclose(th.proposition_4_4_rank(100, 50, np.array([0.0, 0.5])), [50.0, 100 / 3])


@pytest.mark.parametrize("spectrum", ["uniform", "two_level"])
def test_proposition_4_4_any_rank_above_it_beats_the_resnet(spectrum):
    """Every integer r' in (r'_4.4, r*] gives a GRN-v1 risk below the ResNet's at r*."""
    d, lam_max = 40, 10.0
    for kappa in (0.3, 0.6, 0.9):
        for r_star in (5, 15, 30):
            tasks = _tasks(3, d, kappa * lam_max, lam_max, seed=r_star, spectrum=spectrum, n_high=r_star)
            bound = th.proposition_4_4_rank(d, r_star, kappa)
            for r in range(max(0, math.floor(bound) + 1), r_star + 1):
                for s in tasks:
                    assert th.grn_v1_risk(s, r) < th.resnet_risk(s, r_star)


def test_derived_bound_closed_form_values():
    assert th.derived_bound(1.0) == pytest.approx(math.sqrt(3) / 2)
    assert th.derived_bound(0.0) == pytest.approx(0.0)
    # schemes.md: at x = 0.3 the condition needs kappa > ~0.17.
    assert th.derived_bound(0.17) > 0.3 > th.derived_bound(0.16)
    assert th.derived_bound(0.5, "v2") is None
    ks = np.linspace(0.05, 1.0, 20)
    assert np.all(np.diff(th.derived_bound(ks)) > 0)


@pytest.mark.parametrize("kappa", [0.05, 0.2, 0.4, 0.6, 0.8, 1.0])
def test_derived_bound_is_the_edge_of_the_derived_condition(kappa):
    x = th.derived_bound(kappa)
    assert th.derived_sufficient_condition(x - 1e-6, kappa)
    assert not th.derived_sufficient_condition(x + 1e-6, kappa)
    d = 100
    x2 = th.derived_bound(kappa, "v2", d=d)
    assert th.derived_sufficient_condition(x2 - 1e-6, kappa, "v2", d=d)
    assert not th.derived_sufficient_condition(x2 + 1e-6, kappa, "v2", d=d)


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_gain_is_positive_wherever_the_derived_condition_holds(variant):
    d, lam_max = 40, 10.0
    checked = 0
    for kappa in (0.2, 0.4, 0.7, 1.0):
        for spectrum in ("uniform", "two_level"):
            for r_star in range(2, d, 3):
                if not th.derived_sufficient_condition(r_star / d, kappa, variant, d=d):
                    continue
                rank = th.equal_budget_rank(d, r_star, variant)
                grn = th.grn_v1_risk if variant == "v1" else th.grn_v2_risk
                s = _tasks(1, d, kappa * lam_max, lam_max, seed=r_star, spectrum=spectrum, n_high=r_star)[0]
                assert grn(s, rank) < th.resnet_risk(s, r_star)
                checked += 1
    assert checked > 10  # the grid really exercises the condition


# ---------------------------------------------------------------------------------------------
# Sweeps: the paper's qualitative claims (Sec. 4.3)


def test_threshold_grows_with_kappa():
    v1 = [th.threshold(100, k, "v1") for k in (0.01, 0.03, 0.1, 0.3)]
    assert np.all(np.diff(v1) >= 0) and v1[-1] > v1[0]
    v2 = [th.threshold(40, k, "v2", n_tasks=3) for k in (0.1, 0.25, 0.5)]
    assert np.all(np.diff(v2) >= 0) and v2[-1] > v2[0]
    # With a single eigenvalue GRN wins at every r* < d.
    assert th.threshold(30, 1.0, "v1", n_tasks=2) == pytest.approx(29 / 30)


def test_numerical_threshold_is_at_least_the_derived_one():
    for kappa in (0.1, 0.3, 0.6):
        assert th.threshold(100, kappa, "v1") >= th.derived_bound(kappa) - 0.01


def test_gain_shrinks_as_r_star_grows_and_grows_with_d():
    g = th.gain_curve(100, range(10, 100, 10), 5.0, 10.0, "v1", n_tasks=4)
    assert np.all(np.diff(g.values) < 0) and np.all(g.values > 0)
    g2 = th.gain_curve(40, range(4, 40, 4), 5.0, 10.0, "v2", n_tasks=2)
    assert np.all(np.diff(g2.values) < 0)
    gains_by_d = [th.excess_risks(d, 30, 5.0, 10.0, "v1", n_tasks=2).gain for d in (60, 100, 200)]
    assert np.all(np.diff(gains_by_d) > 0)


def test_gain_grows_with_lambda_min():
    g = th.gain_lambda_curve(60, 30, [2.0, 4.0, 6.0, 8.0, 10.0], 10.0, "v1", n_tasks=3)
    assert np.all(np.diff(g.values) > 0)
    # kappa = 1: A - I = 10 I, GRN is exact, so the gain is the ResNet's whole tail 30 * 10^2.
    assert g.sel(lambda_min=10.0).item() == pytest.approx(30 * 100.0, rel=1e-10)


def test_sweeps_are_labelled_and_consistent():
    g = th.gain_curve(50, [5, 20, 45], 2.0, 8.0, "v1", n_tasks=3, seed=1)
    assert g.dims == ("r_star",) and g.name == "excess_risk_gain"
    assert g.attrs["long_name"] and g.attrs["kappa"] == pytest.approx(0.25)
    ranks = [th.equal_budget_rank(50, r, "v1") for r in (5, 20, 45)]
    np.testing.assert_array_equal(g["grn_rank"].values, ranks)
    np.testing.assert_allclose(g.values, g["resnet_risk"].values - g["grn_risk"].values)
    one = th.excess_risks(50, 20, 2.0, 8.0, "v1", n_tasks=3, seed=1)
    assert g.sel(r_star=20).item() == pytest.approx(one.resnet - one.grn)
    assert one.gain == one.resnet - one.grn
    t = th.threshold_curve([0.1, 0.5], d=30, n_tasks=2)
    assert t.dims == ("kappa",) and t.name == "threshold" and t.attrs["long_name"]
    b = th.derived_bound_curve([0.1, 0.5])
    assert b.attrs["source"] == "derived here"
    np.testing.assert_allclose(b.values, th.derived_bound(np.array([0.1, 0.5])))
    with pytest.raises(ValueError):
        th.excess_risks(50, 50, 2.0, 8.0)
