"""The trace: streaming accumulation of depth-mixing statistics, and the labelled Dataset.

A trace (format version 2, see DESIGN.md "The trace") is an xarray.Dataset with dims ``layer``
(consumers, in execution order, then the read-out) and ``source`` (embedding, then sublayer
outputs). It is built from per-batch sums held in float64, so capturing many small batches gives
the same trace as one large batch and memory does not grow with the number of tokens.

With c[l, s] the part of consumer l's input that comes from source s (weights[l, s] * v_s for
every weight-based family) and h_l = sum_s c[l, s]:

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
norm can be 100x the others') weigh more than the rest; the capture's ``skip_positions`` leaves
the first positions out of every statistic.

Several traces stack along a ``model`` dimension (``stack_traces``): one entry per analysed
model, labelled by its trace's ``label``; what was an attr of one trace (``scheme``, ``variant``,
``checkpoint``, ``config``, ``step`` ...) becomes a coordinate along ``model``, and
``select_model`` gives one trace back. Format 1 (which stacked along ``scheme``) is converted on
load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from depthscope.atomic import atomic_path
from depthscope.errors import TraceError
from depthscope.schemes.names import READOUT

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


@dataclass
class Accumulator:
    """Float64 sums over tokens, one consumer or source at a time."""

    layout: Layout
    covariance: bool = False  # also keep each source's covariance over tokens (d x d per source)
    tokens: int = 0
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    native: dict[str, tuple[tuple[str, ...], dict[int, np.ndarray]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n_l, n_s = len(self.layout.layer), len(self.layout.source)
        for name in ("mix", "mix_abs", "mix_sq", "dot", "cnorm"):
            self.sums[name] = np.zeros((n_l, n_s))
        for name in ("hh", "ctotal", "err", "in_sq", "first_sq", "full_sq"):
            self.sums[name] = np.zeros(n_l)
        self.sums["src_sq"] = np.zeros(n_s)
        self.seen = np.zeros(n_l, dtype=np.int64)  # tokens folded into each consumer's mean
        self.cov: dict[int, list] = {}  # source -> [tokens, mean (d,), M2 (d, d)], float64
        self.d_model = 0
        self._mark: dict[str, np.ndarray] = {}

    def add_tokens(self, n: int) -> None:
        self.tokens += n

    def start_batch(self) -> None:
        """Remember the sums so far: ``batch_error`` and ``batch_folded`` describe what comes next."""
        self._mark = {
            "err": self.sums["err"].copy(),
            "in_sq": self.sums["in_sq"].copy(),
            "seen": self.seen.copy(),
        }

    def batch_error(self) -> np.ndarray:
        """Relative residual error of each consumer over the tokens folded since ``start_batch``."""
        err = self.sums["err"] - self._mark["err"]
        in_sq = self.sums["in_sq"] - self._mark["in_sq"]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sqrt(
                np.where(in_sq > 0, err / np.where(in_sq > 0, in_sq, 1.0), np.where(err > 0, np.inf, 0.0))
            )

    def batch_folded(self) -> np.ndarray:
        """Boolean per consumer: folded since ``start_batch``."""
        return self.seen > self._mark["seen"]

    @torch.no_grad()
    def source(self, j: int, v: Tensor) -> Tensor:
        """Source j's output for this batch [batch, pos, d_model]; returns its per-token norms."""
        self.d_model = v.shape[-1]
        norms = v.norm(dim=-1)
        self.sums["src_sq"][j] += float(norms.pow(2).sum())
        if self.covariance:
            self._fold_cov(j, v.flatten(0, -2))
        return norms

    @torch.no_grad()
    def positions(self, i: int, h: Tensor) -> None:
        """Consumer i's whole input [batch, pos, d] (skipped positions included): how much of its
        squared norm sits at the first position of the windows (an attention sink shows here).
        """
        self.sums["first_sq"][i] += float(h[:, 0].double().pow(2).sum())
        self.sums["full_sq"][i] += float(h.double().pow(2).sum())

    def _fold_cov(self, j: int, x: Tensor) -> None:
        """Merge a batch [tokens, d] into source j's running mean and scatter matrix (Chan et al.)."""
        mean_b = x.double().mean(0)
        centred = x - mean_b.to(x.dtype)
        m2_b = (centred.T @ centred).double()
        part = [x.shape[0], mean_b.cpu(), m2_b.cpu()]
        self.cov[j] = part if j not in self.cov else _chan(self.cov[j], part)

    def spectra(self) -> np.ndarray:
        """Eigenvalues of each source's covariance over tokens, descending: [source, component]."""
        out = np.full((len(self.layout.source), self.d_model), np.nan)
        for j, (n, _, m2) in self.cov.items():
            out[j] = np.linalg.eigvalsh((m2 / max(n - 1, 1)).numpy())[::-1].clip(min=0.0)
        return out

    @torch.no_grad()
    def consumer(self, i: int, h: Tensor, weights: Tensor, values: Tensor, norms: Tensor) -> None:
        """Consumer i now: input h [b, p, d], weights [b, p, n(, d)], source values [b, p, S, d]
        and their per-token norms [b, p, S] (only the first n sources are used).
        """
        n = weights.shape[2]
        v = values[:, :, :n]
        if weights.ndim == 3:
            rebuilt = torch.einsum("bps,bpsd->bpd", weights, v)
            dots = weights * (v * rebuilt.unsqueeze(2)).sum(-1)  # [batch, pos, source]
            cn = (weights.abs() * norms[:, :, :n]).sum((0, 1))
            per_token = weights
        else:  # per-feature weights: contributions are built, one sequence at a time (cache-sized)
            dots = weights.new_zeros(n)
            cn = weights.new_zeros(n)
            hh = err = 0.0
            for b in range(weights.shape[0]):
                c = weights[b] * v[b]  # [pos, source, d_model]
                rebuilt = c.sum(1)
                dots += (c * rebuilt.unsqueeze(1)).sum((0, 2))
                cn += c.norm(dim=-1).sum(0)
                hh += float(rebuilt.pow(2).sum())
                err += float((h[b] - rebuilt).pow(2).sum())
            self._fold_weights(i, weights.mean(-1), weights.abs().mean(-1))
            self._fold(i, dots, hh, cn, err, h.pow(2).sum())
            return
        self._fold_weights(i, per_token, per_token.abs())
        self._fold(i, dots.sum((0, 1)), rebuilt.pow(2).sum(), cn, (h - rebuilt).pow(2).sum(), h.pow(2).sum())

    @torch.no_grad()
    def consumer_terms(self, i: int, h: Tensor, terms: Tensor, mixing: Tensor) -> None:
        """Consumer i from its terms c[l, s] directly: input h [b, p, d], terms [b, p, n, d] with
        h = sum_s terms[:, :, s] (to rounding), and per-token mixing coefficients [b, p, n] (what
        ``mixing`` reports: for a post-LN model, the accumulated 1/sigma of each term).
        """
        n = terms.shape[2]
        dots = terms.new_zeros(n, dtype=torch.float64)
        cn = terms.new_zeros(n, dtype=torch.float64)
        hh = err = 0.0
        for b in range(terms.shape[0]):  # one sequence at a time: cache-sized
            c = terms[b]  # [pos, source, d_model]
            rebuilt = c.sum(1)
            dots += (c * rebuilt.unsqueeze(1)).sum((0, 2)).double()
            cn += c.norm(dim=-1).sum(0).double()
            hh += float(rebuilt.double().pow(2).sum())
            err += float((h[b] - rebuilt).double().pow(2).sum())
        self._fold_weights(i, mixing, mixing.abs())
        self._fold(i, dots, hh, cn, err, h.double().pow(2).sum())

    @torch.no_grad()
    def consumers(
        self, items: list[tuple[int, Tensor, Tensor]], values: Tensor, norms: Tensor, chunk: int = 256
    ) -> None:
        """Consumers with per-token scalar weights, all at once at the end of a batch.

        ``items`` holds (i, h [b, p, d], weights [b, p, n]). Tokens are walked in chunks small
        enough for the chunk of source values to stay in cache while every consumer reads it, so
        the values are streamed from memory once instead of twice per consumer. Never builds the
        [b, p, n, d] contributions: with g_s = <v_s, h>, <c_s, h> = w_s g_s and |c_s| = |w_s| |v_s|.
        """
        if not items:
            return
        v_all = values.flatten(0, 1)  # [tokens, source, d_model]
        flat = [(i, h.flatten(0, 1), w.flatten(0, 1)) for i, h, w in items]
        parts = {i: [w.new_zeros(w.shape[-1]), 0.0, 0.0] for i, _, w in flat}
        for t0 in range(0, v_all.shape[0], chunk):
            v_c = v_all[t0 : t0 + chunk]
            for i, h, w in flat:
                n = w.shape[-1]
                w_c, v = w[t0 : t0 + chunk], v_c[:, :n]
                # (bmm for the weighted sum, multiply-and-sum for the dots: the faster of the two
                # forms for these tiny per-token products on CPU, measured)
                rebuilt = torch.bmm(w_c.unsqueeze(1), v).squeeze(1)  # [tokens, d_model]
                g = (v * rebuilt.unsqueeze(1)).sum(-1)  # [tokens, source]
                acc = parts[i]
                acc[0] += (w_c * g).sum(0)
                acc[1] += float(rebuilt.pow(2).sum())
                acc[2] += float((h[t0 : t0 + chunk] - rebuilt).pow(2).sum())
        n_flat = norms.flatten(0, 1)
        for i, h, w in flat:
            dots, hh, err = parts[i]
            w_abs = w.abs()
            self._fold_weights(i, w, w_abs)
            self._fold(i, dots, hh, (w_abs * n_flat[:, : w.shape[-1]]).sum(0), err, h.pow(2).sum())

    def _fold_weights(self, i: int, per_token: Tensor, per_token_abs: Tensor) -> None:
        """Merge this batch's per-token weights (and magnitudes) into the running means and the
        spread (Chan et al.), so the spread has no E[w^2] - E[w]^2 cancellation.
        """
        s = self.sums
        w64 = per_token.double().flatten(0, -2)  # [tokens, source]
        n = w64.shape[-1]
        m_b = w64.mean(0).cpu().numpy()
        m2_b = (w64 - w64.mean(0)).pow(2).sum(0).cpu().numpy()
        n_a, n_b = self.seen[i], w64.shape[0]
        delta = m_b - s["mix"][i, :n]
        s["mix"][i, :n] += delta * n_b / (n_a + n_b)
        s["mix_sq"][i, :n] += m2_b + delta**2 * n_a * n_b / (n_a + n_b)
        abs_b = per_token_abs.double().flatten(0, -2).mean(0).cpu().numpy()
        s["mix_abs"][i, :n] += (abs_b - s["mix_abs"][i, :n]) * n_b / (n_a + n_b)
        self.seen[i] += n_b

    def _fold(self, i: int, dots: Tensor, hh, cnorm: Tensor, err, in_sq) -> None:
        s = self.sums
        n = dots.shape[0]
        s["dot"][i, :n] += dots.double().cpu().numpy()
        s["hh"][i] += float(hh)
        cn = cnorm.double().cpu().numpy()
        s["cnorm"][i, :n] += cn
        s["ctotal"][i] += cn.sum()
        s["err"][i] += float(err)
        s["in_sq"][i] += float(in_sq)

    # ---- state: what a capture has summed so far, for checkpoints and for merging shards ----

    MEANS = ("mix", "mix_abs")  # running means over ``seen`` tokens; ``mix_sq`` is their M2

    def state(self) -> dict[str, np.ndarray]:
        """Everything summed so far as plain float64/int64 arrays (a checkpoint, or a shard to merge)."""
        out = {f"sums.{k}": v.copy() for k, v in self.sums.items()}
        out["seen"] = self.seen.copy()
        out["tokens"] = np.array(self.tokens, dtype=np.int64)
        out["d_model"] = np.array(self.d_model, dtype=np.int64)
        if self.covariance:
            n_s, d = len(self.layout.source), self.d_model
            out["cov.n"] = np.zeros(n_s, dtype=np.int64)
            out["cov.mean"] = np.zeros((n_s, d))
            out["cov.m2"] = np.zeros((n_s, d, d))
            for j, (n, mean, m2) in self.cov.items():
                out["cov.n"][j], out["cov.mean"][j], out["cov.m2"][j] = n, mean.numpy(), m2.numpy()
        for name, (dims, store) in self.native.items():
            shape = next(iter(store.values())).shape
            arr = np.full((len(self.layout.layer), *shape), np.nan)
            for i, total in store.items():
                arr[i] = total
            out[f"native.{name}.{','.join(dims)}"] = arr
        return out

    @classmethod
    def from_state(cls, layout: Layout, state: dict[str, np.ndarray]) -> Accumulator:
        acc = cls(layout, covariance="cov.n" in state)
        acc.merge(state)
        return acc

    def merge(self, state: dict[str, np.ndarray]) -> None:
        """Add another accumulator's ``state`` (tokens that come after this one's) into this one.

        Sums add; the weight means and their M2 merge as Chan et al.'s parallel update, per
        consumer, weighted by the tokens each side has seen; covariances the same way per source.
        """
        n_l, n_s = len(self.layout.layer), len(self.layout.source)
        if state["sums.mix"].shape != (n_l, n_s):
            raise TraceError(
                f"cannot merge a capture of {state['sums.mix'].shape} consumers x sources into {(n_l, n_s)}"
            )
        n_a, n_b = self.seen.astype(np.float64), state["seen"].astype(np.float64)
        n = np.maximum(n_a + n_b, 1.0)[:, None]
        s = self.sums
        delta = state["sums.mix"] - s["mix"]
        s["mix_sq"] += state["sums.mix_sq"] + delta**2 * (n_a * n_b)[:, None] / n
        for key in self.MEANS:
            s[key] += (state[f"sums.{key}"] - s[key]) * n_b[:, None] / n
        for key, value in state.items():
            if key.startswith("sums.") and key[5:] not in (*self.MEANS, "mix_sq"):
                s[key[5:]] += value
        self.seen += state["seen"]
        self.tokens += int(state["tokens"])
        self.d_model = max(self.d_model, int(state["d_model"]))
        if "cov.n" in state:
            self.covariance = True
            for j in np.flatnonzero(state["cov.n"]):
                other = [
                    int(state["cov.n"][j]),
                    torch.from_numpy(state["cov.mean"][j].copy()),
                    torch.from_numpy(state["cov.m2"][j].copy()),
                ]
                self.cov[int(j)] = other if int(j) not in self.cov else _chan(self.cov[int(j)], other)
        for key, arr in state.items():
            if key.startswith("native."):
                name, dims = key[7:].rsplit(".", 1)
                _, store = self.native.setdefault(name, (tuple(dims.split(",")) if dims else (), {}))
                for i in range(arr.shape[0]):
                    if not np.isnan(arr[i]).all():
                        store[i] = store[i] + arr[i] if i in store else arr[i].copy()

    @torch.no_grad()
    def native_mean(self, name: str, dims: tuple[str, ...], i: int, x: Tensor) -> None:
        """Token sum of a native per-token quantity [batch, pos, *dims] for consumer i."""
        _, store = self.native.setdefault(name, (dims, {}))
        total = x.double().sum((0, 1)).cpu().numpy()
        store[i] = store[i] + total if i in store else total

    def dataset(self, attrs: dict) -> xr.Dataset:
        """The trace Dataset (NaN on unavailable cells)."""
        lay, s, n = self.layout, self.sums, max(self.tokens, 1)
        avail = lay.available
        nan = np.where(avail, 1.0, np.nan)
        mix = s["mix"]  # running mean over tokens
        std = np.sqrt(s["mix_sq"] / np.maximum(self.seen, 1)[:, None])
        with np.errstate(invalid="ignore", divide="ignore"):
            share = s["dot"] / s["hh"][:, None]
            nshare = s["cnorm"] / s["ctotal"][:, None]
            err = np.where(
                s["in_sq"] > 0, np.sqrt(s["err"] / s["in_sq"]), np.where(s["err"] > 0, np.inf, 0.0)
            )
        d = max(self.d_model, 1)
        data = {
            "mixing": (("layer", "source"), mix * nan),
            "mixing_abs": (("layer", "source"), s["mix_abs"] * nan),
            "mixing_std": (("layer", "source"), std * nan),
            "contribution_share": (("layer", "source"), share * nan),
            "norm_share": (("layer", "source"), nshare * nan),
            "source_rms": (("source",), np.sqrt(s["src_sq"] / (n * d))),
            "input_rms": (("layer",), np.sqrt(s["in_sq"] / (n * d))),
            "residual_error": (("layer",), err),
            "first_position_share": (
                ("layer",),
                s["first_sq"] / np.where(s["full_sq"] > 0, s["full_sq"], np.nan),
            ),
        }
        coords = {
            "layer": np.array(lay.layer, dtype=object),
            "source": np.array(lay.source, dtype=object),
            "layer_depth": ("layer", np.array(lay.layer_depth, dtype=np.int64)),
            "layer_kind": ("layer", np.array(lay.layer_kind, dtype=object)),
            "source_depth": ("source", np.array(lay.source_depth, dtype=np.int64)),
            "source_kind": ("source", np.array(lay.source_kind, dtype=object)),
        }
        ds = xr.Dataset(
            data, coords=coords, attrs={**attrs, "trace_format": TRACE_FORMAT, "tokens": int(self.tokens)}
        )
        for name, (long_name, units) in VARIABLE_ATTRS.items():
            ds[name].attrs.update(long_name=long_name, units=units)
        if self.covariance:
            ds["source_spectrum"] = (("source", "component"), self.spectra())
            ds["source_spectrum"].attrs.update(
                long_name="eigenvalues of the source's covariance over tokens (descending)", units="1"
            )
        for name, (dims, store) in self.native.items():
            rows = sorted(store)
            arr = np.full((len(lay.layer), *next(iter(store.values())).shape), np.nan)
            for i in rows:
                arr[i] = store[i] / n
            ds[name] = (("layer", *dims), arr)
            ds[name].attrs.update(long_name=f"{name} (token mean, native)", units="1")
        return ds


