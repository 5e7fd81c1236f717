"""Dilution estimators: pure functions of a trace (or of traces stacked along ``model``).

Definitions (docs/design.md "Estimators"); n_l is the number of sources available to consumer l:

    baseline[l]          = 1 / n_l                    the uniform share of a PreNorm residual, ~1/T
    dilution_index[l, s] = contribution_share[l, s] * n_l     (1.0 = exactly the uniform share)
    a group's index      = its summed share / (k / n_l) for a group of k sources (the embedding
                           group: a token and a position embedding are k = 2; 1.0 = uniform)
    row_normalized[l, s] = |M[l, s]| / sum_s' |M[l, s']|      (a standard residual reads 1/n_l)
    retention[s, lag]    = contribution_share of source s at the consumers ``lag`` sublayers after it
    relative_retention   = retention / the same of a trace whose every share is 1/n_l
    mean_retention[lag]  = relative_retention averaged over the sublayer sources
    pattern_score[l]     = (sum_{s in I_k} |M[l,s]| / sum_s |M[l,s]|) / (|I_k| / n_l)
                           with I_k = the embedding(s) + the last k sources; > 1 is the
                           "input and recent layers" pattern, 1 is a uniform row (NaN when n_l <= |I_k|)
    norm_growth[l]       = input_rms[l] / input_rms[l_1]        (l_1 the first sublayer input: 1.0)
                         = sqrt(sum_tokens |h_l|^2 / sum_tokens |h_l1|^2)  (same tokens, same d)
    norm_growth_ratio    = norm_growth at the last sublayer input: the residual stream's growth

The shares measure how much of a consumer's input each earlier write still makes up; the norm
growth measures how much the stream's magnitude grew, the other face of dilution (a write of a
given size is a smaller part of a larger stream). A trace without ``input_rms`` (a block view, a
trace built by hand) gives NaN, never a guess.

|M| is ``mixing_abs``, the token (and feature) mean of |weight|: for per-feature weights (DCA
GRN-v2/v3) a magnitude, not the magnitude of a mean that signs can cancel.

Curves per consumer depth (``by_depth``: DCA's q/k/v views of one input are one point) are what
the figures draw: ``dilution_curves``, ``pattern_curves``.

Every function reduces by dimension name and works with or without a ``model`` dimension;
``summary``, the curves and ``mean_retention`` estimate each model of a stack on its own trace
(``per_model``) and keep the stack's per-model coordinates (``scheme``, ``step`` ...).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthscope.analysis.stack import per_model
from depthscope.errors import TraceError
from depthscope.trace import STACK, split_models, stack_traces, with_blocks
from depthscope.trace.labels import ATTN, BLOCK, EMBED, MLP, READOUT, SSM, SWA


def n_available(trace: xr.Dataset) -> xr.DataArray:
    """Number of sources available to each consumer (non-NaN cells of ``mixing``)."""
    n = trace["mixing"].notnull().sum("source")
    n.name = "n_sources"
    n.attrs.update(long_name="available sources", units="1")
    return n


def magnitude(trace: xr.Dataset) -> xr.DataArray:
    """|M|: ``mixing_abs`` (the mean magnitude over tokens and features)."""
    return trace["mixing_abs"] if "mixing_abs" in trace else abs(trace["mixing"])


def baseline(trace: xr.Dataset) -> xr.DataArray:
    """The 1/T baseline: the uniform share 1/n_l of each consumer."""
    n = n_available(trace)
    out = (1.0 / n).where(n > 0)
    out.name = "baseline"
    out.attrs.update(long_name="uniform share 1/n (the 1/T baseline)", units="fraction")
    return out


def uniform_share(trace: xr.Dataset) -> xr.DataArray:
    """The share each cell would have if every available source counted the same: 1/n_l at the
    sublayer level; in a ``block_view``, the block's k available sources' k/n_l, averaged over the
    block's consumers as the shares are (kept by the view as ``uniform_share``).
    """
    if "uniform_share" in trace:
        return trace["uniform_share"]
    avail = trace["mixing"].notnull()
    return (1.0 / n_available(trace)).where(avail)


def dilution_index(trace: xr.Dataset) -> xr.DataArray:
    """contribution_share over the uniform share (``uniform_share``: 1/n_l, so share * n_l, at the
    sublayer level; a block's k/n_l in a block view): 1.0 is exactly the uniform 1/T share.
    """
    if "uniform_share" in trace:
        out = trace["contribution_share"] / trace["uniform_share"]
    else:
        out = trace["contribution_share"] * n_available(trace)
    out.name = "dilution_index"
    out.attrs.update(long_name="dilution index (share x available sources)", units="1")
    return out


def row_normalized(trace: xr.Dataset) -> xr.DataArray:
    """Each row of |M| divided by its sum: a standard residual reads exactly 1/n_l (the 1/T baseline).

    Every consumer of a pre-norm model goes through a norm, so a row's overall scale is irrelevant
    to what the consumer sees; this is the weight to compare across schemes (HC/mHC read-outs sum
    n streams, so their raw rows read n at initialisation).
    """
    if "row_normalized" in trace:  # a block view: the sublayer-level weights summed per block
        return trace["row_normalized"]
    m = magnitude(trace)
    out = m / m.sum("source")
    out.name = "row_normalized"
    out.attrs.update(long_name="row-normalised weight |M[l,s]| / sum_s |M[l,s]|", units="fraction")
    return out


def _from_end(avail: xr.DataArray) -> xr.DataArray:
    """Rank of each available source counted from the latest one (0 = latest)."""
    backwards = slice(None, None, -1)
    return avail.isel(source=backwards).cumsum("source").isel(source=backwards) - 1


def _recent_mask(trace: xr.Dataset, k: int) -> xr.DataArray:
    """True on the embedding source(s) and the last k available sources of each consumer."""
    avail = trace["mixing"].notnull()
    return avail & ((trace["source_kind"] == EMBED) | (_from_end(avail) < k))


def pattern_score(trace: xr.Dataset, k: int = 2) -> xr.DataArray:
    """Mass of |M| on the embedding + last k sources over what a uniform row puts there."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    mask = _recent_mask(trace, k)
    m = magnitude(trace)
    mass = m.where(mask).sum("source") / m.sum("source")
    n_sel = mask.sum("source")
    n = n_available(trace)
    out = (mass / (n_sel / n)).where(n > n_sel)
    out.name = "pattern_score"
    out.attrs.update(long_name=f"input-and-recent pattern score (k={k})", units="1")
    return out


def share_of(trace: xr.Dataset, which: str) -> xr.DataArray:
    """Contribution share per consumer of ``embed`` (the embedding group: every embedding source
    together), the ``first`` sublayer source, or the ``latest`` sublayer source written before it
    (NaN where no sublayer has written yet: a position embedding is not "the latest layer").
    """
    share = trace["contribution_share"]
    avail = share.notnull()
    layers = avail & (trace["source_kind"] != EMBED)
    if which == "embed":
        mask = trace["source_kind"] == EMBED
    elif which == "latest":
        mask = layers & (_from_end(layers) == 0)
    elif which == "first":
        mask = layers & (layers.cumsum("source") == 1)
    else:
        raise ValueError(f"which must be 'embed', 'latest' or 'first', got {which!r}")
    out = share.where(mask).sum("source", min_count=1)
    out.name = f"{which}_share"
    out.attrs.update(long_name=f"contribution share of the {which} source", units="fraction")
    return out


def retention(trace: xr.Dataset) -> xr.DataArray:
    """Share of each source at the consumers ``lag`` sublayers after it was written.

    Dims (source, lag[, model]); lag 1 is the first consumer that can read the source. Several
    consumers at one depth (DCA's q/k/v views) are averaged.
    """
    share = trace["contribution_share"]
    lag = trace["layer_depth"] - trace["source_depth"]
    lags = np.arange(1, int(lag.max()) + 1)
    out = xr.concat(
        [share.where(lag == g).mean("layer") for g in lags], dim=xr.DataArray(lags, dims="lag", name="lag")
    )
    out = out.transpose("source", "lag", ...)
    out.name = "retention"
    out.attrs.update(long_name="contribution share after a lag (sublayers)", units="fraction")
    return out


def uniform_retention(trace: xr.Dataset) -> xr.DataArray:
    """``retention`` of a trace whose every available share is the uniform 1/n_l."""
    avail = trace["mixing"].notnull()
    return retention(trace.assign(contribution_share=(avail * baseline(trace)).where(avail)))


def relative_retention(trace: xr.Dataset) -> xr.DataArray:
    """``retention`` over ``uniform_retention``: a source's share at each lag in units of 1/T
    (the dilution index along the lag; 1 = the uniform share of the consumers at that lag), for a
    trace or each model of a stack (``source_depth`` then per model).
    """

    def one(t: xr.Dataset) -> xr.DataArray:
        out = retention(t) / uniform_retention(t)
        out.name = "relative_retention"
        out.attrs.update(long_name="share after a lag, in units of the 1/T share", units="1")
        return out

    return per_model(trace, one)


def mean_retention(trace: xr.Dataset) -> xr.DataArray:
    """``relative_retention`` averaged over the sublayer sources, per lag (and model).

    The embedding is left out: its share dominates untrained models, and ``dilution_curves``
    follows it on its own.
    """

    def one(t: xr.Dataset) -> xr.DataArray:
        out = relative_retention(t).where(t["source_kind"] != EMBED).mean("source")
        out.name = "mean_retention"
        out.attrs.update(long_name="mean share of a sublayer output after a lag, in units of 1/T", units="1")
        return out

    return per_model(trace, one)


def by_depth(da: xr.DataArray) -> xr.DataArray:
    """``da`` per consumer depth, along a ``layer_depth`` dimension: the mean over the consumers
    at each depth (DCA's q, k and v views of one input are one point; every other consumer is
    alone at its depth, so its value is kept exactly).
    """
    if STACK in da.dims:
        return xr.concat(
            [by_depth(da.isel({STACK: i})) for i in range(da.sizes[STACK])],
            dim=STACK,
            coords="different",
            compat="equals",
            join="outer",
        )
    present = np.flatnonzero(da["layer_depth"].values >= 0)  # a stack's padding rows have depth -1
    return da.isel(layer=present).groupby("layer_depth").mean(keep_attrs=True)


def _input_at(trace: xr.Dataset, end: str) -> xr.DataArray:
    """True on the rows of the ``first`` or ``last`` sublayer input (of each model of a stack): the
    consumers at the smallest or largest depth that are not the read-out (DCA's q, k and v views
    of one input are three rows; a stack's padding rows, depth -1, are none).
    """
    depth = trace["layer_depth"]
    sub = (trace["layer_kind"] != READOUT) & (depth >= 0)
    at = depth.where(sub).min("layer") if end == "first" else depth.where(sub).max("layer")
    return sub & (depth == at)


GROWTH = "how much the stream's magnitude grew; a growing stream makes each new write a smaller part of it"


def norm_growth(trace: xr.Dataset) -> xr.DataArray:
    """Residual norm growth per consumer: the RMS of its input over the trace's tokens,
    ``input_rms[l] = sqrt(sum_tokens |h_l|^2 / (tokens * d_model))``, over that of the first
    sublayer input (which is exactly 1; DCA's q/k/v views of that input: over their mean RMS).

    Every consumer of a trace is measured on the same tokens and width, so this is exactly
    ``sqrt(sum_tokens |h_l|^2 / sum_tokens |h_first|^2)``: how much the stream's magnitude grew,
    beside the shares (``dilution_index``: how much of the input each write still makes up). An
    RMS over tokens (a quadratic mean: high-norm tokens weigh more, as in the shares). NaN where
    the trace (or a model of a stack) lacks ``input_rms`` or the first input's RMS is not > 0.
    Reduced by dimension name: a stack's models each against their own first input.
    """
    if "input_rms" not in trace:
        out = xr.full_like(trace["layer_depth"], np.nan, dtype=float)
    else:
        rms = trace["input_rms"]
        first = rms.where(_input_at(trace, "first")).mean("layer")  # one row: its own value, exactly
        out = (rms / first).where(first > 0)
    out.name = "norm_growth"
    long_name = f"residual norm growth: input RMS over the first sublayer input's ({GROWTH})"
    out.attrs = {"long_name": long_name, "units": "1"}
    return out


def norm_growth_ratio(trace: xr.Dataset) -> xr.DataArray:
    """The residual stream's norm growth, last over first: ``norm_growth`` at the last sublayer
    input (the last block's last sublayer, ``7.mlp`` of 8 blocks), the RMS of that input over the
    first sublayer input's (``0.attn``'s, the embedding in a pre-norm residual); NaN where the
    trace lacks ``input_rms``. A scalar (per model, for a stack).

    The survey's "last-layer over first-layer residual norm", read at the inputs of the
    transformer's own layers, not at the read-out's: a multi-stream scheme's read-out (HC, mHC)
    sums its n streams, so its RMS is n times a stream's by construction.
    """
    out = norm_growth(trace).where(_input_at(trace, "last")).mean("layer")
    out.name = "norm_growth_ratio"
    long_name = f"residual norm growth: the last sublayer input's RMS over the first's ({GROWTH})"
    out.attrs = {"long_name": long_name, "units": "1"}
    return out


def _input_label(trace: xr.Dataset, end: str) -> str:
    """The label of one trace's ``first`` or ``last`` sublayer input (views: ``1.attn``)."""
    rows = [str(x) for x in trace["layer"].values[_input_at(trace, end).values]]
    return rows[0] if len(rows) == 1 else rows[0].rsplit(".", 1)[0] if rows else ""


SHARES = ("embed", "first", "latest")  # the sources ``share_of`` follows


def dilution_curves(trace: xr.Dataset) -> xr.Dataset:
    """Per consumer depth (``by_depth``): ``embed_share``, ``first_share`` and ``latest_share``
    (``share_of``), the 1/T ``baseline`` and ``norm_growth``, with ``norm_growth_ratio`` (a
    scalar per model), for a trace or each model of a stack.
    """

    def one(t: xr.Dataset) -> xr.Dataset:
        curves = {f"{which}_share": by_depth(share_of(t, which)) for which in SHARES}
        growth = {"norm_growth": by_depth(norm_growth(t)), "norm_growth_ratio": norm_growth_ratio(t)}
        return xr.Dataset({**curves, "baseline": by_depth(baseline(t)), **growth})

    return per_model(trace, one)


def pattern_curves(trace: xr.Dataset, k: int = 2) -> xr.Dataset:
    """Per consumer depth: ``pattern_score`` (``by_depth``), with ``mean_pattern_score``, its
    mean over the sublayer inputs (``summary``'s), for a trace or each model of a stack.
    """

    def one(t: xr.Dataset) -> xr.Dataset:
        mean = summary(t, k)["pattern_score"].sel(group="sublayers", drop=True)
        data = {"pattern_score": by_depth(pattern_score(t, k)), "mean_pattern_score": mean}
        return xr.Dataset(data, attrs={"k": k})

    return per_model(trace, one)


def consumer_table(trace: xr.Dataset, k: int = 2) -> xr.Dataset:
    """Per consumer: available sources, 1/T, shares of embedding, first and latest source, their
    dilution indices, the pattern score and the residual ``norm_growth``.
    """
    n = n_available(trace)
    table = xr.Dataset(
        {
            "n_sources": n,
            "baseline": baseline(trace),
            "embed_share": share_of(trace, "embed"),
            "first_share": share_of(trace, "first"),
            "latest_share": share_of(trace, "latest"),
            "pattern_score": pattern_score(trace, k),
            "norm_growth": norm_growth(trace),
            "residual_error": trace["residual_error"],
        }
    )
    # each index against its own uniform share: the embedding group of k sources holds k / n_l
    group = (trace["mixing"].notnull() & (trace["source_kind"] == EMBED)).sum("source")
    for which, k in (("embed", group), ("first", 1), ("latest", 1)):
        table[f"{which}_index"] = table[f"{which}_share"] * n / k
        what = "the embedding group (its share over k/n)" if which == "embed" else f"the {which} source"
        table[f"{which}_index"].attrs.update(
            long_name=f"dilution index of {what}: how much of the input it still makes up, over 1/n",
            units="1",
        )
    return table


def sources_at(trace: xr.Dataset, layer: str = READOUT) -> xr.Dataset:
    """One consumer's sources: each one's ``share``, its ``index`` (share over the uniform 1/n_l,
    n_l the sources available there) and ``weight`` (M), the sources it cannot read left out.
    """
    row = trace.sel(layer=layer)
    avail = row["mixing"].notnull()
    n = int(avail.sum())
    share = row["contribution_share"].where(avail, drop=True)
    out = xr.Dataset({"share": share, "index": share * n, "weight": row["mixing"].where(avail, drop=True)})
    return out.assign_attrs(layer=str(layer), n_sources=n)


def findings(trace: xr.Dataset, layer: str | None = None) -> dict[str, object]:
    """What one consumer's shares say (the read-out by default, the last consumer in a trace cut
    before it): how many sublayer writes sit
    below the uniform 1/T share there and how many pull against the input (a negative share), the
    most and least diluted of them (the smallest and largest |index|), the embedding group's
    share and index (against its own k/n), and beside them the stream's ``norm_growth_ratio``
    (its last and first sublayer inputs: ``norm_growth_to``, ``norm_growth_from``).
    """
    if layer is None:
        layers = [str(x) for x in trace["layer"].values]
        if not layers:
            raise TraceError("the trace has no consumers: nothing to read dilution from")
        layer = READOUT if READOUT in layers else layers[-1]
    view = sources_at(trace, layer)
    writes = view.where(view["source_kind"] != EMBED, drop=True)
    embeds = view.where(view["source_kind"] == EMBED, drop=True)
    n, k = view.attrs["n_sources"], int(embeds.sizes["source"])
    index = writes["index"]
    below = int((index < 1).sum())
    size = np.abs(index.values)
    most, least = (str(index["source"].values[f(size)]) if index.size else "" for f in (np.argmin, np.argmax))
    embed_share = float(embeds["share"].sum()) if k else float("nan")
    return {
        "layer": str(layer),
        "n_sources": n,
        "writes": int(index.size),
        "below": below,
        "negative": int((index < 0).sum()),
        "most_diluted": most,
        "most_diluted_index": float(index.sel(source=most)) if most else float("nan"),
        "least_diluted": least,
        "least_diluted_index": float(index.sel(source=least)) if least else float("nan"),
        "embed_sources": k,
        "embed_share": embed_share,
        "embed_index": embed_share / (k / n) if k else float("nan"),
        "norm_growth_ratio": float(norm_growth_ratio(trace)),
        "norm_growth_from": _input_label(trace, "first"),
        "norm_growth_to": _input_label(trace, "last"),
    }


def unit_weights(trace: xr.Dataset) -> bool:
    """Whether every available weight is exactly 1 at every token (a standard residual read as it
    is): its pattern score is then 1 by construction, no finding.
    """
    m = trace["mixing"].values
    spread = trace["mixing_std"].values if "mixing_std" in trace else np.zeros_like(m)
    avail = np.isfinite(m)
    return bool(avail.any() and (m[avail] == 1.0).all() and (spread[avail] == 0.0).all())


# The consumer groups a summary reports separately (the papers do: AttnRes Fig. 8 draws
# pre-attention and pre-MLP inputs apart), "sublayers" being every sublayer input together; a
# hybrid's state-space / convolution / linear-attention mixers are a group like attention and MLP
GROUPS = ("sublayers", ATTN, MLP, SSM, SWA, READOUT)
SUMMARISED = (
    "pattern_score",
    "embed_share",
    "first_share",
    "latest_share",
    "embed_index",
    "first_index",
    "latest_index",
)


def per_input(table: xr.Dataset) -> xr.Dataset:
    """One row per sublayer input: rows that share a depth (DCA's q, k and v views of one
    attention input) are averaged, so a summary weighs that input once, like any other.
    """
    depth = table["layer_depth"].values
    if len(np.unique(depth)) == len(depth):
        return table
    keep = [i for i in range(len(depth)) if i == 0 or depth[i] != depth[i - 1]]
    means = table.groupby("layer_depth").mean()
    out = table.isel(layer=keep)
    for name in table.data_vars:
        out[name] = ("layer", means[name].sel(layer_depth=depth[keep]).values)
        out[name].attrs = table[name].attrs
    return out


def summary(trace: xr.Dataset, k: int = 2) -> xr.Dataset:
    """Per-model summary along a ``group`` dimension (sublayers, attn, mlp, ssm, swa, readout).

    Each variable of ``SUMMARISED`` is its mean over the sublayer inputs of a group, DCA's three
    views of one attention input averaged first (``per_input``); pattern scores and dilution
    indices over the inputs that have more than the k + 1 pattern sources. The read-out group is
    the read-out's own value (what the logits see). ``max_residual_error`` over every consumer.
    A stack is summarised model by model, its per-model coordinates kept (a trajectory's
    ``step``, ``train_tokens``, ``val_loss``: the table its figures draw).
    """
    if STACK in trace.dims:
        return per_model(trace, lambda one: summary(one, k))
    t = per_input(consumer_table(trace, k))
    kinds = t["layer_kind"]
    masks = {"sublayers": kinds != READOUT, **{g: kinds == g for g in GROUPS[1:]}}
    keep = t["pattern_score"].notnull()
    data = {}
    for name in SUMMARISED:
        cols = []
        for g in GROUPS:
            m = masks[g] if g == READOUT or name.endswith("_share") else masks[g] & keep
            cols.append(t[name].where(m).mean("layer"))
        data[name] = xr.concat(
            cols, dim=xr.DataArray(np.array(GROUPS, dtype=object), dims="group", name="group")
        )
        data[name].attrs = dict(t[name].attrs)
    out = xr.Dataset(data)
    out["max_residual_error"] = t["residual_error"].max("layer")
    out["max_residual_error"].attrs.update(long_name="largest residual error", units="1")
    out["norm_growth_ratio"] = norm_growth_ratio(trace)
    out["pattern_score"].attrs.update(long_name=f"mean pattern score (k={k})")
    return out.assign_attrs(k=k, label=str(trace.attrs.get("label", "")))


def block_view(trace: xr.Dataset) -> xr.Dataset:
    """The trace at block level, for deep models (a 30-block LM has 61 x 61 cells).

    Sources of one block (its attention and MLP outputs, a post-LN model's biases) are summed,
    consumers of one block (its sublayer inputs, DCA's views) averaged: ``contribution_share``
    still sums to 1 over a row, ``mixing_abs`` is the block's total |M|, ``mixing`` the block's
    total M. ``row_normalized`` (each sublayer consumer's row-normalised |M|, then summed and
    averaged the same way) and ``uniform_share`` (1/n_l on every available cell, the same) are
    kept, so a block of k sources reads k/n_l in a standard residual, not 1/n_l: the embedding,
    one source, reads half a two-sublayer block, and a block's own cell holds only its attention
    output, which its MLP input alone reads. ``dilution_index`` of the view divides by
    ``uniform_share``, so 1 is the uniform share at either level.
    """
    if STACK in trace.dims:
        return stack_traces([block_view(t).assign_attrs(t.attrs) for t in split_models(trace)])
    trace = with_blocks(trace)  # traces built by hand may lack the block coordinates
    src_block = [str(b) for b in trace["source_block"].values]
    row_block = [str(b) for b in trace["layer_block"].values]
    by_source = xr.DataArray(src_block, dims="source", name="source_block")
    by_row = xr.DataArray(row_block, dims="layer", name="layer_block")
    # a block's consumers are averaged with 0 where one of them cannot read a source yet (its own
    # block's attention output, for the block's attention input), so every row still sums to 1
    trace = trace.drop_vars(["layer_block", "source_block"])
    seen = trace["mixing"].notnull().groupby(by_source).any().groupby(by_row).any()
    data = {}
    per_sublayer = {
        "mixing": trace["mixing"],
        "mixing_abs": magnitude(trace),
        "contribution_share": trace["contribution_share"],
        "row_normalized": row_normalized(trace),
        "uniform_share": uniform_share(trace),
    }
    for name, da in per_sublayer.items():
        summed = da.fillna(0.0).groupby(by_source).sum()
        data[name] = summed.groupby(by_row).mean().where(seen)
    out = xr.Dataset(data).rename(source_block="source", layer_block="layer")
    order_s = list(dict.fromkeys(src_block))
    order_l = list(dict.fromkeys(row_block))
    out = out.sel(source=order_s, layer=order_l)
    depth = {b: i for i, b in enumerate(order_s)}
    out = out.assign_coords(
        source_depth=("source", np.arange(len(order_s))),
        source_kind=("source", np.array([_block_kind(b) for b in order_s], dtype=object)),
        layer_depth=("layer", np.array([len(order_s) if b == READOUT else depth[b] + 1 for b in order_l])),
        layer_kind=("layer", np.array([_block_kind(b) for b in order_l], dtype=object)),
    )
    for name in data:
        attrs = per_sublayer[name].attrs
        out[name].attrs = {**attrs, "long_name": f"{attrs.get('long_name', name)}, per block"}
    return out.assign_attrs(trace.attrs)


def _block_kind(block: str) -> str:
    return block if block in (EMBED, READOUT) else BLOCK
