"""The engine's accumulator: float64 sums over tokens of every trace statistic, mergeable.

Per-batch sums held in float64, so capturing many small batches gives the same trace as one large
batch and memory does not grow with the number of tokens. Means and spreads of the weights, and
each source's covariance, merge with Chan et al.'s parallel update, so shards of a capture
(``probes.shard``) and resumed partial states (``probes.partial``) add up to one run's sums.
The formulas of every variable: ``depthscope.trace.format``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from depthscope.errors import TraceError
from depthscope.trace import TRACE_FORMAT, VARIABLE_ATTRS, Layout, with_blocks


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
        return with_blocks(ds)


def _chan(a: list, b: list) -> list:
    """Merge two [tokens, mean, M2] covariance summaries (Chan et al.'s parallel update)."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    delta = mean_b - mean_a
    return [n, mean_a + delta * n_b / n, m2_a + m2_b + torch.outer(delta, delta) * n_a * n_b / n]