def _chan(a: list, b: list) -> list:
    """Merge two [tokens, mean, M2] covariance summaries (Chan et al.'s parallel update)."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    delta = mean_b - mean_a
    return [n, mean_a + delta * n_b / n, m2_a + m2_b + torch.outer(delta, delta) * n_a * n_b / n]


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
            trace = ds.load()
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
    return trace


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
    for var, dims in DIMS.items():
        if var not in trace.variables:
            continue
        x = trace[var]
        if set(x.dims) - {STACK} != set(dims):
            raise TraceError(
                f"{name}: {var} has the dimensions ({', '.join(map(str, x.dims))}), a trace's are "
                f"({', '.join(dims)})"
            )
        if not np.issubdtype(x.dtype, np.number):
            raise TraceError(f"{name}: {var} holds {x.dtype} values, not numbers")


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
    return json.dumps(cfg, sort_keys=True) if isinstance(cfg, dict) else cfg.to_json()


def _merge_order(traces: list[xr.Dataset], dim: str) -> list[str]:
    """Labels of ``dim`` over all traces, in an order consistent with every trace's own order.

    A topological merge of the traces' label sequences (each trace is in execution order), ties
    broken by depth and then first appearance; the read-out always closes the order. So a scheme
    with an extra sublayer kind (``0.swa`` before ``0.attn``) interleaves correctly with others.
    """
    first: dict[str, tuple[bool, int, int]] = {}
    after: dict[str, set[str]] = {}
    indegree: dict[str, int] = {}
    for t in traces:
        labels = [str(x) for x in t[dim].values]
        depths = t[f"{dim}_depth"].values
        for i, label in enumerate(labels):
            if label not in first:
                first[label] = (label == READOUT, int(depths[i]), len(first))
                after[label], indegree[label] = set(), 0
        for a, b in zip(labels, labels[1:]):
            if b not in after[a]:
                after[a].add(b)
                indegree[b] += 1
    ready = sorted((k for k, n in indegree.items() if n == 0), key=first.get)
    order = []
    while ready:
        label = ready.pop(0)
        order.append(label)
        for b in after[label]:
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
        ready.sort(key=first.get)
    if len(order) < len(first):  # traces disagree on an order: fall back to depth order
        order = sorted(first, key=first.get)
    return order


def _per_model_coords(traces: list[xr.Dataset], dim: str, labels: list[str]) -> dict[str, tuple]:
    """``{dim}_depth`` and ``{dim}_kind`` as (model, dim) coordinates: -1 / "" where absent."""
    index = {label: i for i, label in enumerate(labels)}
    depth = np.full((len(traces), len(labels)), -1, dtype=np.int64)
    kind = np.full((len(traces), len(labels)), "", dtype=object)
    for k, t in enumerate(traces):
        cols = [index[str(x)] for x in t[dim].values]
        depth[k, cols] = t[f"{dim}_depth"].values
        kind[k, cols] = t[f"{dim}_kind"].values
    return {f"{dim}_depth": ((STACK, dim), depth), f"{dim}_kind": ((STACK, dim), kind)}


def _attr_array(values: list) -> np.ndarray:
    """One per-model attr as a coordinate: integers, floats, or text (missing: -1, NaN, "")."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, (bool, int, np.integer)) and not isinstance(v, bool) for v in present):
        return np.array([-1 if v is None else int(v) for v in values], dtype=np.int64)
    if present and all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in present
    ):
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    return np.array(["" if v is None else str(v) for v in values], dtype=object)


