"""Dilution estimators: pure functions of a trace (or of traces stacked along ``scheme``).

Definitions (DESIGN.md "Estimators"); n_l is the number of sources available to consumer l:

    baseline[l]          = 1 / n_l                    the uniform share of a PreNorm residual, ~1/T
    dilution_index[l, s] = contribution_share[l, s] * n_l     (1.0 = exactly the uniform share)
    retention[s, lag]    = contribution_share of source s at the consumer ``lag`` sublayers after it
    pattern_score[l]     = (sum_{s in I_k} |M[l,s]| / sum_s |M[l,s]|) / (|I_k| / n_l)
                           with I_k = the embedding(s) + the last k sources; > 1 is the
                           "input and recent layers" pattern, 1 is a uniform row (NaN when n_l <= |I_k|)

Every function reduces by dimension name and works with or without a ``scheme`` dimension.
"""

from __future__ import annotations

import numpy as np
import xarray as xr


def n_available(trace: xr.Dataset) -> xr.DataArray:
    """Number of sources available to each consumer (non-NaN cells of ``mixing``)."""
    n = trace["mixing"].notnull().sum("source")
    n.name = "n_sources"
    n.attrs.update(long_name="available sources", units="1")
    return n


def baseline(trace: xr.Dataset) -> xr.DataArray:
    """The 1/T baseline: the uniform share 1/n_l of each consumer."""
    n = n_available(trace)
    out = (1.0 / n).where(n > 0)
    out.name = "baseline"
    out.attrs.update(long_name="uniform share 1/n (the 1/T baseline)", units="fraction")
    return out


def dilution_index(trace: xr.Dataset) -> xr.DataArray:
    """contribution_share * n_l: 1.0 is exactly the uniform 1/T share."""
    out = trace["contribution_share"] * n_available(trace)
    out.name = "dilution_index"
    out.attrs.update(long_name="dilution index (share x available sources)", units="1")
    return out


def _recent_mask(trace: xr.Dataset, k: int) -> xr.DataArray:
    """True on the embedding source(s) and the last k available sources of each consumer."""
    avail = trace["mixing"].notnull()
    # rank of each available source counted from the latest one (0 = latest)
    from_end = avail[..., ::-1].cumsum("source")[..., ::-1] - 1
    is_input = trace["source_kind"] == "embed"
    return avail & (is_input | (from_end < k))


def pattern_score(trace: xr.Dataset, k: int = 2) -> xr.DataArray:
    """Mass of |mixing| on the embedding + last k sources over what a uniform row puts there."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    mask = _recent_mask(trace, k)
    m = abs(trace["mixing"])
    mass = m.where(mask).sum("source") / m.sum("source")
    n_sel = mask.sum("source")
    n = n_available(trace)
    out = (mass / (n_sel / n)).where(n > n_sel)
    out.name = "pattern_score"
    out.attrs.update(long_name=f"input-and-recent pattern score (k={k})", units="1")
    return out


def latest_source(trace: xr.Dataset) -> xr.DataArray:
    """Label of the latest available source of each consumer."""
    avail = trace["mixing"].notnull()
    idx = (avail * np.arange(trace.sizes["source"])).max("source")
    return trace["source"][idx].drop_vars([c for c in trace["source"].coords if c != "source"], errors="ignore")


def share_of(trace: xr.Dataset, which: str) -> xr.DataArray:
    """Contribution share of ``embed`` (all embedding sources) or ``latest`` source per consumer."""
    share = trace["contribution_share"]
    if which == "embed":
        out = share.where(trace["source_kind"] == "embed").sum("source", min_count=1)
    elif which == "latest":
        avail = share.notnull()
        from_end = avail[..., ::-1].cumsum("source")[..., ::-1] - 1
        out = share.where(avail & (from_end == 0)).sum("source", min_count=1)
    elif which == "first":
        src = trace["source"].values[[k != "embed" for k in trace["source_kind"].values]][0]
        out = share.sel(source=src, drop=True)
    else:
        raise ValueError(f"which must be 'embed', 'latest' or 'first', got {which!r}")
    out.name = f"{which}_share"
    out.attrs.update(long_name=f"contribution share of the {which} source", units="fraction")
    return out


def retention(trace: xr.Dataset) -> xr.DataArray:
    """Share of each source at the consumers ``lag`` sublayers after it was written.

    Dims (source, lag[, scheme]); lag 1 is the first consumer that can read the source. Several
    consumers at one depth (DCA's q/k/v views) are averaged.
    """
    share = trace["contribution_share"]
    lag = trace["layer_depth"] - trace["source_depth"]
    max_lag = int(lag.max())
    lags = np.arange(1, max_lag + 1)
    out = xr.concat([share.where(lag == g).mean("layer") for g in lags], dim=xr.DataArray(lags, dims="lag", name="lag"))
    out = out.transpose("source", "lag", ...)
    out.name = "retention"
    out.attrs.update(long_name="contribution share after a lag (sublayers)", units="fraction")
    return out


def consumer_table(trace: xr.Dataset, k: int = 2) -> xr.Dataset:
    """Per consumer: available sources, 1/T, shares of embedding and latest source, their dilution
    indices, and the pattern score."""
    n = n_available(trace)
    table = xr.Dataset(
        {
            "n_sources": n,
            "baseline": baseline(trace),
            "embed_share": share_of(trace, "embed"),
            "latest_share": share_of(trace, "latest"),
            "pattern_score": pattern_score(trace, k),
            "residual_error": trace["residual_error"],
        }
    )
    table["embed_index"] = table["embed_share"] * n
    table["latest_index"] = table["latest_share"] * n
    table["embed_index"].attrs.update(long_name="dilution index of the embedding", units="1")
    table["latest_index"].attrs.update(long_name="dilution index of the latest source", units="1")
    return table


def summary(trace: xr.Dataset, k: int = 2) -> xr.Dataset:
    """Per-scheme summary: consumer means of the pattern score, shares and dilution indices.

    Means over consumers that have more than the k+1 pattern sources; the read-out values are
    reported separately because the read-out is what the logits see.
    """
    t = consumer_table(trace, k)
    inner = t["layer_kind"] != "readout"
    keep = inner & t["pattern_score"].notnull()
    readout = t.where(t["layer_kind"] == "readout").mean("layer")
    out = xr.Dataset(
        {
            "pattern_score": t["pattern_score"].where(keep).mean("layer"),
            "embed_index": t["embed_index"].where(keep).mean("layer"),
            "latest_index": t["latest_index"].where(keep).mean("layer"),
            "readout_embed_share": readout["embed_share"],
            "readout_latest_share": readout["latest_share"],
            "readout_pattern_score": readout["pattern_score"],
            "max_residual_error": t["residual_error"].max("layer"),
        }
    )
    out.attrs.update(k=k)
    for name, long in {
        "pattern_score": f"mean pattern score over consumers (k={k})",
        "embed_index": "mean dilution index of the embedding",
        "latest_index": "mean dilution index of the latest source",
        "readout_embed_share": "read-out share of the embedding",
        "readout_latest_share": "read-out share of the latest source",
        "readout_pattern_score": f"read-out pattern score (k={k})",
        "max_residual_error": "largest residual error",
    }.items():
        out[name].attrs.update(long_name=long)
    return out
