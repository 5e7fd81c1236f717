"""Effective and collective rank of a model's layers (DCA, arXiv 2502.06785, Sec. 4).

DCA's theory compares the collective rank r* = sum_t rank(f_t) of the layers with the width d:
learnable depth weights beat the fixed residual when r*/d is small. For trained nonlinear layers
the rank of a layer is measured here as an effective rank of its outputs over tokens, from the
eigenvalues lambda_1 >= ... >= lambda_d of the output covariance that ``capture(..., rank=True)``
streams into ``source_spectrum``:

    numerical     smallest r with sum_{i<=r} lambda_i >= energy * sum_i lambda_i   (energy 0.99)
    entropy       exp(H(p)), p_i = lambda_i / sum lambda                  (Roy & Vetterli 2007)
    participation (sum lambda)^2 / sum lambda^2

The collective rank sums a kind of rank over the sublayer sources (the embedding is the model
input, not a layer). All functions reduce over the ``component`` dimension by name and keep any
other dimension (``source``, ``scheme``).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthscope.analysis.stack import per_model
from depthscope.analysis.theory import derived_bound, threshold

KINDS = ("numerical", "entropy", "participation")


def _check(spectrum: xr.DataArray) -> xr.DataArray:
    """The spectrum, clipped at 0 and divided by its largest value (ranks are scale-free, and
    this keeps squares of tiny spectra from underflowing).
    """
    if "component" not in spectrum.dims:
        raise ValueError("expected a spectrum with a 'component' dimension (capture with rank=True)")
    lam = spectrum.clip(min=0.0)
    top = lam.max("component")
    return lam / top.where(top > 0, 1.0)


def numerical_rank(spectrum: xr.DataArray, energy: float = 0.99) -> xr.DataArray:
    """Number of leading eigenvalues holding ``energy`` of the total (0 for an all-zero spectrum)."""
    if not 0.0 < energy <= 1.0:
        raise ValueError(f"energy must be in (0, 1], got {energy}")
    lam = _check(spectrum)
    lam = xr.apply_ufunc(
        lambda a: -np.sort(-a, axis=-1),
        lam,
        input_core_dims=[["component"]],
        output_core_dims=[["component"]],
    )
    total = lam.sum("component")
    cum = lam.cumsum("component")
    # a relative slack of 1e-12 keeps exact planted spectra from missing the threshold by rounding
    reached = cum >= energy * total * (1 - 1e-12)
    out = (~reached).sum("component") + 1
    out = out.where(total > 0, 0).astype(float).where(spectrum.notnull().any("component"))
    out.name = "numerical_rank"
    out.attrs.update(long_name=f"numerical rank ({energy:g} of the energy)", units="1")
    return out


def entropy_rank(spectrum: xr.DataArray) -> xr.DataArray:
    """Exp of the Shannon entropy of the normalised spectrum (1 for rank one, d for a flat one)."""
    lam = _check(spectrum)
    total = lam.sum("component")
    p = lam / total.where(total > 0)
    h = -(p * np.log(p.where(p > 0, 1.0))).sum("component")
    out = np.exp(h).where(total > 0, 0.0).where(spectrum.notnull().any("component"))
    out.name = "entropy_rank"
    out.attrs.update(long_name="entropy effective rank exp(H)", units="1")
    return out


def participation_ratio(spectrum: xr.DataArray) -> xr.DataArray:
    """(sum lambda)^2 / sum lambda^2."""
    lam = _check(spectrum)
    total = lam.sum("component")
    out = (
        (total**2 / (lam**2).sum("component").where(total > 0))
        .fillna(0.0)
        .where(spectrum.notnull().any("component"))
    )
    out.name = "participation_ratio"
    out.attrs.update(long_name="participation ratio (sum l)^2 / sum l^2", units="1")
    return out


def effective_ranks(spectrum: xr.DataArray, energy: float = 0.99) -> xr.DataArray:
    """The three effective ranks along a new ``rank_kind`` dimension."""
    out = xr.concat(
        [numerical_rank(spectrum, energy), entropy_rank(spectrum), participation_ratio(spectrum)],
        dim=xr.DataArray(np.array(KINDS, dtype=object), dims="rank_kind", name="rank_kind"),
    )
    out.name = "effective_rank"
    out.attrs.update(long_name="effective rank of the source's outputs over tokens", units="1", energy=energy)
    return out


def collective_rank(trace: xr.Dataset, energy: float = 0.99) -> xr.Dataset:
    """Per-source effective ranks, r* (their sum over sublayers), d and r*/d, as a Dataset."""
    if "source_spectrum" not in trace:
        raise ValueError("the trace has no source_spectrum: capture it with rank=True (CLI: --rank)")
    spectrum = trace["source_spectrum"]
    ranks = effective_ranks(spectrum, energy)
    layers = trace["source_kind"] != "embed"
    r_star = ranks.where(layers).sum("source")
    d = spectrum.sizes["component"]
    out = xr.Dataset(
        {
            "effective_rank": ranks,
            "collective_rank": r_star,
            "collective_rank_ratio": r_star / d,
        },
        attrs={"d_model": d, "energy": energy},
    )
    out["collective_rank"].attrs.update(long_name="collective rank r* (sum over sublayers)", units="1")
    out["collective_rank_ratio"].attrs.update(long_name="r*/d", units="1")
    return out


def rank_profile(trace: xr.Dataset, energy: float = 0.99) -> xr.Dataset:
    """Per source: ``effective_rank`` (``effective_ranks`` of its outputs over tokens) and the
    width ``d_model``, for a trace or each model of a stack (each at its own width; NaN for a
    model of the stack captured without ``rank``).
    """
    if "source_spectrum" not in trace:
        raise ValueError("the trace has no source_spectrum: capture it with rank=True (CLI: --rank)")

    def one(t: xr.Dataset) -> xr.Dataset:
        if "source_spectrum" not in t:  # NaN ranks of each of its sources: the stack aligns by source
            kinds = xr.DataArray(np.array(KINDS, dtype=object), dims="rank_kind", name="rank_kind")
            nan = xr.full_like(t["source"], np.nan, dtype=float).expand_dims(rank_kind=kinds)
            return xr.Dataset({"effective_rank": nan.transpose("rank_kind", "source"), "d_model": np.nan})
        ranks = effective_ranks(t["source_spectrum"], energy)
        return xr.Dataset({"effective_rank": ranks, "d_model": t.sizes["component"]})

    return per_model(trace, one)


def add_ranks(trace: xr.Dataset, energy: float = 0.99) -> xr.Dataset:
    """The trace with ``effective_rank``, ``collective_rank`` and ``collective_rank_ratio`` added."""
    ranks = collective_rank(trace, energy)
    return trace.assign(**ranks.data_vars).assign_attrs(rank_energy=energy)


def rank_summary(
    trace: xr.Dataset, energy: float = 0.99, kappa: float | None = None, variant: str = "v1"
) -> dict:
    """A JSON-ready summary of a rank trace: per-source effective ranks, r*, d, r*/d (and r*/d from
    the first half of the tokens where the trace has it: how far the estimate has converged), and
    DCA's verdict (``verdict``: exact risks at ``kappa``, else over the kappas scanned); for a given
    ``kappa`` also the derived sufficient bound.
    """
    r = collective_rank(trace, energy)
    d = int(r.attrs["d_model"])
    res = {
        "label": trace.attrs.get("label", ""),
        "scheme": trace.attrs.get("scheme", ""),
        "d": d,
        "energy": energy,
        "tokens": int(trace.attrs.get("tokens", 0)),
        "sources": [
            {"source": str(s), **{k: float(r["effective_rank"].sel(source=s, rank_kind=k)) for k in KINDS}}
            for s in trace["source"].values
        ],
        "n_layers_counted": int((trace["source_kind"] != "embed").sum()),
        "collective_rank": {k: float(r["collective_rank"].sel(rank_kind=k)) for k in KINDS},
        "ratio": {k: float(r["collective_rank_ratio"].sel(rank_kind=k)) for k in KINDS},
    }
    res.update(convergence(trace, energy))
    res.update(verdict(res["ratio"]["numerical"], d, kappa, variant))
    if kappa is not None:
        bound = derived_bound(kappa, variant, d=d)
        res["derived_bound"] = None if bound is None else float(bound)
    res["conclusion"] = conclusion(res)
    return res


def least_kappa(ratio: float) -> float | None:
    """The smallest task complexity kappa at which DCA's derived sufficient condition (GRN-v1)
    holds for a model of collective rank ratio ``ratio`` = r*/d; None where it holds at no kappa
    (the v1 bound rises with kappa to (((1 + sqrt 3) / 2)^2 - 1) = 0.866 at kappa = 1).
    """
    if not 0 <= ratio < float(derived_bound(1.0)):
        return None
    lo, hi = 0.0, 1.0  # derived_bound is increasing in kappa on [0, 1]: bisect
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if float(derived_bound(mid)) > ratio else (mid, hi)
    return hi


def convergence(trace: xr.Dataset, energy: float = 0.99) -> dict:
    """r*/d (numerical) from half the tokens (``ratio_half``, over ``tokens_half``: every other
    batch), where the trace keeps that half's spectra; beside r*/d from every token it says how far
    the estimate has converged (a numerical rank grows with the tokens seen).
    """
    if "source_spectrum_half" not in trace:
        return {}
    half = collective_rank(trace.assign(source_spectrum=trace["source_spectrum_half"]), energy)
    ratio = float(half["collective_rank_ratio"].sel(rank_kind="numerical"))
    return {"ratio_half": ratio, "tokens_half": int(trace["source_spectrum_half"].attrs.get("tokens", 0))}


KAPPAS = tuple(round(0.05 * i, 2) for i in range(1, 21))  # task complexities scanned when none is given
CONVERGED = 0.02  # |r*/d from all the tokens - from the first half| above this: not yet converged


def verdict(ratio: float, d: int, kappa: float | None = None, variant: str = "v1") -> dict:
    """DCA's theory (arXiv 2502.06785, Sec. 4) on a model of r*/d = ``ratio`` at width ``d``, by
    exact risks (``theory.threshold``: GRN against a residual network with as many parameters, mean
    over random tasks): at ``kappa`` (``threshold``, ``at_edge`` when GRN wins at every r*/d the scan
    has, 1/d .. (d-1)/d, so the threshold is no threshold but the scan's end, and ``helps``), else
    at every kappa of ``KAPPAS`` (``helps_at``, the kappas where GRN wins at this r*/d). The one
    verdict the command line, the report and the notebooks print.
    """
    edge = (d - 1) / d
    if kappa is not None:
        t = threshold(d, kappa, variant)
        return {"variant": variant, "kappa": kappa, "threshold": t, "at_edge": t >= edge, "helps": ratio < t}
    return {"variant": variant, "helps_at": [k for k in KAPPAS if ratio < threshold(d, k, variant)]}


def conclusion(res: dict) -> str:
    """One sentence: ``verdict``'s (from ``rank_summary``'s fields), with the convergence caveat."""
    x, label, d, v = res["ratio"]["numerical"], res["label"] or "this model", res["d"], res["variant"]
    where = (
        f"DCA's theory (GRN-{v} against a residual network with as many parameters, exact risks at d = {d}"
    )
    mine = f"its r*/d = {x:.3f}"
    if "kappa" in res:
        t, where = res["threshold"], f"{where}, kappa = {res['kappa']:g})"
        if t <= 0:
            text = f"{where} expects no gain from learned depth weights: GRN wins at no r*/d."
        elif res["helps"] and res["at_edge"]:
            text = (
                f"{where} expects learned depth weights to help {label}: GRN wins at every r*/d scanned "
                f"(1/{d} to {d - 1}/{d}), {mine} among them."
            )
        elif res["helps"]:
            text = f"{where} expects learned depth weights to help {label}: {mine} is below {t:.3f}, the "
            text += "largest r*/d at which GRN wins."
        elif res["at_edge"]:
            text = (
                f"{where} expects no gain for {label}: GRN wins at every r*/d scanned (up to {d - 1}/{d}), "
            )
            text += f"but {mine} is beyond them (the layers' ranks fill the width)."
        else:
            text = f"{where} expects no gain for {label}: {mine} is above {t:.3f}, the largest r*/d at "
            text += "which GRN wins."
    else:
        helps, scanned = res["helps_at"], f"kappa {KAPPAS[0]:g} to {KAPPAS[-1]:g}"
        if not helps:
            text = f"{where}) expects no gain from learned depth weights for {label} at any task "
            text += f"complexity scanned ({scanned}): {mine}."
        elif len(helps) == len(KAPPAS):
            text = f"{where}) expects learned depth weights to help {label} at every task complexity "
            text += f"scanned ({scanned}): {mine}."
        else:
            at = ", ".join(f"{k:g}" for k in helps)
            text = f"{where}) expects learned depth weights to help {label} at kappa {at} of those "
            text += f"scanned ({scanned}): {mine}."
    half = res.get("ratio_half")
    if half is not None and not abs(x - half) <= CONVERGED:
        text += (
            f" Not converged: r*/d is {half:.3f} from half of the {res['tokens']} tokens; capture more "
            "tokens before reading it."
        )
    return text