def stack_traces(traces: list[xr.Dataset]) -> xr.Dataset:
    """Concatenate traces along a ``model`` dimension (labels from each trace's ``label``).

    Consumers and sources are the union over traces, in an order consistent with each trace's
    execution order; a trace's missing rows and columns are NaN. Depth and kind coordinates become
    (model, layer) / (model, source) arrays (-1 and "" where a trace lacks the label), and every
    per-trace attr (scheme, variant, config, checkpoint, corpus, tokens, seed, ...) a coordinate
    along ``model``. A stacked trace contributes each of its models. ``select_model`` gives one
    trace back.
    """
    traces = [m for t in traces for m in (split_models(t) if STACK in t.dims else [t])]
    if not traces:
        raise TraceError("no traces to stack")
    # which variables each model has: the stack holds the union, NaN where a model has none
    traces = [t.assign_attrs({VARIABLES: ",".join(sorted(map(str, t.data_vars)))}) for t in traces]
    labels, counts = [], {}
    for t in traces:
        base = str(t.attrs.get("label", t.attrs.get("scheme", "trace")))
        counts[base] = counts.get(base, 0) + 1
        labels.append(base if counts[base] == 1 else f"{base}#{counts[base]}")
    layers, srcs = _merge_order(traces, "layer"), _merge_order(traces, "source")
    coords = {**_per_model_coords(traces, "layer", layers), **_per_model_coords(traces, "source", srcs)}
    variables = {}
    for t in traces:
        for name, var in t.data_vars.items():
            variables.setdefault(name, var)
    padded = _unindexed_sizes(traces)
    aligned = []
    for t in traces:
        t = t.drop_vars([c for c in coords if c in t.coords])
        t = t.reindex(layer=np.array(layers, dtype=object), source=np.array(srcs, dtype=object))
        # dims without labels (``component`` of spectra of different widths, a native quantity's
        # streams) are padded with NaN at the end to the largest size
        t = t.pad({d: (0, n - t.sizes[d]) for d, n in padded.items() if d in t.dims and t.sizes[d] < n})
        for name, var in variables.items():
            if name not in t:
                shape = [t.sizes.get(d, var.sizes[d]) for d in var.dims]
                t[name] = (var.dims, np.full(shape, np.nan))
        aligned.append(t.drop_attrs())
    out = xr.concat(
        aligned, dim=STACK, join="outer", combine_attrs="drop", coords="minimal", compat="override"
    )
    keys = [
        k for k in dict.fromkeys(k for t in traces for k in t.attrs) if k not in GLOBAL_ATTRS and k != "label"
    ]
    per_model = {k: (STACK, _attr_array([t.attrs.get(k) for t in traces])) for k in keys}
    out = out.assign_coords({STACK: np.array(labels, dtype=object), **coords, **per_model})
    for name in variables:
        out[name].attrs = dict(variables[name].attrs)
    return out.assign_attrs(
        trace_format=TRACE_FORMAT, depthscope_version=traces[0].attrs.get("depthscope_version", "")
    )


