"""Stream collapse in multi-stream residuals (HC, mHC, DeepSeek-V4, Qwen4-Exp): do n streams carry n
signals, or one? (arXiv 2606.03483: one dominant stream carries most of the signal and H_res stays
near the identity.)

Legend: token (batch and pos flattened), stream, stream_from / stream_to (a stream-mixing matrix in
the source-row convention of the traces: R[s, t] carries stream s into stream t), d_model, layer
(a consumer: each sublayer's read, then the read-out).

A consumer reads y = sum_s c_s with c_s = A_s (*) h_s, h_s the streams it receives and A_s its read
weights (a scalar per stream and token: HC's H_pre, mHC's pre, DeepSeek-V4's pre_head, 1 for a
summing read-out; or per channel: Qwen4-Exp). Per consumer, over its tokens:

* ``stream_share`` [stream]: the projection share sum_tok <c_s, y> / sum_tok |y|^2 (the |y|^2-weighted
  token mean of <c_s, y> / |y|^2, as the trace's ``contribution_share``); it sums to 1 exactly and
  can be negative (a stream that cancels part of the others);
* ``norm_share`` [stream]: sum_tok |c_s| / sum_tok sum_s' |c_s'| (non-negative, sums to 1);
* ``participation_ratio``: (sum_s p_s)^2 / sum_s p_s^2 of the stream shares, the effective number of
  streams: 1 when one stream carries everything, n when all carry equal shares (with negative
  shares it can fall below 1); ``participation_ratio_norm`` the same of the norm shares (in [1, n]);
* ``stream_cosine`` [stream_from, stream_to]: the token mean of cos(h_s, h_t) of the streams' states
  (a zero stream has cosine 0 with everything); ``mean_cosine`` the mean over the n(n-1) pairs s != t;
* ``distinct_streams``: (tr G)^2 / |G|_F^2 of the streams' Gram matrix G[s, t] = sum_tok <h_s, h_t>,
  the participation ratio of its eigenvalues: 1 when the streams are copies of one vector (however
  evenly they share the read), n for orthogonal streams of equal norm;
* ``res_distance``: the token mean of |R - I|_F of the consumer's stream-mixing matrix R (0 for a
  family without mixing, NaN at the read-out); ``composite_distance``: the token mean of |P - I|_F
  of the per-token product P of every sublayer's R over depth, and ``composite_uniform_distance`` of
  |P - J/n|_F (J/n, every stream the mean of all, is at sqrt(n - 1) from I: a composite near it has
  averaged the streams into copies).

``stream_statistics`` gives additive sums of one batch (float64), ``stream_collapse`` the measures
from sums added over batches. ``trace_res_distance`` reads the same distances from a trace's
token-mean matrices (``hc_res``, ``comb``): |mean R - I|_F <= mean |R - I|_F (the norm is convex),
with equality for static matrices. ``stream_table`` gives one row per model for the report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import xarray as xr

from depthscope.analysis.native import FROM, TO, stream_composite

STREAM = "stream"
SUMS = (
    "read_dot",
    "read_abs",
    "input_sq",
    "stream_sq",
    "gram_sum",
    "cosine_sum",
    "res_distance_sum",
    "tokens",
)
MATRIX_VARIABLES = ("hc_res", "comb")  # the traces' token-mean stream-mixing matrices (source-row)


def identity_distance(matrices: np.ndarray) -> np.ndarray:
    """|R - I|_F over the last two axes of square matrices [..., stream, stream]."""
    m = np.asarray(matrices, dtype=np.float64)
    return np.sqrt(((m - np.eye(m.shape[-1])) ** 2).sum((-2, -1)))


def stream_statistics(
    streams: np.ndarray,
    weights: np.ndarray | None = None,
    res: np.ndarray | None = None,
    mixes: bool = True,
) -> xr.Dataset:
    """Additive sums over the tokens of one consumer's read (see the module docstring), in float64.

    Args:
        streams: the streams the consumer reads, [token, stream, d_model].
        weights: its read weights, [token, stream] or per channel [token, stream, d_model]; None
            reads the plain sum (HC/mHC read-outs).
        res: the consumer's stream-mixing matrices [token, stream_from, stream_to] (source-row);
            None with ``mixes`` for a family without stream mixing (R = I, distance 0), None
            without ``mixes`` where there is no write (the read-out: NaN).
    """
    h = np.asarray(streams, dtype=np.float64)
    n_tok, n = h.shape[:2]
    a = np.ones((n_tok, n), dtype=np.float64) if weights is None else np.asarray(weights, dtype=np.float64)
    c = h * (a if a.ndim == 3 else a[..., None])  # [token, stream, d_model]
    y = c.sum(1)
    norms = np.sqrt((h**2).sum(-1))  # [token, stream]
    dots = np.einsum("tsd,tud->tsu", h, h)
    denom = norms[:, :, None] * norms[:, None, :]
    cos = np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)
    if res is not None:
        dist = float(identity_distance(res).sum())
    else:
        dist = 0.0 if mixes else np.nan
    return xr.Dataset(
        {
            "read_dot": (STREAM, np.einsum("tsd,td->s", c, y)),
            "read_abs": (STREAM, np.sqrt((c**2).sum(-1)).sum(0)),
            "input_sq": ((), float((y**2).sum())),
            "stream_sq": (STREAM, (h**2).sum((0, 2))),
            "gram_sum": ((FROM, TO), dots.sum(0)),
            "cosine_sum": ((FROM, TO), cos.sum(0)),
            "res_distance_sum": ((), dist),
            "tokens": ((), float(n_tok)),
        },
        attrs={"d_model": int(h.shape[-1])},
    )


def participation_ratio(shares: xr.DataArray, dim: str = STREAM) -> xr.DataArray:
    """(sum p)^2 / sum p^2 over ``dim``: 1 for one carrier, n for n equal shares."""
    return shares.sum(dim) ** 2 / (shares**2).sum(dim)


def mean_off_diagonal(matrix: xr.DataArray) -> xr.DataArray:
    """The mean of a [stream_from, stream_to] matrix over its n(n-1) off-diagonal cells (NaN for n = 1)."""
    n = matrix.sizes[FROM]
    off = 1.0 - np.eye(n)
    if n < 2:
        return (matrix * np.nan).sum((FROM, TO))
    return (matrix * xr.DataArray(off, dims=(FROM, TO))).sum((FROM, TO)) / (n * (n - 1))


def distinct_streams(gram: xr.DataArray) -> xr.DataArray:
    """(tr G)^2 / |G|_F^2 of a Gram matrix [stream_from, stream_to]: its eigenvalues' participation ratio."""
    n = gram.sizes[FROM]
    trace = (gram * xr.DataArray(np.eye(n), dims=(FROM, TO))).sum((FROM, TO))
    return trace**2 / (gram**2).sum((FROM, TO))


