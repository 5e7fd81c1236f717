"""The engine's accumulator: every trace statistic as sums over tokens, batch by batch, on the device.

The formulas of every variable are in ``depthscope.trace.format``. Legend: T = tokens of the batch
(windows x positions after the skipped ones), S = sources, L = consumers, d = d_model.

One batch: each source's output [T, d] goes into ``V`` [S, T, d], source-major, in the model's
compute dtype (float32 for half-precision models), the one big allocation, a buffer of the
engine's ``Workspace`` reused from batch to batch; ``norms`` [S, T] are their per-token norms.
Each consumer is handed, when its input arrives, to the fold of its weights' kind
(``probes.folds``: unit/static by Gram products, per token, per feature, carried post-LN terms),
which sums the rebuild error |h - rebuilt|^2 directly (never as a difference of large sums, which
would hide a 1e-4 error under float32 rounding) and, at the batch's end, the dots <c[l, s],
rebuilt_l> and the norms, so every consumer's shares sum to 1 up to float64 rounding. A model whose
every consumer hands its terms (post-LN) never reads the source outputs, which are then not copied
(``values=False``).

Sums are float64 tensors on the model's device (float32 on MPS, which has no float64: sums there
are plain float32, about 1e-7 relative per batch), so a CUDA capture does not wait on transfers:
the only host synchronisation of a batch is ``end_batch``'s one transfer of the batch's rebuild
errors and a finiteness flag over every statistic. The weights' means and spreads and each source's
covariance are ``probes.moments`` (Chan et al.'s merge), so shards of a capture (``probes.shard``)
and resumed partial states (``probes.partial``) add up to one run's sums; ``state`` is plain
float64/int64 NumPy arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from depthscope.errors import TraceError
from depthscope.probes.folds import FOLDS, chunk_bytes, kind_of
from depthscope.probes.moments import Covariance, Moments, host
from depthscope.probes.terms import Terms
from depthscope.probes.workspace import Workspace
from depthscope.resources import require_memory
from depthscope.trace import TRACE_FORMAT, VARIABLE_ATTRS, Layout, block_coords

__all__ = ["Accumulator", "Terms"]

MATRICES = ("dot", "cnorm")  # (layer, source) sums besides the weights' moments
ROWS = ("hh", "ctotal", "err", "in_sq", "first_sq", "full_sq")  # (layer,) sums


class Accumulator:
    """Sums over tokens of every trace statistic (see the module docstring), mergeable."""

    def __init__(
        self,
        layout: Layout,
        covariance: bool = False,
        values: bool = True,
        workspace: Workspace | None = None,
    ):
        self.layout = layout
        self.covariance = covariance  # also each source's covariance over tokens (d x d per source)
        self.values = values  # whether the source outputs are kept in V (else a stride-0 stand-in)
        self.workspace = Workspace() if workspace is None else workspace
        self.tokens = 0
        self.d_model = 0
        self.device = torch.device("cpu")
        self._indices: dict[tuple[int, ...], Tensor] = {}  # index tensors on the device (``index``)
        self.chunk = chunk_bytes(self.device)  # bytes of a token chunk of the folds
        self.dtype = torch.float64  # of the sums
        self.n_layers, n_s = len(layout.layer), len(layout.source)
        self.n_sources = np.asarray(layout.layer_sources, dtype=np.int64)
        self.sums: dict[str, Tensor] = {
            k: torch.zeros(self.n_layers, n_s, dtype=self.dtype) for k in MATRICES
        }
        self.sums.update({k: torch.zeros(self.n_layers, dtype=self.dtype) for k in ROWS})
        self.sums["src_sq"] = torch.zeros(n_s, dtype=self.dtype)
        self.moments = Moments(self.n_layers, n_s, self.dtype)
        self.cov = Covariance()
        self.half_batch = False  # the batch in flight is an even one (its covariance also kept apart)
        self.native: dict[str, tuple[tuple[str, ...], dict[int, Tensor]]] = {}
        self.folds = {kind: fold(self) for kind, fold in FOLDS.items()}
        self.V: Tensor | None = None
        self.norms: Tensor | None = None
        self.start_batch()

    # ---- one batch ----

    def start_batch(self) -> None:
        """What comes next is one new batch."""
        self.started = False  # whether this batch's first source has come
        self.folded: set[int] = set()
        self._marks: tuple[Tensor, Tensor] | None = None
        self._pending: dict[str, list[tuple[int, Tensor]]] = {}  # per-row sums added at the batch's end
        for fold in self.folds.values():
            fold.rows = []
        self.folds["gram"].start_batch()

    def add_tokens(self, n: int) -> None:
        """Count ``n`` more analysed tokens (the batch's, after the skipped positions)."""
        self.tokens += n

    def n_of(self, i: int) -> int:
        """How many sources consumer i reads."""
        return int(self.n_sources[i])

    def index(self, rows: Sequence[int]) -> Tensor:
        """``rows`` as an int64 tensor on the sums' device, made once per distinct list and kept: the
        same consumers come in the same order every batch, and on a GPU making one from a list is a
        copy from the host that waits for the device to finish its queue.
        """
        key = tuple(rows)
        idx = self._indices.get(key)
        if idx is None:
            idx = self._indices[key] = torch.tensor(key, dtype=torch.int64, device=self.device)
        return idx

    def _begin(self, v: Tensor) -> None:
        """At a batch's first source [T, d]: place the sums on its device, size the buffers."""
        if v.device != self.device:
            self._to(v.device)
        shape = (len(self.layout.source), *v.shape)
        ws = self.workspace
        if not self.values:
            self.V = v.new_zeros(()).expand(shape)
        else:
            V = self.V  # noqa: N806
            if V is None or V.shape != shape or V.dtype != v.dtype or V.device != v.device:
                self.V = None
                ws.free("sources")  # the old buffer goes first
                if v.device.type == "cpu":
                    need = (shape[0] + 1) * shape[1] * (shape[2] + 1) * v.element_size()
                    what = f"the source buffer of {shape[1]} tokens x {shape[0]} sources x d_model {shape[2]}"
                    require_memory(need, what, "; lower --batch-size or --ctx")
            self.V = ws.buffer("sources", shape, v)
        self.norms = ws.buffer("norms", shape[:2], v)
        self.started = True
        self._marks = (self.sums["err"].clone(), self.sums["in_sq"].clone())
        self.d_model = v.shape[-1]

    def _to(self, device: torch.device) -> None:
        self.device = device
        self._indices = {}
        self.chunk = chunk_bytes(device)
        self.dtype = torch.float32 if device.type == "mps" else torch.float64
        cast = {"device": device, "dtype": self.dtype}
        self.sums = {k: t.to(**cast) for k, t in self.sums.items()}
        self.moments.to(**cast)
        self.cov.to(**cast)
        self.native = {
            k: (dims, {i: x.to(**cast) for i, x in s.items()}) for k, (dims, s) in self.native.items()
        }

    def sq(self, x: Tensor) -> Tensor:
        """The sum of |x|^2 over every element, as one BLAS dot product (an order of magnitude faster than
        pow-then-sum on a CPU; its float32 rounding is about 1e-7 relative), in the sums' precision.
        """
        flat = x.reshape(-1)
        return torch.dot(flat, flat)  # added in place into a float64 sum: promoted there

    def total(self, x: Tensor, dims=None) -> Tensor:
        """A sum over tokens in the sums' precision (products formed in the data's own)."""
        return x.sum(dtype=self.dtype) if dims is None else x.sum(dims, dtype=self.dtype)

    @torch.no_grad()
    def source(self, j: int, v: Tensor) -> None:
        """Source j's output for this batch, [T, d] (the skipped positions cut)."""
        if not self.started:
            self._begin(v)
        if self.values:
            self.V[j] = v
        if v.stride(0) == 0:  # one vector at every token (a bias): its norm, once
            norms = torch.linalg.vector_norm(v[0]).expand(v.shape[0])
        else:
            norms = torch.linalg.vector_norm(v, dim=-1)
        self.norms[j] = norms
        self._later("src_sq", j, torch.dot(norms, norms))
        if self.covariance:
            self.cov.add(j, v, self.dtype, half=self.half_batch)

    @torch.no_grad()
    def positions(self, i: int, h: Tensor) -> None:
        """Consumer i's whole input [batch, pos, d] (skipped positions included): how much of its
        squared norm sits at the first position of the windows (an attention sink shows here).
        """
        if h.dtype in (torch.float16, torch.bfloat16):  # a float16 dot overflows past 65,504
            h = h.float()
        self._later("first_sq", i, self.sq(h[:, 0]))
        self._later("full_sq", i, self.sq(h))

    @torch.no_grad()
    def consumer(self, i: int, h: Tensor, weights=None) -> None:
        """Consumer i now: input h [T, d] and its weights over its n sources: None (all ones), static
        [n], per token [T, n], per feature [T, n, d], block [T, m, n, m] (fractions), or its ``Terms``
        (post-LN).
        """
        self.folds[kind_of(weights)].consumer(i, h, weights)

    # ---- what the folds add into ----

    def fold_error(self, i: int, h: Tensor, rebuilt: Tensor) -> None:
        """Consumer i's rebuild error and input norm; it is folded."""
        self.add_error(i, self.sq(h - rebuilt), self.sq(h))

    def add_error(self, i: int, err: Tensor, in_sq: Tensor) -> None:
        """Consumer i's summed rebuild error and input norm; it is folded."""
        self._later("err", i, err)
        self._later("in_sq", i, in_sq)
        self.folded.add(i)

    def _later(self, key: str, i: int, value: Tensor) -> None:
        """Add ``value``, a sum of this batch (a number, or [n] for the first n columns of a matrix of
        sums), into row i of ``sums[key]`` at the batch's end, with the key's other rows in one call,
        not a call per row: on a GPU every call is a kernel launch.
        """
        self._pending.setdefault(key, []).append((i, value))

    def _flush(self) -> None:
        """Add the batch's pending sums (``_later``): per key and dtype, one concatenation, one
        index_add into the flattened sums.
        """
        for key, items in self._pending.items():
            flat = self.sums[key].view(-1)
            width = self.sums[key].shape[1] if self.sums[key].ndim == 2 else 1
            for dtype in {v.dtype for _, v in items}:
                rows = [(i, v.reshape(-1)) for i, v in items if v.dtype == dtype]
                at = [i * width + k for i, v in rows for k in range(v.shape[0])]
                values = torch.cat([v.to(self.device) for _, v in rows]).to(self.dtype)
                flat.index_add_(0, self.index(at), values)
        self._pending = {}

    def fold_norms(self, i: int, cn: Tensor) -> None:
        """Consumer i's contribution norms summed over tokens, [n]."""
        self._later("cnorm", i, cn)
        self._later("ctotal", i, cn.sum())

    def add_rows(self, idx, dots: Tensor, cnorm: Tensor | None = None, hh: Tensor | None = None) -> None:
        """Dots [n] of consumer ``idx`` (or [R, S] of consumers ``idx`` [R]), their norm sums alike, and
        |rebuilt|^2 (default: the dots' sum, which it equals).
        """
        s, hh = self.sums, dots.sum(-1) if hh is None else hh
        if isinstance(idx, int):
            self._later("dot", idx, dots)
            self._later("hh", idx, hh)
            if cnorm is not None:
                self.fold_norms(idx, cnorm)
            return
        s["dot"].index_add_(0, idx, dots)
        s["hh"].index_add_(0, idx, hh)
        if cnorm is not None:
            s["cnorm"].index_add_(0, idx, cnorm)
            s["ctotal"].index_add_(0, idx, cnorm.sum(1))

    @torch.no_grad()
    def end_batch(self) -> tuple[np.ndarray, bool, set[int]]:
        """Fold what waits for the whole batch, then the batch's checks in one transfer: (relative
        rebuild error per consumer, every statistic finite, consumers folded).
        """
        if self.started:
            for fold in self.folds.values():
                fold.end_batch()
        self._flush()
        s = self.sums
        if self._marks is None:
            err, in_sq = torch.zeros_like(s["err"]), torch.zeros_like(s["in_sq"])
        else:
            err, in_sq = s["err"] - self._marks[0], s["in_sq"] - self._marks[1]
        rel = torch.where(
            in_sq > 0, (err / torch.where(in_sq > 0, in_sq, 1.0)).sqrt(), torch.where(err > 0, torch.inf, 0.0)
        )
        # every sum the statistics come from (native quantities are the model's own and may hold NaN
        # by design, e.g. Block AttnRes' absent entries)
        sums = [t for t in (*s.values(), *self.moments.sums.values(), *self.cov.tensors()) if t.numel()]
        # each sum's largest magnitude (NaN where it holds a NaN) in one multi-tensor call, not two
        # calls per sum: on a GPU every call is a kernel launch
        finite = torch.isfinite(torch.stack(torch._foreach_norm(sums, math.inf))).all()
        out = torch.cat([rel, finite.to(rel.dtype).reshape(1)]).cpu().numpy()
        folded = self.folded
        self.start_batch()
        return out[:-1].astype(np.float64), bool(out[-1]), folded

    @torch.no_grad()
    def native_mean(self, name: str, dims: tuple[str, ...], i: int, x: Tensor) -> None:
        """Token sum of a native per-token quantity [batch, pos, *dims] for consumer i."""
        _, store = self.native.setdefault(name, (dims, {}))
        total = x.to(self.dtype).sum((0, 1)).to(self.device)
        store[i] = store[i] + total if i in store else total

    # ---- state: what a capture has summed so far, for checkpoints and for merging shards ----

    def state(self) -> dict[str, np.ndarray]:
        """Everything summed so far as plain float64/int64 arrays (a checkpoint, or a shard to merge)."""
        out = {f"sums.{k}": host(v) for k, v in self.sums.items()}
        out.update(self.moments.state())
        out["tokens"] = np.array(self.tokens, dtype=np.int64)
        out["d_model"] = np.array(self.d_model, dtype=np.int64)
        if self.covariance:
            out.update(self.cov.state(len(self.layout.source), self.d_model))
        for name, (dims, store) in self.native.items():
            shape = next(iter(store.values())).shape
            arr = np.full((self.n_layers, *shape), np.nan)
            for i, total in store.items():
                arr[i] = host(total)
            out[f"native.{name}.{','.join(dims)}"] = arr
        return out

    def merge(self, state: dict[str, np.ndarray]) -> None:
        """Add another accumulator's ``state`` (tokens that come after this one's) into this one: sums
        add; the weights' moments and the covariances merge by Chan et al.'s update.
        """
        n_l, n_s = self.n_layers, len(self.layout.source)
        if state["sums.mix"].shape != (n_l, n_s):
            raise TraceError(
                f"cannot merge a capture of {state['sums.mix'].shape} consumers x sources into {(n_l, n_s)}"
            )
        dev = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64)).to(self.device, self.dtype)  # noqa: E731
        self.moments.merge(state)
        for key in self.sums:
            self.sums[key] += dev(state[f"sums.{key}"])
        self.tokens += int(state["tokens"])
        self.d_model = max(self.d_model, int(state["d_model"]))
        if "cov.n" in state:
            self.covariance = True
            self.cov.merge(state, self.sums["hh"])
        for key, arr in state.items():
            if key.startswith("native."):
                name, dims = key[7:].rsplit(".", 1)
                _, store = self.native.setdefault(name, (tuple(dims.split(",")) if dims else (), {}))
                for i in range(arr.shape[0]):
                    if not np.isnan(arr[i]).all():
                        store[i] = store[i] + dev(arr[i]) if i in store else dev(arr[i])

    # ---- the trace ----

    def dataset(self, attrs: dict) -> xr.Dataset:
        """The trace Dataset (NaN on unavailable cells)."""
        state = self.state()
        s = {k[5:]: v for k, v in state.items() if k.startswith("sums.")}
        lay, n = self.layout, max(self.tokens, 1)
        nan = np.where(lay.available, 1.0, np.nan)
        seen = np.maximum(state["seen"], 1)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            std = np.sqrt(s["mix_sq"] / seen)
            share = s["dot"] / s["hh"][:, None]
            nshare = s["cnorm"] / s["ctotal"][:, None]
            err = np.where(
                s["in_sq"] > 0, np.sqrt(s["err"] / s["in_sq"]), np.where(s["err"] > 0, np.inf, 0.0)
            )
        d = max(self.d_model, 1)
        data = {
            "mixing": (("layer", "source"), s["mix"] * nan),
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
            **block_coords(lay.layer, lay.source),  # here, not assigned after: that copies the Dataset
        }
        ds = xr.Dataset(
            data, coords=coords, attrs={**attrs, "trace_format": TRACE_FORMAT, "tokens": int(self.tokens)}
        )
        for name, (long_name, units) in VARIABLE_ATTRS.items():
            ds[name].attrs.update(long_name=long_name, units=units)
        if self.covariance:
            ds["source_spectrum"] = (("source", "component"), self.cov.spectra(len(lay.source), self.d_model))
            ds["source_spectrum"].attrs.update(
                long_name="eigenvalues of the source's covariance over tokens (descending)", units="1"
            )
        if self.covariance and self.cov.half and self.cov.tokens(half=True) < self.cov.tokens():
            half = self.cov.spectra(len(lay.source), self.d_model, half=True)
            ds["source_spectrum_half"] = (("source", "component"), half)
            ds["source_spectrum_half"].attrs.update(
                long_name="the same over every other batch (how far a rank estimate has converged)",
                units="1",
                tokens=int(self.cov.tokens(half=True)),
            )
        for key, arr in state.items():
            if key.startswith("native."):
                name, dims = key[7:].rsplit(".", 1)
                ds[name] = (("layer", *(tuple(dims.split(",")) if dims else ())), arr / n)
                ds[name].attrs.update(long_name=f"{name} (token mean, native)", units="1")
        return ds