def _unindexed_sizes(traces: list[xr.Dataset]) -> dict[str, int]:
    """The largest size of every dimension that has no coordinate, over ``traces``."""
    sizes: dict[str, int] = {}
    for t in traces:
        for d, n in t.sizes.items():
            if d not in t.indexes and d not in ("layer", "source"):
                sizes[d] = max(sizes.get(d, 0), n)
    return sizes


def _attr_value(v):
    """A coordinate value back as an attr (the numeric missing markers of ``_attr_array``, -1 and
    NaN, dropped; text comes back as it is, "" included).
    """
    v = v.item() if hasattr(v, "item") else v
    return None if (isinstance(v, int) and v == -1) or (isinstance(v, float) and v != v) else v


def select_model(stacked: xr.Dataset, label: str) -> xr.Dataset:
    """One trace out of a stack, without the padding rows/columns, with its attrs restored."""
    if STACK not in stacked.dims:
        raise TraceError("not a stack of traces (no 'model' dimension)")
    if label not in set(str(m) for m in stacked[STACK].values):
        raise TraceError(
            f"no model {label!r} in the stack (models: {', '.join(map(str, stacked[STACK].values))})"
        )
    t = stacked.sel({STACK: label})
    rows, cols = t["layer_depth"].values >= 0, t["source_depth"].values >= 0  # present in this trace
    t = t.isel(layer=np.flatnonzero(rows), source=np.flatnonzero(cols))
    per_model = [c for c, v in t.coords.items() if v.dims == () and c != STACK]
    attrs = {c: _attr_value(t[c].values) for c in per_model}
    t = t.drop_vars([STACK, *per_model])
    own = attrs.pop(VARIABLES, None)
    if own is not None:  # the variables of other models in the stack: not this model's
        t = t.drop_vars([v for v in t.data_vars if v not in set(str(own).split(","))])
    for d in _unindexed_sizes([t]):  # the padding of a narrower trace: trailing all-NaN entries
        data = [v for v in t.data_vars.values() if d in v.dims]
        present = np.zeros(t.sizes[d], dtype=bool)
        for v in data:
            present |= (
                v.notnull().any([x for x in v.dims if x != d]).values if v.ndim > 1 else v.notnull().values
            )
        keep = int(np.flatnonzero(present)[-1]) + 1 if present.any() else t.sizes[d]
        t = t.isel({d: slice(0, keep)})
    return t.assign_attrs(
        {**stacked.attrs, **{k: v for k, v in attrs.items() if v is not None}, "label": label}
    )


def split_models(trace: xr.Dataset) -> list[xr.Dataset]:
    """The traces of a stack (one per model, in order), or ``[trace]`` for a single trace."""
    if STACK not in trace.dims:
        return [trace]
    return [select_model(trace, str(m)) for m in trace[STACK].values]
