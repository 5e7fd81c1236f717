"""Choosing consumers and sources to show, and the quantity a figure draws of a trace.

A selection is a list of items (or one comma-separated string, as the command line gives it):

* a label: ``3.attn``, ``embed``, ``readout``, ``0.attn.q``;
* a kind: ``attn``, ``mlp``, ``embed``, ``readout``, ``bias``, ``block`` ...;
* a block: ``7`` (every consumer or source of block 7), or a range of blocks ``2-5`` (inclusive).

Items are united, and the trace's order kept; an item that matches nothing is a mistake.

``quantity`` gives one of the figure quantities of a trace (``QUANTITIES``), each with a short
colour-bar label; the formula goes in ``caption``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import xarray as xr

from depthscope.analysis.dilution import block_view, dilution_index, row_normalized
from depthscope.errors import DepthscopeError
from depthscope.trace.labels import block_of

# name -> (short colour-bar label, caption: what it is, by formula)
QUANTITIES = {
    "weights": ("row-normalised weight", "|M[l, s]| / sum_s |M[l, s]|: a standard residual reads 1/n_l"),
    "mixing": (
        "weight M[l, s]",
        "the token-mean effective coefficient M[l, s] of source s in consumer l's input",
    ),
    "share": ("contribution share", "<c[l, s], h_l> / |h_l|^2 over tokens: each row sums to 1"),
    "departure": (
        "share x n_l",
        "contribution share times the number of sources available: 1 is the uniform 1/T share",
    ),
}


# the same quantities in ``block_view`` (--blocks): what a block cell is, and what a uniform row reads
BLOCK_CAPTIONS = {
    "weights": "per block, each sublayer consumer's |M[l, s]| / sum_s |M[l, s]| summed over the block's "
    "sources and averaged over its consumers: a standard residual reads k/n_l for a block of k sources, "
    "so the embedding (one source) reads half a two-sublayer block, and a block's own cell holds only its "
    "attention output, which its MLP input alone reads",
    "mixing": "per block, M[l, s] summed over the block's sources and averaged over its consumers",
    "share": "per block, contribution shares summed over the block's sources and averaged over its "
    "consumers: each row sums to 1",
    "departure": "per block, the block's contribution share over its uniform share (k/n_l for a block of "
    "k sources, averaged over the consumers as the shares are): 1 is the uniform 1/T share",
}
# quantities whose rows sum to 1 over all sources: a subset of sources sums to less
ROW_SUMS = ("weights", "share")


def caption(name: str, *, blocks: bool = False, sources: str | Sequence[str] | None = None) -> str:
    """The formula of quantity ``name`` as a figure's caption, for the view and the sources drawn."""
    text = BLOCK_CAPTIONS[name] if blocks else QUANTITIES[name][1]
    if items(sources) and name in ROW_SUMS:
        text += "; only the sources selected are drawn, so a row here sums to less than 1"
    return text


def items(selection: str | Sequence[str] | None) -> list[str]:
    """A selection as a list of items (a comma-separated string split); None for all."""
    if selection is None:
        return []
    parts = selection.split(",") if isinstance(selection, str) else list(selection)
    return [str(p).strip() for p in parts if str(p).strip()]


def _matches(item: str, label: str, kind: str) -> bool:
    if item in (label, kind):
        return True
    block = block_of(label)
    span = re.fullmatch(r"(\d+)-(\d+)", item)
    if span:
        return block.isdigit() and int(span.group(1)) <= int(block) <= int(span.group(2))
    return item.isdigit() and block == item


def pick(da: xr.DataArray | xr.Dataset, dim: str, selection: str | Sequence[str] | None):
    """``da`` with only the ``dim`` entries (``layer`` or ``source``) the selection names."""
    wanted = items(selection)
    if not wanted:
        return da
    labels = [str(v) for v in da[dim].values]
    kind_name = f"{dim}_kind" if f"{dim}_kind" in da.coords else None
    kinds = [str(v) for v in da[kind_name].values] if kind_name else [""] * len(labels)
    keep = []
    for item in wanted:
        hit = [i for i, (lab, k) in enumerate(zip(labels, kinds)) if _matches(item, lab, k)]
        if not hit:
            what = "consumer" if dim == "layer" else "source"
            raise DepthscopeError(
                f"no {what} is {item!r} (labels such as {', '.join(labels[:4])}; kinds: "
                f"{', '.join(dict.fromkeys(kinds))}; blocks: 3 or 2-5)"
            )
        keep += hit
    return da.isel({dim: sorted(set(keep))})


def quantity(trace: xr.Dataset, name: str, *, blocks: bool = False) -> xr.DataArray:
    """The figure quantity ``name`` (``QUANTITIES``) of one trace, per block with ``blocks``."""
    if name not in QUANTITIES:
        raise DepthscopeError(f"unknown quantity {name!r} (one of {', '.join(QUANTITIES)})")
    view = block_view(trace) if blocks else trace
    if name == "weights":
        da = row_normalized(view)
    elif name == "mixing":
        da = view["mixing"]
    elif name == "share":
        da = view["contribution_share"]
    else:
        da = dilution_index(view)
    out = da.copy()
    out.attrs = {
        "long_name": QUANTITIES[name][0],
        "units": "1",
        "caption": caption(name, blocks=blocks),
        "label": trace.attrs.get("label", ""),
    }
    return out