def stream_collapse(stats: xr.Dataset) -> xr.Dataset:
    """The stream-collapse measures from summed ``stream_statistics`` (any leading dims, e.g. layer).

    ``composite_distance_sum`` and ``composite_tokens``, where present, give ``composite_distance``.
    """
    missing = [k for k in SUMS if k not in stats]
    if missing:
        raise ValueError(f"stream statistics lack {', '.join(missing)}")
    share = stats["read_dot"] / stats["input_sq"]
    norm_share = stats["read_abs"] / stats["read_abs"].sum(STREAM)
    cosine = stats["cosine_sum"] / stats["tokens"]
    d_model = stats.attrs.get("d_model")
    out = xr.Dataset(
        {
            "stream_share": share,
            "norm_share": norm_share,
            "participation_ratio": participation_ratio(share),
            "participation_ratio_norm": participation_ratio(norm_share),
            "dominant_stream": share.argmax(STREAM),
            "dominant_share": share.max(STREAM),
            "stream_cosine": cosine,
            "mean_cosine": mean_off_diagonal(cosine),
            "distinct_streams": distinct_streams(stats["gram_sum"]),
            "res_distance": stats["res_distance_sum"] / stats["tokens"],
        },
        attrs=dict(stats.attrs),
    )
    if d_model:
        out["stream_rms"] = np.sqrt(stats["stream_sq"] / (stats["tokens"] * d_model))
    for name in ("composite_distance", "composite_uniform_distance"):
        if f"{name}_sum" in stats:
            out[name] = stats[f"{name}_sum"] / stats["composite_tokens"]
    out["n_streams"] = int(stats.sizes[STREAM])
    units = {
        "stream_share": "share of the read's |y|^2 (projection; sums to 1 over streams)",
        "norm_share": "share of sum_s |A_s h_s| (sums to 1 over streams)",
        "participation_ratio": "effective number of streams (1 .. n)",
        "participation_ratio_norm": "effective number of streams from the norm shares (1 .. n)",
        "mean_cosine": "mean pairwise cosine of the streams' states",
        "distinct_streams": "participation ratio of the streams' Gram eigenvalues (1 .. n)",
        "res_distance": "token mean of |H_res - I|_F",
    }
    for name, text in units.items():
        out[name].attrs["long_name"] = text
    return out


