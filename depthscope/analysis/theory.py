"""DeepCrossAttention theory: exact excess risks of ResNet and GRN models of a linear task.

DeepCrossAttention (Heddes et al., arXiv 2502.06785, Sec. 4 and App. C) studies the linear task
y = A x with E[x x^T] = I, so the excess risk of a linear predictor B is E|(A - B) x|^2 =
||A - B||_F^2. A stack of linear layers of collective rank r* (the sum of the layer ranks) can
express, by Theorem 4.1:

- ResNet:  I + M             with rank M <= r*
- GRN-v1:  alpha I + M       (one learnable scalar scale of the identity path)
- GRN-v2:  D + M             (a learnable diagonal)

Here every risk is computed exactly (or, for GRN-v2, by a monotone numerical optimisation) from
the task matrix S = A - I, and the closed forms are kept apart and labelled by where they come
from. Theorem 4.3 assumes S symmetric positive semi-definite with eigenvalues in
[lambda_min, lambda_max] and calls kappa = lambda_min / lambda_max the task complexity.

Closed forms (``SOURCES`` holds the same table):

========================================  ============  =======================================
function                                  source        formula
========================================  ============  =======================================
``proposition_4_4_rank``                  paper         r' = (r* - d kappa^2) / (1 - kappa^2)
                                                        (Prop. 4.4; decoded from garbled text)
``theorem_4_2_v1_bound``                  derived here  ||Delta||^2 - (tr Delta)^2 / (d - r)
                                                        (from the proof of Thm. 4.2; the
                                                        printed form was an image)
``derived_sufficient_condition`` (v1)     derived here  (sqrt(1 + x) - 1)^2 < kappa^2 (1 - x)
``derived_sufficient_condition`` (v2)     derived here  (sqrt(1 + r*) - 1)^2 < kappa^2 (d - r*)
``derived_bound`` (v1)                    derived here  x < ((1 + k sqrt(1 + 2 k^2)) / (1 + k^2))^2 - 1
``derived_bound`` (v2, given d)           derived here  root of the v2 condition, divided by d
========================================  ============  =======================================

"derived here" means our own algebra from the paper's Lemma C.1 and Prop. 4.4 (see
research/schemes.md, Sec. 2.4); it is not the paper's printed threshold (4.1)-(4.3), which we
could not read.

Legend: d (width), r / r_star (collective rank), kappa, lambda_min, lambda_max.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import numpy as np
import xarray as xr
from numpy.lib.stride_tricks import sliding_window_view
from scipy.optimize import minimize_scalar

Variant = Literal["v1", "v2"]

SOURCES: dict[str, str] = {
    "proposition_4_4_rank": "paper",
    "theorem_4_2_v1_bound": "derived here",
    "derived_sufficient_condition": "derived here",
    "derived_bound": "derived here",
}

# Alternating minimisation for GRN-v2: stop when an iteration gains less than this fraction of
# the starting risk, or after this many iterations (each iteration never increases the risk).
V2_TOL = 1e-9
V2_MAX_ITER = 100


# --------------------------------------------------------------------------------------------
# Tasks


Spectrum = Literal["uniform", "two_level"]


def random_task(
    d: int,
    lambda_min: float,
    lambda_max: float,
    rng: np.random.Generator,
    spectrum: Spectrum = "uniform",
    n_high: int | None = None,
) -> np.ndarray:
    """A random task S = A - I = U diag(lam) U^T, symmetric PSD, spectrum in [lambda_min, lambda_max].

    U is Haar-random orthogonal (QR of a Gaussian matrix with the sign fix). Theorem 4.3 only
    bounds the spectrum, so its shape is our choice:

    - ``"uniform"`` (default): eigenvalues i.i.d. uniform on [lambda_min, lambda_max], except
      that the smallest and the largest are set to lambda_min and lambda_max exactly, so every
      task has exactly kappa = lambda_min / lambda_max.
    - ``"two_level"``: ``n_high`` eigenvalues (default d // 2) equal lambda_max, the rest
      lambda_min (an extreme member of the class, used by the tests). It is not a hard case
      for GRN-v1: the scale alpha absorbs whichever level fills the tail.

    The sweeps below (gains, thresholds) all use the uniform spectrum.
    """
    if not 0 <= lambda_min <= lambda_max:
        raise ValueError(f"need 0 <= lambda_min <= lambda_max, got {lambda_min}, {lambda_max}")
    if spectrum == "uniform":
        lam = rng.uniform(lambda_min, lambda_max, size=d)
        lam[np.argmin(lam)] = lambda_min
        if d > 1:
            lam[np.argmax(lam)] = lambda_max
    elif spectrum == "two_level":
        n_high = d // 2 if n_high is None else n_high
        if not 0 <= n_high <= d:
            raise ValueError(f"n_high must lie in [0, d], got {n_high}")
        lam = np.where(np.arange(d) < n_high, lambda_max, lambda_min).astype(float)
    else:
        raise ValueError(f"unknown spectrum {spectrum!r}; expected 'uniform' or 'two_level'")
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    u = q * np.sign(np.diag(r))  # sign fix makes Q Haar-distributed
    s = (u * lam) @ u.T
    return (s + s.T) / 2  # exactly symmetric, so eigh and the symmetric paths apply


def _tasks(d: int, lambda_min: float, lambda_max: float, n_tasks: int, seed: int) -> list[np.ndarray]:
    """``n_tasks`` seeded uniform-spectrum tasks; task i depends only on (seed, i), not n_tasks."""
    return [random_task(d, lambda_min, lambda_max, np.random.default_rng([seed, i])) for i in range(n_tasks)]


def _is_symmetric(m: np.ndarray) -> bool:
    if m.shape[0] != m.shape[1]:
        return False
    return np.allclose(m, m.T, rtol=1e-12, atol=1e-12 * np.abs(m).max(initial=1.0))


# --------------------------------------------------------------------------------------------
# Exact excess risks


def _truncate(m: np.ndarray, r: int, symmetric: bool | None = None) -> tuple[np.ndarray, float]:
    """Best rank-r approximation of m and its squared Frobenius error (Eckart-Young)."""
    r = max(0, min(r, min(m.shape)))
    if _is_symmetric(m) if symmetric is None else symmetric:
        # For a symmetric matrix the singular values are |eigenvalues|: keep the r largest |w|.
        w, v = np.linalg.eigh((m + m.T) / 2)
        order = np.argsort(np.abs(w))[::-1]
        keep, drop = order[:r], order[r:]
        approx = (v[:, keep] * w[keep]) @ v[:, keep].T
        return approx, float(np.sum(w[drop] ** 2))
    u, s, vt = np.linalg.svd(m)
    approx = (u[:, :r] * s[:r]) @ vt[:r]
    return approx, float(np.sum(s[r:] ** 2))


def resnet_risk(delta: np.ndarray, r: int) -> float:
    """ResNet excess risk at collective rank r: the Eckart-Young tail sum_{i > r} sigma_i(A - I)^2.

    ``delta`` is the task matrix A - I. The result is ||Delta||_F^2 in the paper's notation
    (Theorem 4.2, Delta = A - I minus its best rank-r approximation).
    """
    s = np.linalg.svd(np.asarray(delta, dtype=float), compute_uv=False)
    return float(np.sum(s[r:] ** 2))


def _v1_window(mu_sorted: np.ndarray, r: int) -> tuple[float, float]:
    """Exact GRN-v1 optimum from the ascending eigenvalues of a symmetric A - I: (risk, shift c).

    With c = 1 - alpha the eigenvalues of A - alpha I are mu_i + c, and the best rank-r error is
    the sum of the m = d - r smallest (mu_i + c)^2. So min over c is min over size-m subsets of
    sum (mu_i + c)^2, whose inner minimum is the subset's sum of squared deviations at
    c = -mean. The best subset is always a contiguous window of the sorted eigenvalues (the m
    points nearest any centre are contiguous), so scanning the d - r + 1 windows is exact.
    """
    m = mu_sorted.size - r
    if m <= 0:
        return 0.0, 0.0
    windows = sliding_window_view(mu_sorted, m)
    means = windows.mean(axis=1)
    # Centre each window before squaring: prefix-sum formulas lose all digits when kappa ~ 1.
    ss = ((windows - means[:, None]) ** 2).sum(axis=1)
    best = int(np.argmin(ss))
    return float(ss[best]), float(-means[best])


def grn_v1_risk(delta: np.ndarray, r: int) -> float:
    """GRN-v1 excess risk at rank r: min over alpha of sum_{i > r} sigma_i(A - alpha I)^2.

    ``delta`` is A - I. For symmetric A - I the minimum is exact (a scan over windows of the
    sorted eigenvalues, see ``_v1_window``). For a general matrix it is a bounded numerical
    minimisation over the shift c = 1 - alpha, started from the best point of a grid over
    [-2 sigma_max, 2 sigma_max], so it is a local optimum (an upper bound on the exact value).
    """
    delta = np.asarray(delta, dtype=float)
    if _is_symmetric(delta):
        return _v1_window(np.linalg.eigvalsh((delta + delta.T) / 2), r)[0]
    eye = np.eye(delta.shape[0])

    def tail(c: float) -> float:
        s = np.linalg.svd(delta + c * eye, compute_uv=False)
        return float(np.sum(s[r:] ** 2))

    smax = max(np.linalg.norm(delta, 2), 1e-12)
    grid = np.linspace(-2 * smax, 2 * smax, 81)
    i = int(np.argmin([tail(c) for c in grid]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = minimize_scalar(tail, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12 * smax})
    return min(float(res.fun), tail(grid[i]), tail(0.0))


def grn_v2_risk(delta: np.ndarray, r: int, max_iter: int = V2_MAX_ITER, tol: float = V2_TOL) -> float:
    """GRN-v2 excess risk at rank r: min over diagonal D' of sum_{i > r} sigma_i(A - I - D')^2.

    Computed by alternating minimisation (fix D' -> truncated SVD M; fix M -> D' = diag of
    A - I - M), started from the GRN-v1 optimum D' = (alpha - 1) I. Every step is an exact
    minimisation over one block, so the risk never increases and the result is never above
    ``grn_v1_risk(delta, r)``. The joint problem is non-convex, so this is an upper bound on the
    exact optimum (a local optimum of the alternating scheme). It stops when an iteration gains
    less than ``tol`` times the starting risk, or after ``max_iter`` iterations (in our tests
    the risk has then settled to about 6 digits; the gain over v1 is a few per cent).
    """
    delta = np.asarray(delta, dtype=float)
    d = delta.shape[0]
    if _is_symmetric(delta):
        delta = (delta + delta.T) / 2
        v1, c = _v1_window(np.linalg.eigvalsh(delta), r)
        return min(v1, _alternate(delta, r, np.full(d, -c), max_iter, tol))
    # Without the symmetric window formula start from alpha fitted to the trace.
    return _alternate(delta, r, np.full(d, np.trace(delta) / d), max_iter, tol)


def _alternate(delta: np.ndarray, r: int, diag: np.ndarray, max_iter: int, tol: float) -> float:
    """Alternating minimisation of ||delta - diag(D') - M||_F^2 over D' and rank-r M."""
    symmetric = _is_symmetric(delta)  # then every iterate is symmetric too
    risk0 = risk = None
    for _ in range(max_iter):
        approx, new_risk = _truncate(delta - np.diag(diag), r, symmetric)
        if risk0 is None:
            risk0 = new_risk
        elif risk - new_risk <= tol * risk0:
            return min(risk, new_risk)
        risk = new_risk
        diag = np.diag(delta - approx).copy()  # the best diagonal for a fixed low-rank part
    return risk


def theorem_4_2_v1_bound(delta: np.ndarray, r: int) -> float:
    """Upper bound ER(GRN-v1) <= ||Delta||_F^2 - (tr Delta)^2 / (d - r)  [derived here].

    Delta is A - I minus its best rank-r approximation (Theorem 4.2 of arXiv 2502.06785; the
    printed form was an image, this is our reading of the proof: fit alpha on the residual).
    """
    delta = np.asarray(delta, dtype=float)
    d = delta.shape[0]
    if r >= d:
        return 0.0
    approx, tail = _truncate(delta, r)
    resid = delta - approx
    return float(tail - np.trace(resid) ** 2 / (d - r))


# --------------------------------------------------------------------------------------------
# Equal parameter budget


def grn_params(d: int, r: int, variant: Variant) -> int:
    """Parameter count of a GRN model with T = r rank-one layers (schemes.md Sec. 2.4, App. C.1).

    v1: 2 d r + T (T - 1) / 2;  v2: 2 d r + d T (T - 1) / 2.
    """
    extra = r * (r - 1) // 2
    if variant == "v1":
        return 2 * d * r + extra
    if variant == "v2":
        return 2 * d * r + d * extra
    raise ValueError(f"unknown GRN variant {variant!r}; expected 'v1' or 'v2'")


def equal_budget_rank(d: int, r_star: int, variant: Variant) -> int:
    """Largest GRN rank whose parameter count fits the ResNet budget 2 d r* (T' = r', Lemma C.1)."""
    budget = 2 * d * r_star
    # Continuous root of the quadratic as a start, then fix the integer rounding exactly.
    if variant == "v1":  # r^2 + (4d - 1) r - 4 d r* = 0
        b = 4 * d - 1
        guess = (-b + math.sqrt(b * b + 16 * d * r_star)) / 2
    else:  # r^2 + 3 r - 4 r* = 0
        grn_params(d, 0, variant)  # validates the variant name
        guess = (-3 + math.sqrt(9 + 16 * r_star)) / 2
    r = max(0, int(guess))
    while grn_params(d, r + 1, variant) <= budget:
        r += 1
    while r > 0 and grn_params(d, r, variant) > budget:
        r -= 1
    return r


# --------------------------------------------------------------------------------------------
# Averages over random tasks


class Risks(NamedTuple):
    """Mean excess risks over random tasks at equal parameter budget."""

    resnet: float
    grn: float
    grn_rank: int

    @property
    def gain(self) -> float:
        """ResNet risk at r* minus GRN risk at equal parameters (> 0: GRN wins)."""
        return self.resnet - self.grn


class _TaskRisks:
    """One task's risks, computed lazily and cached per rank (sweeps reuse ranks heavily)."""

    def __init__(self, s: np.ndarray):
        self.s = s
        self.mu = np.linalg.eigvalsh(s)  # ascending; s is exactly symmetric
        self.sq = np.sort(self.mu**2)  # singular values squared, ascending
        self._v2: dict[int, float] = {}

    def resnet(self, r: int) -> float:
        return float(self.sq[: max(self.sq.size - r, 0)].sum())

    def grn(self, r: int, variant: Variant) -> float:
        if variant == "v1":
            return _v1_window(self.mu, r)[0]
        if r not in self._v2:
            self._v2[r] = grn_v2_risk(self.s, r)
        return self._v2[r]


class _TaskSet:
    """The seeded tasks of one sweep, shared by every r* (common random numbers)."""

    def __init__(self, d: int, lambda_min: float, lambda_max: float, n_tasks: int, seed: int):
        self.d = d
        self.tasks = [_TaskRisks(s) for s in _tasks(d, lambda_min, lambda_max, n_tasks, seed)]

    def risks(self, r_star: int, variant: Variant) -> Risks:
        """Mean ResNet risk at r* and mean GRN risk at the equal-budget rank."""
        if not 0 < r_star < self.d:
            raise ValueError(f"need 0 < r* < d, got r* = {r_star}, d = {self.d}")
        rank = equal_budget_rank(self.d, r_star, variant)
        resnet = float(np.mean([t.resnet(r_star) for t in self.tasks]))
        grn = float(np.mean([t.grn(rank, variant) for t in self.tasks]))
        return Risks(resnet, grn, rank)


def excess_risks(
    d: int,
    r_star: int,
    lambda_min: float,
    lambda_max: float,
    variant: Variant = "v1",
    n_tasks: int = 8,
    seed: int = 0,
) -> Risks:
    """Mean ResNet risk at r* and mean GRN risk at the equal-budget rank, over seeded random tasks.

    Tasks come from ``random_task`` with the uniform spectrum, seeded by (seed, i).
    """
    tasks = _TaskSet(d, lambda_min, lambda_max, n_tasks, seed)
    return tasks.risks(r_star, variant)


def gain_curve(
    d: int,
    r_star_values,
    lambda_min: float = 5.0,
    lambda_max: float = 10.0,
    variant: Variant = "v1",
    n_tasks: int = 8,
    seed: int = 0,
) -> xr.DataArray:
    """Excess-risk gain versus r* at fixed d (paper Fig. 5 left, exact risks instead of bounds).

    The same tasks serve every r*, so the curve has no task-to-task noise between its points.
    """
    r_values = np.asarray(r_star_values, dtype=int)
    tasks = _TaskSet(d, lambda_min, lambda_max, n_tasks, seed)
    risks = [tasks.risks(int(r), variant) for r in r_values]
    return xr.DataArray(
        [x.resnet - x.grn for x in risks],
        dims=("r_star",),
        coords={
            "r_star": r_values,
            "grn_rank": ("r_star", [x.grn_rank for x in risks]),
            "resnet_risk": ("r_star", [x.resnet for x in risks]),
            "grn_risk": ("r_star", [x.grn for x in risks]),
        },
        name="excess_risk_gain",
        attrs=_attrs(d, lambda_min, lambda_max, variant, n_tasks, seed),
    )


def gain_lambda_curve(
    d: int,
    r_star: int,
    lambda_mins,
    lambda_max: float = 10.0,
    variant: Variant = "v1",
    n_tasks: int = 8,
    seed: int = 0,
) -> xr.DataArray:
    """Excess-risk gain versus lambda_min at fixed r* and lambda_max (paper Fig. 5 right)."""
    lams = np.asarray(lambda_mins, dtype=float)
    risks = [_TaskSet(d, float(lam), lambda_max, n_tasks, seed).risks(r_star, variant) for lam in lams]
    attrs = _attrs(d, None, lambda_max, variant, n_tasks, seed)
    attrs["r_star"] = r_star
    return xr.DataArray(
        [x.resnet - x.grn for x in risks],
        dims=("lambda_min",),
        coords={
            "lambda_min": lams,
            "kappa": ("lambda_min", lams / lambda_max),
            "resnet_risk": ("lambda_min", [x.resnet for x in risks]),
            "grn_risk": ("lambda_min", [x.grn for x in risks]),
        },
        name="excess_risk_gain",
        attrs=attrs,
    )


def _attrs(d, lambda_min, lambda_max, variant, n_tasks, seed) -> dict:
    attrs = {
        "long_name": f"excess-risk gain of GRN-{variant} over ResNet at equal parameters",
        "units": "||A - B||_F^2",
        "d": d,
        "lambda_max": lambda_max,
        "variant": variant,
        "n_tasks": n_tasks,
        "seed": seed,
        "spectrum": "uniform",
        "source": "numerical (exact risks, arXiv 2502.06785 Sec. 4 setting)",
    }
    if lambda_min is not None:
        attrs["lambda_min"] = lambda_min
        attrs["kappa"] = lambda_min / lambda_max
    return attrs


# --------------------------------------------------------------------------------------------
# Numerical threshold


def threshold(
    d: int,
    kappa: float,
    variant: Variant = "v1",
    lambda_max: float = 10.0,
    n_tasks: int = 8,
    seed: int = 0,
) -> float:
    """Largest r*/d at which GRN beats ResNet at equal parameters (mean exact risks; 0 if none).

    A full scan over r* = 1 .. d - 1 (the gain need not be monotone because the equal-budget
    rank is an integer), returning the largest r* with a strictly positive mean gain, over d.
    The tasks have lambda_min = kappa lambda_max and the uniform spectrum.
    """
    tasks = _TaskSet(d, kappa * lambda_max, lambda_max, n_tasks, seed)
    best = 0
    for r_star in range(1, d):
        risks = tasks.risks(r_star, variant)
        if risks.resnet - risks.grn > 0:
            best = r_star
    return best / d


def threshold_curve(
    kappas,
    d: int = 100,
    variant: Variant = "v1",
    lambda_max: float = 10.0,
    n_tasks: int = 8,
    seed: int = 0,
) -> xr.DataArray:
    """Numerical threshold r*/d versus kappa (see ``threshold``)."""
    ks = np.asarray(kappas, dtype=float)
    return xr.DataArray(
        [threshold(d, float(k), variant, lambda_max, n_tasks, seed) for k in ks],
        dims=("kappa",),
        coords={"kappa": ks},
        name="threshold",
        attrs={
            "long_name": f"largest r*/d where GRN-{variant} beats ResNet (numerical)",
            "units": "r*/d",
            "d": d,
            "variant": variant,
            "lambda_max": lambda_max,
            "n_tasks": n_tasks,
            "seed": seed,
            "spectrum": "uniform",
            "source": "numerical",
        },
    )


# --------------------------------------------------------------------------------------------
# Closed forms


def proposition_4_4_rank(d, r_star, kappa):
    """Rank above which GRN-v1/v2 beats a ResNet of rank r*  [paper].

    r' = (r* - d kappa^2) / (1 - kappa^2): Proposition 4.4 of arXiv 2502.06785 (decoded from
    garbled text); any GRN rank above r' wins. Equivalent to
    (r* - r') < kappa^2 (d - r'). At kappa = 1 every rank wins: the value is -inf.
    """
    k2 = np.asarray(kappa, dtype=float) ** 2
    num = np.asarray(r_star, dtype=float) - np.asarray(d, dtype=float) * k2
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(k2 < 1, num / (1 - k2), -np.inf)
    return out[()] if out.ndim == 0 else out


def derived_sufficient_condition(x, kappa, variant: Variant = "v1", d: int | None = None):
    """Sufficient condition for GRN to win at equal parameters  [derived here].

    v1: (sqrt(1 + x) - 1)^2 < kappa^2 (1 - x), x = r*/d. It combines Prop. 4.4's condition
    (r* - r') < kappa^2 (d - r') with Lemma C.1's r* - r' <= (sqrt(d^2 + d r*) - d)^2 / d and
    d - r' >= d - r*. Not the paper's printed (4.1), which we could not read.
    v2 (needs d): (sqrt(1 + r*) - 1)^2 < kappa^2 (d - r*), from r* - r'' <= (sqrt(1 + r*) - 1)^2.
    Both ignore that the equal-budget rank is an integer (see the tests for the consequence).
    """
    x = np.asarray(x, dtype=float)
    k2 = np.asarray(kappa, dtype=float) ** 2
    if variant == "v1":
        out = (np.sqrt(1 + x) - 1) ** 2 < k2 * (1 - x)
    elif variant == "v2":
        if d is None:
            raise ValueError("the GRN-v2 condition depends on d and r* separately: pass d")
        r_star = x * d
        out = (np.sqrt(1 + r_star) - 1) ** 2 < k2 * (d - r_star)
    else:
        raise ValueError(f"unknown GRN variant {variant!r}; expected 'v1' or 'v2'")
    return out[()] if out.ndim == 0 else out


def derived_bound(kappa, variant: Variant = "v1", d: int | None = None):
    """Closed-form r*/d threshold of ``derived_sufficient_condition``  [derived here].

    v1: with s = sqrt(1 + x) the condition is (1 + k^2) s^2 - 2 s + (1 - 2 k^2) < 0, whose
    larger root is s+ = (1 + k sqrt(1 + 2 k^2)) / (1 + k^2); the smaller root is <= 1, so for
    x >= 0 the condition holds exactly when x < s+^2 - 1 (this matches schemes.md Sec. 2.4).
    v2: no closed form in r*/d alone, so None unless d is given; then with s = sqrt(1 + r*),
    (1 + k^2) s^2 - 2 s + 1 - k^2 (d + 1) < 0 gives r* < s+^2 - 1 with
    s+ = (1 + sqrt(1 - (1 + k^2)(1 - k^2 (d + 1)))) / (1 + k^2), returned as r*/d.
    """
    k = np.asarray(kappa, dtype=float)
    k2 = k**2
    if variant == "v1":
        s_plus = (1 + k * np.sqrt(1 + 2 * k2)) / (1 + k2)
        out = s_plus**2 - 1
    elif variant == "v2":
        if d is None:
            return None
        disc = 1 - (1 + k2) * (1 - k2 * (d + 1))
        s_plus = (1 + np.sqrt(np.maximum(disc, 0.0))) / (1 + k2)
        out = np.maximum(s_plus**2 - 1, 0.0) / d
    else:
        raise ValueError(f"unknown GRN variant {variant!r}; expected 'v1' or 'v2'")
    return out[()] if out.ndim == 0 else out


def derived_bound_curve(kappas, variant: Variant = "v1", d: int | None = None) -> xr.DataArray:
    """``derived_bound`` over kappa as a labelled DataArray (source "derived here")."""
    ks = np.asarray(kappas, dtype=float)
    values = derived_bound(ks, variant, d)
    if values is None:
        raise ValueError("the GRN-v2 bound has no closed form in r*/d alone: pass d")
    attrs = {
        "long_name": f"derived sufficient r*/d threshold for GRN-{variant}",
        "units": "r*/d",
        "variant": variant,
        "source": SOURCES["derived_bound"],
    }
    if d is not None:
        attrs["d"] = d
    return xr.DataArray(values, dims=("kappa",), coords={"kappa": ks}, name="derived_bound", attrs=attrs)
