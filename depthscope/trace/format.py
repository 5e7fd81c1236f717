"""The trace format (version 2, docs/design.md "The trace"): variables, dimensions, units, the axes'
layout, and reading, writing and checking a file.

A trace is an ``xarray.Dataset`` with dims ``layer`` (consumers, in execution order, then the
read-out) and ``source`` (embedding, then sublayer outputs). With c[l, s] the part of consumer l's
input that comes from source s and h_l = sum_s c[l, s]:

    mixing[l, s]             = mean over tokens of the per-token weight (feature-mean if per-feature)
    mixing_abs[l, s]         = mean over tokens (and features) of |weight|: the magnitude where
                               signs vary over tokens or features (DCA GRN-v2/v3)
    mixing_std[l, s]         = standard deviation of the weight over tokens
    contribution_share[l, s] = sum_tokens <c[l,s], h_l> / sum_tokens |h_l|^2      (sums to 1 over s)
    norm_share[l, s]         = sum_tokens |c[l,s]| / sum_tokens sum_s' |c[l,s']|   (sums to 1 over s)
    source_rms[s], input_rms[l] = sqrt(sum_tokens |x|^2 / (tokens * d_model))
    residual_error[l]        = sqrt(sum_tokens |hook_in - h_l|^2 / sum_tokens |hook_in|^2)
    first_position_share[l]  = sum_windows |h_l at position 0|^2 / sum_tokens |h_l|^2, over every
                               position (skipped ones too): the weight of an attention sink

The shares are ratios of sums over tokens, so tokens with a large |h_l| (attention sinks, whose
norm can be 100x the others') weigh more than the rest; a capture's ``skip_positions`` leaves the
first positions out of every statistic.

Coordinates: ``layer_depth``/``source_depth`` (sublayer index, embedding 0), ``layer_kind``/
``source_kind`` (``labels.KINDS``) and ``layer_block``/``source_block`` (``labels.block_of``: what
block-level views and figures group by; added on load to files written before they existed).
Format 1 (which stacked along ``scheme``) is converted on load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from depthscope.atomic import atomic_path
from depthscope.errors import DepthscopeError, TraceError
from depthscope.resources import require_memory
from depthscope.trace.labels import block_of

TRACE_FORMAT = 2
STACK = "model"  # the dimension several traces stack along
VARIABLES = "data_variables"  # per-model coordinate of a stack: the variables that model has
GLOBAL_ATTRS = ("trace_format", "depthscope_version")  # attrs of a stack; every other attr is per model

VARIABLE_ATTRS = {
    "mixing": ("effective depth-mixing weight M[l, s] (token mean)", "1"),
    "mixing_abs": ("mean magnitude |M[l, s]| over tokens (and features)", "1"),
    "mixing_std": ("standard deviation of the mixing weight over tokens", "1"),
    "contribution_share": (
        "share of the input: sum <c[l,s], h_l> / sum |h_l|^2 (sums over tokens: high-norm tokens weigh more)",
        "fraction",
    ),
    "norm_share": ("norm share: sum |c[l,s]| / sum_s' |c[l,s']|", "fraction"),
    "source_rms": ("root-mean-square of the source output", "1"),
    "input_rms": ("root-mean-square of the consumer input", "1"),
    "residual_error": ("relative error of rebuilding the input from its sources", "1"),
    "first_position_share": (
        "share of sum |h_l|^2 at the first position of the windows (all positions, skipped ones included)",
        "fraction",
    ),
}
# every trace holds these (load_trace checks them)
REQUIRED = (
    "mixing",
    "mixing_std",
    "contribution_share",
    "norm_share",
    "source_rms",
    "input_rms",
    "residual_error",
)

# the dimensions of every variable and coordinate check_trace looks at (a stack adds ``model``)
DIMS = {
    **{v: ("layer", "source") for v in ("mixing", "mixing_std", "contribution_share", "norm_share")},
    "source_rms": ("source",),
    "input_rms": ("layer",),
    "residual_error": ("layer",),
    "layer_depth": ("layer",),
    "source_depth": ("source",),
    "source_spectrum": ("source", "component"),
    "source_spectrum_half": ("source", "component"),
}


# the causal views' variables (``capture(..., logits=True, ablate=...)``)
CAUSAL_VARIABLE_ATTRS = {
    "logit_attribution": (
        "direct logit attribution of each source (token mean; targets: correct, top1, margin)",
        "logit",
    ),
    "logit_bias": ("the final norm's and unembedding's biases in the logit (token mean)", "logit"),
    "logit_error": ("relative error of the attribution against the actual logits", "1"),
    "lens_loss": (
        "logit lens: cross-entropy of the consumer input decoded by the final norm and unembedding",
        "nats/token",
    ),
    "lens_agreement": ("logit lens: fraction of tokens whose top-1 is the model's final top-1", "fraction"),
    "ablation_effect": (
        "increase in loss when the source is removed from every later consumer's input",
        "nats/token",
    ),
    "ablation_effect_cell": (
        "increase in loss when the source is removed from this consumer's input only",
        "nats/token",
    ),
}


@dataclass(frozen=True)
class Layout:
    """Labels of the trace axes: consumers (rows) and sources (columns)."""

    layer: list[str]
    layer_depth: list[int]
    layer_kind: list[str]
    layer_sources: list[int]  # number of sources available to each consumer
    source: list[str]
    source_depth: list[int]
    source_kind: list[str]

    @property
    def available(self) -> np.ndarray:
        """Boolean [layer, source]: source written before the consumer reads."""
        return np.arange(len(self.source))[None, :] < np.asarray(self.layer_sources)[:, None]


def block_coords(layers, sources) -> dict[str, tuple[str, np.ndarray]]:
    """The ``layer_block`` and ``source_block`` coordinates of these labels (for a Dataset's coords)."""
    return {
        "layer_block": ("layer", np.array([block_of(x) for x in layers], dtype=object)),
        "source_block": ("source", np.array([block_of(x) for x in sources], dtype=object)),
    }


def with_blocks(trace: xr.Dataset) -> xr.Dataset:
    """``trace`` with its ``layer_block`` and ``source_block`` coordinates (from the labels)."""
    return trace.assign_coords(block_coords(trace["layer"].values, trace["source"].values))


def save_trace(trace: xr.Dataset, path: str | Path) -> Path:
    """Write a trace as netCDF, atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        trace.to_netcdf(tmp, engine="netcdf4")
    return path


def load_trace(path: str | Path) -> xr.Dataset:
    """Open a trace written by ``save_trace`` (format 2, or format 1 converted).

    TraceError for a missing, truncated or corrupt file, a netCDF file that is not a trace, a
    trace of another format version, or one missing its dimensions or variables.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    try:
        with xr.open_dataset(path, engine="netcdf4") as ds:
            _check_claims(ds, path)
            trace = ds.load()
    except DepthscopeError:
        raise
    except Exception as err:  # netCDF4/HDF5 raise many types for a corrupt file
        raise TraceError(f"{path}: not a readable netCDF trace ({type(err).__name__})") from None
    version = trace.attrs.get("trace_format")
    if version is None:
        raise TraceError(f"{path}: not a depthscope trace (no trace_format attribute)")
    try:
        version = int(version)
    except (TypeError, ValueError):
        raise TraceError(f"{path}: not a depthscope trace (trace_format {version!r})") from None
    if version == 1:
        trace = from_format_1(trace)
    elif version != TRACE_FORMAT:
        raise TraceError(f"{path}: trace format {version}, this depthscope reads {TRACE_FORMAT} (and 1)")
    check_trace(trace, str(path))
    return with_blocks(_in_contract_order(trace))


def _in_contract_order(trace: xr.Dataset) -> xr.Dataset:
    """Every variable with (layer, source) in that order, whatever order the file stores them in
    (the other dims stay where they are).
    """
    for name, var in trace.data_vars.items():
        dims = list(var.dims)
        if "layer" in dims and "source" in dims and dims.index("layer") > dims.index("source"):
            i, j = dims.index("source"), dims.index("layer")
            dims[i], dims[j] = "layer", "source"
            trace[name] = var.transpose(*dims)
    return trace


def _check_claims(ds: xr.Dataset, path: Path) -> None:
    """Refuse, before loading, a file whose variables claim more memory than it can back (netCDF
    stores never-written data as nothing: a 12 KB file may declare gigabytes) or than is available.
    """
    need = sum(v.size * v.dtype.itemsize for v in ds.variables.values())
    size = path.stat().st_size
    if need > 64 * 2**20 and need > 50 * size:
        raise TraceError(f"{path}: its variables claim {need / 2**30:.2f} GB but the file holds {size} bytes")
    require_memory(need, f"{path}: loading the trace")


def check_trace(trace: xr.Dataset, name: str = "trace") -> None:
    """TraceError unless ``trace`` has the dimensions and variables of a trace."""
    missing = [d for d in ("layer", "source") if d not in trace.dims]
    if missing:
        raise TraceError(f"{name}: not a depthscope trace (no {missing[0]!r} dimension)")
    absent = [v for v in REQUIRED if v not in trace]
    if absent:
        raise TraceError(f"{name}: trace lacks the variable(s) {', '.join(absent)}")
    for coord in ("layer_depth", "layer_kind", "source_depth", "source_kind"):
        if coord not in trace.coords:
            raise TraceError(f"{name}: trace lacks the coordinate {coord!r}")
    if STACK in trace.dims and trace.sizes[STACK] == 0:
        raise TraceError(f"{name}: the stack holds no model")
    _check_axes(trace, name)
    _check_numbers(trace, name)
    for var, dims in DIMS.items():
        if var in trace.variables:
            _check_variable(trace[var], var, dims, name)


def _check_variable(x: xr.DataArray, var: str, dims: tuple[str, ...], name: str) -> None:
    """TraceError unless variable ``var`` has its dimensions and holds numbers (finite where required)."""
    if set(x.dims) - {STACK} != set(dims):
        raise TraceError(
            f"{name}: {var} has the dimensions ({', '.join(map(str, x.dims))}), a trace's are "
            f"({', '.join(dims)})"
        )
    if not np.issubdtype(x.dtype, np.number):
        raise TraceError(f"{name}: {var} holds {x.dtype} values, not numbers")
    if var in REQUIRED and np.isinf(x.values).any():
        raise TraceError(f"{name}: {var} holds infinite values")
    if var in REQUIRED and not np.isfinite(x.values).any():
        raise TraceError(f"{name}: {var} holds no value (only NaN)")


# attrs (or, in a stack, coordinates along ``model``) that readers use as numbers
COUNTS = ("tokens", "seed", "ctx", "skip_positions", "step", "steps", "train_tokens", "world_size")
REALS = ("val_loss", "loss")


def _check_axes(trace: xr.Dataset, name: str) -> None:
    """Both axes have labels, unique and non-empty, and integer depths."""
    for dim, what in (("layer", "consumers"), ("source", "sources")):
        if trace.sizes[dim] == 0:
            raise TraceError(f"{name}: the trace holds no {what} (its {dim!r} dimension is empty)")
        if dim not in trace.indexes:
            raise TraceError(f"{name}: trace lacks the {dim!r} coordinate (the {what}' labels)")
        if not trace.indexes[dim].is_unique:
            raise TraceError(f"{name}: the {what}' labels repeat")
        if not np.issubdtype(trace[f"{dim}_depth"].dtype, np.integer):
            raise TraceError(f"{name}: {dim}_depth holds {trace[f'{dim}_depth'].dtype} values, not integers")


def _check_numbers(trace: xr.Dataset, name: str) -> None:
    """The attrs (or per-model coordinates) readers compute with are numbers."""
    for key in (*COUNTS, *REALS):
        value = trace.coords[key].values if key in trace.coords else trace.attrs.get(key)
        if value is None:
            continue
        arr = np.asarray(value)
        kind = np.integer if key in COUNTS else np.number
        if arr.dtype == bool or not np.issubdtype(arr.dtype, kind):
            raise TraceError(
                f"{name}: {key} {str(value)[:40]!r} is not a {'count' if key in COUNTS else 'number'}"
            )


def from_format_1(trace: xr.Dataset) -> xr.Dataset:
    """A format-1 trace (stacks along ``scheme``; the scheme name in ``scheme_scheme``) as format 2."""
    if "scheme" in trace.dims:
        trace = trace.rename({"scheme": STACK})
        if "scheme_scheme" in trace.coords:
            trace = trace.rename({"scheme_scheme": "scheme"})
    if "mixing_abs" not in trace and "mixing" in trace:  # format 1 kept signed means only
        trace["mixing_abs"] = abs(trace["mixing"])
        trace["mixing_abs"].attrs.update(
            long_name=VARIABLE_ATTRS["mixing_abs"][0] + " (from |mixing|, format 1)", units="1"
        )
    return trace.assign_attrs(trace_format=TRACE_FORMAT, converted_from_format=1)


def config_json(cfg) -> str:
    """A model config as a trace's ``config`` attr: a dict as JSON, sorted keys; else ``cfg.to_json()``."""
    return json.dumps(cfg, sort_keys=True) if isinstance(cfg, dict) else cfg.to_json()
