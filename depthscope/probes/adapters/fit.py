"""Weights from activations: which hypothesis explains a consumer's input, and whether the
activations determine its weights (``docs/reference.md#modelspec``).

A consumer's input h (legend: n sources, N numbers fitted, d = d_model) is read as a combination of
the sources v_s written before it, under one of three nested hypotheses:

* unit: h = sum_s v_s (no parameter: a standard residual);
* static: h = sum_s c_s v_s, one scalar per source for every token (n parameters);
* per token: h_t = sum_s w_ts v_ts at each token t (n parameters per token).

Each is fitted by least squares in float64 on the same numbers. **The choice is made by the
evidence, not by the first that passes a tolerance**: the simplest hypothesis is kept unless a
richer one explains significantly more, by the F test F = ((RSS_simple - RSS_rich) / extra
parameters) / (RSS_rich / (N - parameters of the rich one)) above ``F_CRITICAL``. Rounding alone
gives F near 1; a real departure gives F far above it (bfloat16 static weights of 0.97-0.98 read
against 1: F > 10^4), so a loose tolerance no longer hides a static weight of 0.97 behind "1". An
input already rebuilt to float64 rounding (``EXACT`` relative) needs nothing richer. The residuals
of the test are weighted by the size of the rounding at each number: a sum rounds in proportion to
its terms, so each number's residual is divided by sum_s |v_s| there. Unweighted, the rounding of a
stream with a few channels far larger than the rest (SmolLM2's) concentrates there, and the test
reads it as evidence for static weights that are 1 to the dtype's rounding. The kept
hypothesis must then rebuild the input within the tolerance of the model's dtype.

**Identifiability.** Fitted weights are only as determined as the sources are independent. With the
sources scaled to unit norm (G the Gram matrix of their directions), rounding of size delta = u *
sum_s |c_s| in the input (u the unit roundoff of the model's dtype, c_s the terms) moves the scaled
coefficient of source s by about delta sqrt([G^-1]_ss / N) (rounding as random noise over the N
numbers fitted); twice that is allowed for. The weights are determined when that moves no weight by
more than L max(1, |w_s|) and no term by more than L |h| (per token: the root-mean-square |h| of the
batch, since a share sums over tokens weighted by |h|^2), L = ``LIMIT[dtype]`` for per-token weights
(the identity's own tolerance: 1e-4 in float32) and ``STATIC_LIMIT[dtype]`` for static ones, which a
trace reports as they are (5e-6 in float32). Dependent
sources (a block state named beside the increments inside it, a duplicate, a source that is zero)
make [G^-1]_ss infinite or huge and are refused; so are per-token weights over n >= d sources, which
rebuild any input whatever the model does. The same rule holds for every batch of a capture
(``solve``), token by token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

# per-token weights are determined to within this (relative to max(1, |w|)) under the model's rounding,
# token by token: the precision every input is rebuilt to (``capture.TOLERANCE`` and ``LOW_PRECISION``),
# so a weight is as exact as the identity that checks it (a trace's token means average far below it)
LIMIT = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
# static weights are reported as they are (no mean over tokens): half the precision a trace's weights
# are promised to (1e-5 in float32; 5e-3 float16, 1e-2 bfloat16)
STATIC_LIMIT = {torch.float64: 1e-10, torch.float32: 5e-6, torch.float16: 2.5e-3, torch.bfloat16: 5e-3}
F_CRITICAL = 100.0  # a richer hypothesis is kept when it explains this much more than noise would
EXACT = 1e-13  # relative residual of float64 rounding over a sum of a few hundred terms
SIGMAS = 2.0  # the spread of the rounding's effect allowed for

How = Literal["unit", "static", "token"]


def roundoff(dtype: torch.dtype) -> float:
    """The unit roundoff of a floating dtype, half its machine epsilon (float32 for anything else)."""
    return torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps / 2


def limit_of(dtype: torch.dtype, table: dict = LIMIT) -> float:
    """How precisely weights must be determined in ``dtype`` (``LIMIT`` or ``STATIC_LIMIT``)."""
    return table.get(dtype, table[torch.float32])


@dataclass(frozen=True)
class Solved:
    """A least-squares fit over a Gram system: weights [..., n], which are determined [..., n], and
    the spread of each weight under rounding [..., n].
    """

    w: Tensor
    determined: Tensor
    spread: Tensor


def _by_eigh(g: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """(minimum-norm G^-1 b, diag G^-1) by eigendecomposition, infinite for every source in a
    direction the data do not hold (an eigenvalue below 1e-13 of the largest).
    """
    lam, q = torch.linalg.eigh(g)
    top = lam[..., -1:].clamp_min(1e-300)
    keep = lam > 1e-13 * top  # the pseudo-inverse: directions the data hold
    inv = torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))
    u = ((q * inv[..., None, :]) @ (q.mT @ b[..., None]))[..., 0]
    weak = torch.where(keep, torch.zeros_like(lam), torch.full_like(lam, math.inf))
    return u, ((q * q) * (inv + weak)[..., None, :]).nan_to_num(nan=math.inf).sum(-1)


def solve_gram(
    gram: Tensor,
    rhs: Tensor,
    y_norm: Tensor,
    numbers: int,
    dtype: torch.dtype,
    limit: float | None = None,
    *,
    inverse: Tensor | None = None,
) -> Solved:
    """Least squares of a target on n sources from their Gram matrix ``gram`` [..., n, n] and the
    dots ``rhs`` [..., n] with the target (float64), the target's norm ``y_norm`` [...] and the count
    of ``numbers`` fitted per system; minimum norm where the sources are dependent, each weight
    flagged as determined or not to ``limit`` (default ``LIMIT``; see the module docstring).

    ``inverse``: L^-1 of the Cholesky factor of ``gram`` (``Prefix``: a capture's per-token systems,
    thousands per batch), giving the weights as L^-T L^-1 b and [G^-1]_ss as the column sums of
    (L^-1)^2 in a few products; that answer is kept only where every weight of every system is
    determined, else the eigendecomposition decides, so the verdicts are the eigendecomposition's and
    the weights equal its own to float64 rounding of well-conditioned systems.
    """
    scale = gram.diagonal(dim1=-2, dim2=-1).clamp_min(0).sqrt()  # [..., n]: |v_s|
    live = scale > 0
    s = torch.where(live, scale, torch.ones_like(scale))
    lim = limit_of(dtype) if limit is None else limit

    def finish(u: Tensor, diag: Tensor) -> Solved:  # u, diag: coefficients and [G^-1]_ss, scaled system
        diag = torch.where(live, diag, torch.full_like(diag, math.inf))
        noise = roundoff(dtype) * u.abs().sum(-1, keepdim=True)  # rounding of the terms' sum
        spread = SIGMAS * noise * (diag / numbers).sqrt()  # of each scaled coefficient
        w = torch.where(live, u / s, torch.zeros_like(u))
        determined = (spread <= lim * w.abs().clamp_min(1.0) * s) & (spread <= lim * y_norm[..., None])
        return Solved(w, determined & live, spread / s)

    if inverse is not None:
        z = torch.einsum("...ij,...j->...i", inverse, rhs)
        u = torch.einsum("...ij,...i->...j", inverse, z)  # G^-1 b = L^-T L^-1 b
        solved = finish(u * s, (inverse * inverse).sum(-2) * s * s)
        if bool(solved.determined.all()):
            return solved
    g = gram / (s[..., :, None] * s[..., None, :])  # the directions' Gram matrix
    g = torch.where(live[..., :, None] & live[..., None, :], g, torch.zeros_like(g))
    return finish(*_by_eigh(g, rhs / s))


class Prefix:
    """The per-token systems of targets over prefixes of one list of sources ``v`` [K, ..., d]
    (float64, written by the caller, who says which it rewrote): a capture's consumers read the
    sources written before them, so their per-token Gram matrices are leading corners of one, and so
    are the Cholesky factors of those.

    The Gram matrix is grown as targets need more sources, the new sources' rows computed in the
    same pass over the sources as the target's dots, and cut back to the rows before a source that
    is rewritten; each pair of sources is multiplied once per forward, not once per consumer that
    reads both. With it grows L^-1 (G = L L^T), a row per new source: l = L^-1 g_j, the pivot
    p = sqrt(G_jj - |l|^2), the new row (-l^T L^-1 / p, 1 / p): O(n^2) per token and source where a
    factorisation per consumer costs O(n^3) (``solve_gram`` takes it). From a pivot that is not
    positive at some token (a zero or dependent source) on, the systems go to the eigendecomposition.
    """

    def __init__(self, v: Tensor):
        self.v = v
        k = v.shape[0]
        self.g = v.new_zeros((*v.shape[1:-1], k, k))
        self.li = torch.zeros_like(self.g)
        self.grown = 0  # rows of g up to date
        self.factored = 0  # rows of li up to date

    @classmethod
    def of(cls, sources: Tensor, target: Tensor) -> Prefix:
        """The systems of ``sources`` [n, ..., d] (broadcast to ``target``'s shape), in float64."""
        return cls(torch.broadcast_to(sources, (sources.shape[0], *target.shape)).double().contiguous())

    def rewritten(self, j: int) -> None:
        """Source ``j`` was written again: the rows from it on are stale."""
        self.grown = min(self.grown, j)
        self.factored = min(self.factored, j)

    def solved(self, n: int, target: Tensor, dtype: torch.dtype) -> Solved:
        """Per-token least squares of ``target`` [..., d] on the first ``n`` sources."""
        v, m = self.v, self.grown
        rows = v.new_empty((max(n - m, 0) + 1, *target.shape))
        rows[:-1] = v[m:n]  # the new sources' rows of the Gram matrix, and the target's dots,
        y = rows[-1].copy_(target)  # in one pass over the sources
        dots = torch.einsum("s...d,t...d->...st", rows, v[:n])  # [..., n - m + 1, n]
        if m < n:
            new = dots[..., :-1, :]
            self.g[..., m:n, :n] = new
            self.g[..., :m, m:n] = new[..., :m].mT
            self.grown = n
        # a term is held to the root-mean-square input, not to its own token's: a share sums over
        # tokens weighted by |h|^2, so a token whose input is small (terms cancelling) weighs little
        rms = (y * y).sum(-1).mean().sqrt().expand(y.shape[:-1])
        gram = self.g[..., :n, :n]
        return solve_gram(gram, dots[..., -1, :], rms, v.shape[-1], dtype, inverse=self._factor(n))

    def solve(self, n: int, target: Tensor, dtype: torch.dtype) -> tuple[Tensor, str | None]:
        """Per-token weights [..., n] of ``target`` over the first ``n`` sources for a capture's batch,
        and None, or the reason they are not determined at some token (in words).
        """
        d = self.v.shape[-1]
        if n >= d:
            return self.v.new_zeros(()), (
                f"per-token weights over {n} sources in a width of {d} rebuild any input: not determined"
            )
        solved = self.solved(n, target, dtype)
        bad = ~solved.determined
        if bool(bad.any()):
            at = [int(x) for x in torch.nonzero(bad.any(-1))[0]]
            return (
                solved.w,
                f"at token {tuple(at)} its per-token weights are not determined by the activations",
            )
        return solved.w, None

    def _factor(self, n: int) -> Tensor | None:
        """L^-1 of the first ``n`` sources' Gram matrices [..., n, n], or None where a pivot is not
        positive at some token.
        """
        g, li = self.g, self.li
        for j in range(self.factored, n):
            corner = li[..., :j, :j]
            el = torch.einsum("...ij,...j->...i", corner, g[..., j, :j])
            pivot = g[..., j, j] - (el * el).sum(-1)
            if not bool((pivot > 0).all()):  # NaN fails too
                return None
            p = pivot.sqrt()
            li[..., j, :j] = -torch.einsum("...i,...ij->...j", el, corner) / p[..., None]
            li[..., j, j] = 1.0 / p
            self.factored = j + 1
        return li[..., :n, :n]


def tokens(sources: Tensor, target: Tensor, dtype: torch.dtype) -> Solved:
    """Per-token least squares of ``target`` [..., d] on ``sources`` [n, ..., d], in float64."""
    return Prefix.of(sources, target).solved(sources.shape[0], target, dtype)


def static(sources: Tensor, target: Tensor, dtype: torch.dtype) -> Solved:
    """One scalar per source over every token: least squares of ``target`` on ``sources`` [n, ...]."""
    a, y = sources.double().flatten(1), target.double().flatten()
    return solve_gram(a @ a.T, a @ y, y.norm(), y.numel(), dtype, limit_of(dtype, STATIC_LIMIT))


def rss(
    sources: Tensor, target: Tensor, w: Tensor | None, scale: Tensor | None = None
) -> tuple[float, float]:
    """Residual sum of squares of ``target`` rebuilt with weights ``w`` ([n], [..., n] or None: ones),
    plain and with each number's residual divided by ``scale`` (the rounding's size there; None: 1).
    """
    a, y = sources.double(), target.double()
    if w is None:
        rebuilt = a.sum(0)
    elif w.ndim == 1:
        rebuilt = torch.tensordot(w, a, dims=1)
    else:
        rebuilt = torch.einsum("...n,n...d->...d", w, a)
    r = y - rebuilt
    plain = float((r**2).sum())
    return plain, plain if scale is None else float(((r / scale) ** 2).sum())


def richer(rss_simple: float, rss_rich: float, extra: int, dof: int, energy: float) -> bool:
    """Whether a hypothesis with ``extra`` more parameters, leaving ``dof`` degrees of freedom,
    explains significantly more than the simpler one (the F test; see the module docstring).
    """
    if rss_simple <= (EXACT**2) * energy or extra <= 0 or dof <= 0:
        return False
    if rss_rich <= 0:
        return True
    return ((rss_simple - rss_rich) / extra) / (rss_rich / dof) > F_CRITICAL


@dataclass(frozen=True)
class Choice:
    """The hypothesis the evidence keeps for one consumer: ``how``, its static weights, the relative
    error it leaves, whether its weights are determined, and (refused) why not, in words.
    """

    how: How
    static: tuple[float, ...] | None
    error: float
    why: str | None = None


def choose(sources: Tensor, target: Tensor, dtype: torch.dtype, tol: float, labels: list[str]) -> Choice:
    """Unit, static or per-token weights of ``target`` [batch, pos, d] over ``sources`` [n, batch,
    pos, d] (broadcast, any float dtype), kept by the evidence and checked to be determined; a
    Choice with ``why`` set is a refusal.
    """
    n, d = sources.shape[0], sources.shape[-1]
    tokens_count = math.prod(target.shape[:-1])
    numbers = tokens_count * d
    energy = float((target.double() ** 2).sum())
    norm = math.sqrt(energy)
    # the rounding's size at each number (a sum rounds in proportion to its terms), never 0
    scale = sources.double().abs().sum(0).clamp_min(torch.finfo(torch.float64).tiny)
    weighted_energy = float(((target.double() / scale) ** 2).sum())
    fits: list[tuple[How, tuple[float, float], int, Solved | None]] = [
        ("unit", rss(sources, target, None, scale), 0, None)
    ]
    st = static(sources, target, dtype)
    fits.append(("static", rss(sources, target, st.w, scale), n, st))
    tk = None
    if n < d:  # per-token weights over n >= d sources rebuild any input: never a hypothesis
        tk = tokens(sources, target, dtype)
        fits.append(("token", rss(sources, target, tk.w, scale), n * tokens_count, tk))
    rel = lambda r: math.sqrt(r) / norm if norm > 0 else (0.0 if r == 0 else 1.0)  # noqa: E731
    chosen = None
    for k, (how, (r, rw), p, solved) in enumerate(fits):
        if not rel(r) <= tol:
            continue
        later = fits[k + 1 :]
        if any(richer(rw, rw2, p2 - p, numbers - p2, weighted_energy) for _, (_, rw2), p2, _ in later):
            continue
        chosen = (how, r, solved)
        break
    if chosen is None:
        best = rel(fits[-1][1][0])
        if tk is None:
            return Choice(
                "static",
                None,
                best,
                f"its input is not a static combination of the {n} sources written before it (relative "
                f"error {rel(fits[1][1][0]):.2g}), and per-token weights over {n} sources in a width of {d} "
                "would rebuild any input: they are not determined by the activations",
            )
        return Choice(
            "token",
            None,
            best,
            f"reads something that is not a scalar combination of the {n} sources written before it "
            f"(relative error {best:.2g} with per-token weights)",
        )
    how, r, solved = chosen
    if solved is not None:
        bad = ~solved.determined
        if bool(bad.any()):
            return Choice(how, None, rel(r), _undetermined(how, solved, bad, labels, n, d))
    weights = tuple(float(x) for x in solved.w) if how == "static" else None
    return Choice(how, weights, rel(r))


def _undetermined(how: How, solved: Solved, bad: Tensor, labels: list[str], n: int, d: int) -> str:
    """Why the weights of ``how`` are not determined, naming the sources."""
    hit = bad.reshape(-1, n).any(0)
    names = [labels[j] for j in range(n) if bool(hit[j])]
    spread = solved.spread.reshape(-1, n).max(0).values
    worst = max(float(spread[j]) for j in range(n) if bool(hit[j]))
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    what = "static" if how == "static" else "per-token"
    return (
        f"its {what} weights over the {n} sources before it are not determined by the activations: the "
        f"weights of {shown} could move by {worst:.2g} without changing the input (the sources are "
        "linearly dependent or nearly so: a state named beside the increments in it, a duplicate or a "
        "zero write?)"
    )