def trace_res_distance(trace: xr.Dataset) -> xr.Dataset:
    """|R - I|_F of a trace's token-mean stream-mixing matrices (``hc_res`` or ``comb``) per layer,
    and of their product over depth (``stream_composite``); an empty Dataset for a trace without one.
    """
    for name in MATRIX_VARIABLES:
        if name in trace and FROM in trace[name].dims:
            res = trace[name]
            break
    else:
        return xr.Dataset()
    per_layer = xr.apply_ufunc(
        identity_distance, res, input_core_dims=[[FROM, TO]], output_core_dims=[[]], vectorize=False
    )
    per_layer = per_layer.where(res.notnull().all((FROM, TO)))
    composite = xr.apply_ufunc(
        lambda m: identity_distance(m), stream_composite(res), input_core_dims=[[FROM, TO]]
    )
    return xr.Dataset({"res_distance_of_mean": per_layer, "composite_distance_of_mean": composite})


def _value(ds: xr.Dataset, name: str, layer: str | None) -> float:
    if name not in ds:
        return float("nan")
    v = ds[name]
    if layer is not None and "layer" in v.dims:
        v = v.sel(layer=layer)
    return float(v)


def stream_table(collapses: Mapping[str, xr.Dataset] | Iterable[xr.Dataset]) -> list[dict[str, object]]:
    """One row per model for the report: model, n_streams, participation ratio, dominant stream and
    its share, mean cosine and distinct streams (all at the read-out), mean |H_res - I|_F over the
    sublayers, the composite's and the composite's |P - J/n|_F, from ``stream_collapse`` outputs
    with a ``layer`` dim (keyed by model label, or labelled by their ``label`` attr).
    """
    items = (
        collapses.items()
        if isinstance(collapses, Mapping)
        else ((c.attrs.get("label", "?"), c) for c in collapses)
    )
    rows = []
    for model, ds in items:
        ro = "readout" if "layer" in ds.dims else None
        res = ds["res_distance"]
        if "layer" in res.dims:
            res = res.drop_sel(layer="readout", errors="ignore")
        rows.append(
            {
                "model": str(model),
                "n_streams": int(ds["n_streams"]),
                "participation_ratio": _value(ds, "participation_ratio", ro),
                "dominant_stream": int(_value(ds, "dominant_stream", ro)),
                "dominant_share": _value(ds, "dominant_share", ro),
                "mean_cosine": _value(ds, "mean_cosine", ro),
                "distinct_streams": _value(ds, "distinct_streams", ro),
                "mean_res_distance": float(res.mean()),
                "composite_distance": _value(ds, "composite_distance", None),
                "composite_uniform_distance": _value(ds, "composite_uniform_distance", None),
            }
        )
    return rows
