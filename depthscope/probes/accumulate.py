"""The engine's accumulator: every trace statistic as sums over tokens, batch by batch, on the device.

The formulas of every variable are in ``depthscope.trace.format``; this module computes them with
as few passes over memory as the arithmetic allows. Legend: T = tokens of the batch (windows x
positions after the skipped ones), S = sources, L = consumers, d = d_model.

One batch:

* ``V`` [S, T, d]: the batch's source outputs, source-major, in the model's compute dtype (float32
  for half-precision models): the one big allocation, reused from batch to batch (its size is set
  by the batch: ``--batch-size`` windows of ``--ctx`` tokens); ``norms`` [S, T] their per-token
  norms; ``R`` [T, d] the running sum of the first sources, grown when a unit consumer asks.
* Each consumer l with n sources and input h [T, d] is rebuilt at once, when its input arrives:
  unit weights (standard residuals, every Hugging Face decoder): ``R`` itself, O(T d); static
  weights w [n]: sum_s w_s v_s; per-token weights W [T, n] (AttnRes, unrolled HC/mHC streams): one
  batched product; per-feature weights W [T, n, d] (DCA's GRN-v2/v3): token chunks sized to the
  cache. Carried terms (post-LN encoders, ``Terms``) are already in memory: whole-tensor passes over
  the dense ones, O(T d) for a group of vector terms; the source outputs are then not copied at all
  (``values=False``), and the per-token mixing of every such consumer is folded at the batch's end
  in one set of products. The rebuild error |h - rebuilt|^2 is summed directly
  (never as a difference of large sums, which would hide a 1e-4 error under float32 rounding).
* The dots <c[l, s], rebuilt_l> come at the end of the batch from Gram matrices: for unit and
  static weights G = sum_t V_t V_t^T (one [S, T d] x [T d, S] product) gives
  dots[l, s] = w_s (G w)_s and |rebuilt_l|^2 = w^T G w; for per-token weights the per-token Grams
  G_t = V_t V_t^T (one batched product, in token chunks) give the same per token. So every
  consumer's shares sum to 1 up to float64 rounding.

Sums are float64 tensors on the model's device (float32 on MPS, which has no float64: sums there
are plain float32, about 1e-7 relative per batch), so a CUDA capture does not wait on transfers:
the only host synchronisation of a batch is ``end_batch``'s one transfer of the batch's rebuild
errors and a finiteness flag over every statistic. Means and spreads of the weights, and each
source's covariance, merge with Chan et al.'s parallel update, so shards of a capture
(``probes.shard``) and resumed partial states (``probes.partial``) add up to one run's sums;
``state`` is plain float64/int64 NumPy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from depthscope.errors import TraceError
from depthscope.resources import require_memory
from depthscope.trace import TRACE_FORMAT, VARIABLE_ATTRS, Layout, block_coords

CHUNK_BYTES = 1 << 20  # token chunks of per-feature and per-token work: about 1 MB, cache-sized
MATRICES = ("mix", "mix_abs", "mix_sq", "dot", "cnorm")  # (layer, source) sums
ROWS = ("hh", "ctotal", "err", "in_sq", "first_sq", "full_sq")  # (layer,) sums


@dataclass(frozen=True)
class Terms:
    """A consumer's terms c[l, s] for its n sources, source-major, in two forms.

    ``dense`` [m, batch, pos, d]: the terms held whole (sources ``dense_at`` [m]). ``vecs``: groups
    (vec [k, b, p, d], at [k]) of terms that are one vector per position scaled per token,
    c_s[t] = scale_s[t] * vec_s, where (b, p) broadcasts against (batch, pos): (1, 1) for a vector
    the same at every token, (1, pos) for one the same in every window (a position embedding). A
    LayerNorm acts on a token as a fixed linear map, gamma * (x - mean(x)), times that token's scalar
    1/sigma_t, so such a term keeps its form through every later LayerNorm and is carried as b p d
    numbers, not batch pos d. ``scale`` [n, batch, pos]: every term's accumulated per-token factor
    (what ``mixing`` reports; inside the dense terms already, applied to the vector terms).
    ``rebuilt`` [batch, pos, d]: the sum of the terms, carried by the same linear maps as they.
    ``cut`` drops the first positions of every window without copying.
    """

    dense: Tensor
    dense_at: Tensor
    vecs: tuple[tuple[Tensor, Tensor], ...]
    scale: Tensor
    rebuilt: Tensor

    def cut(self, skip: int) -> Terms:
        """The same terms without the first ``skip`` positions of every window (views)."""
        if not skip:
            return self
        vecs = tuple((v[:, :, skip:] if v.shape[2] > 1 else v, at) for v, at in self.vecs)
        return Terms(
            self.dense[:, :, skip:], self.dense_at, vecs, self.scale[:, :, skip:], self.rebuilt[:, skip:]
        )

    def to(self, device: torch.device, dtype: torch.dtype) -> Terms:
        """On ``device``, the terms in ``dtype`` (the factors keep theirs); itself where they are."""
        if self.rebuilt.device == device and self.rebuilt.dtype == dtype and self.dense.dtype == dtype:
            return self
        vecs = tuple((v.to(device, dtype), at.to(device)) for v, at in self.vecs)
        return Terms(
            self.dense.to(device, dtype), self.dense_at.to(device), vecs, self.scale.to(device),
            self.rebuilt.to(device, dtype),
        )  # fmt: skip

    def full(self) -> Tensor:
        """Every term whole: [n, batch, pos, d] (for the read-out's logit attribution, once a batch)."""
        out = self.dense.new_empty((*self.scale.shape, self.rebuilt.shape[-1]))
        out[self.dense_at] = self.dense
        for v, at in self.vecs:
            out[at] = self.scale[at].unsqueeze(-1) * v
        return out


class Accumulator:
    """Sums over tokens of every trace statistic (see the module docstring), mergeable."""

    MEANS = ("mix", "mix_abs")  # running means over ``seen`` tokens; ``mix_sq`` is their M2

    def __init__(self, layout: Layout, covariance: bool = False, values: bool = True):
        self.layout = layout
        self.covariance = covariance  # also each source's covariance over tokens (d x d per source)
        # whether the batch's source outputs are kept in V: a model whose every consumer hands its
        # terms directly (post-LN) never reads them, so V is then a stride-0 stand-in of V's shape
        self.values = values
        self.tokens = 0
        self.d_model = 0
        self.device = torch.device("cpu")
        self.dtype = torch.float64  # of the sums
        n_l, n_s = len(layout.layer), len(layout.source)
        self.n_sources = np.asarray(layout.layer_sources, dtype=np.int64)
        self.sums: dict[str, Tensor] = {k: torch.zeros(n_l, n_s, dtype=self.dtype) for k in MATRICES}
        self.sums.update({k: torch.zeros(n_l, dtype=self.dtype) for k in ROWS})
        self.sums["src_sq"] = torch.zeros(n_s, dtype=self.dtype)
        self.seen = torch.zeros(n_l, dtype=self.dtype)  # tokens folded into each consumer's means
        self.cov: dict[int, list] = {}  # source -> [tokens, mean (d,), M2 (d, d)]
        self.native: dict[str, tuple[tuple[str, ...], dict[int, Tensor]]] = {}
        self.V: Tensor | None = None
        self.norms: Tensor | None = None
        self._mixing: Tensor | None = None  # [consumer, source, T]: deferred per-token mixing
        self._reset_batch()

    # ---- one batch ----

    def _reset_batch(self) -> None:
        self.started = False  # whether this batch's first source has come
        self.R: Tensor | None = None  # running sum of the first sources, built when a unit consumer asks
        self._in_r = 0  # how many sources R holds
        self._unit: list[int] = []  # consumers with unit weights, dots from G at the end
        self._static: list[tuple[int, Tensor]] = []  # (consumer, w [n])
        self._token: list[tuple[int, Tensor]] = []  # (consumer, W [T, n])
        self._folded: set[int] = set()
        self._deferred: list[int] = []  # consumers whose mixing waits in _mixing for the batch's end
        self._marks: tuple[Tensor, Tensor] | None = None

    def add_tokens(self, n: int) -> None:
        """Count ``n`` more analysed tokens (the batch's, after the skipped positions)."""
        self.tokens += n

    def start_batch(self) -> None:
        """Forget the last batch's buffers' contents: what comes next is one new batch."""
        self._reset_batch()

    def _begin(self, v: Tensor) -> None:
        """At a batch's first source [T, d]: place the sums on its device, size the buffers."""
        if v.device != self.device:
            self._to(v.device)
        shape = (len(self.layout.source), *v.shape)
        if not self.values:
            self.V = v.new_zeros(()).expand(shape)
            self.norms = v.new_empty(shape[:2])
        elif self.V is None or self.V.shape != shape or self.V.dtype != v.dtype or self.V.device != v.device:
            if v.device.type == "cpu":
                self.V = None  # the old buffer goes first
                need = (shape[0] + 1) * shape[1] * (shape[2] + 1) * v.element_size()
                what = f"the source buffer of {shape[1]} tokens x {shape[0]} sources x d_model {shape[2]}"
                require_memory(need, what, "; lower --batch-size or --ctx")
            self.V = v.new_empty(shape)
            self.norms = v.new_empty(shape[:2])
        self.started = True
        self._marks = (self.sums["err"].clone(), self.sums["in_sq"].clone())
        self.d_model = v.shape[-1]

    def _to(self, device: torch.device) -> None:
        self.device = device
        self.dtype = torch.float32 if device.type == "mps" else torch.float64
        cast = {"device": device, "dtype": self.dtype}
        self.sums = {k: t.to(**cast) for k, t in self.sums.items()}
        self.seen = self.seen.to(**cast)
        self.cov = {j: [n, m.to(**cast), m2.to(**cast)] for j, (n, m, m2) in self.cov.items()}
        self.native = {
            k: (dims, {i: x.to(**cast) for i, x in s.items()}) for k, (dims, s) in self.native.items()
        }

    def _sq(self, x: Tensor) -> Tensor:
        """The sum of |x|^2 over every element, as one BLAS dot product (an order of magnitude faster than
        pow-then-sum on a CPU; its float32 rounding is about 1e-7 relative), in the sums' precision.
        """
        flat = x.reshape(-1)
        return torch.dot(flat, flat)  # added in place into a float64 sum: promoted there

    def _sum(self, x: Tensor, dims=None) -> Tensor:
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
        self.sums["src_sq"][j].add_(torch.dot(norms, norms))
        if self.covariance:
            self._fold_cov(j, v)

    @torch.no_grad()
    def positions(self, i: int, h: Tensor) -> None:
        """Consumer i's whole input [batch, pos, d] (skipped positions included): how much of its
        squared norm sits at the first position of the windows (an attention sink shows here).
        """
        self.sums["first_sq"][i].add_(self._sq(h[:, 0]))
        self.sums["full_sq"][i].add_(self._sq(h))

    def _fold_cov(self, j: int, x: Tensor) -> None:
        """Merge a batch [T, d] into source j's running mean and scatter matrix (Chan et al.)."""
        mean_b = x.mean(0, dtype=torch.float64 if self.dtype == torch.float64 else x.dtype)
        centred = x - mean_b.to(x.dtype)
        m2_b = (centred.T @ centred).to(self.dtype)
        part = [x.shape[0], mean_b.to(self.dtype), m2_b]
        self.cov[j] = part if j not in self.cov else _chan(self.cov[j], part)

    def _rebuilt_of_sources(self, n: int) -> Tensor:
        """sum_{s < n} v_s: the running sum, grown to n sources (consumers come in order, so each
        source is added once; nothing is summed for a model without unit consumers).
        """
        if self.R is None:
            self.R = torch.zeros_like(self.V[0])
        if self._in_r > n:
            return self.V[:n].sum(0)
        for j in range(self._in_r, n):
            self.R += self.V[j]
        self._in_r = n
        return self.R

    def _fold_error(self, i: int, h: Tensor, rebuilt: Tensor) -> None:
        self.sums["err"][i].add_(self._sq(h - rebuilt))
        self.sums["in_sq"][i].add_(self._sq(h))
        self._folded.add(i)

    @torch.no_grad()
    def consumer(self, i: int, h: Tensor, weights: Tensor | None = None, static: bool = False) -> None:
        """Consumer i now: input h [T, d] and its weights over its n sources: None (all ones), static
        [n] (``static=True``), per token [T, n] or per feature [T, n, d].
        """
        n = int(self.n_sources[i])
        if weights is None:
            self._fold_error(i, h, self._rebuilt_of_sources(n))
            self._unit.append(i)
        elif static:
            w = weights.to(self.V.dtype)
            self._fold_error(i, h, torch.einsum("s,std->td", w, self.V[:n]))
            self._static.append((i, w))
        elif weights.ndim == 2:
            w = weights.to(self.V.dtype)
            rebuilt = torch.bmm(w.unsqueeze(1), self.V[:n].transpose(0, 1)).squeeze(1)
            self._fold_error(i, h, rebuilt)
            cn = self._sum(w.abs() * self.norms[:n].T, 0)
            self._fold_norms(i, cn)
            self._fold_weights(i, w, w.abs())
            self._token.append((i, w))
        else:
            w = weights.to(self.V.dtype)
            means: list[Tensor] = []  # feature means of w and |w| per chunk, while it is in cache

            def contributions(a: int, b: int) -> Tensor:
                chunk = w[a:b]
                means.append(torch.stack([chunk.sum(-1), chunk.abs().sum(-1)]))
                return self.V[:n, a:b] * chunk.transpose(0, 1)  # V first: its source-major layout

            self._chunked(i, h, contributions)
            m = torch.cat(means, dim=1) / w.shape[-1]  # [2, T, n]
            self._fold_weights(i, m[0], m[1])

    @torch.no_grad()
    def consumer_terms(self, i: int, h: Tensor, terms: Terms) -> None:
        """Consumer i from its terms c[l, s] directly (``Terms``: a post-LN adapter's, its skipped
        positions cut), input h [T, d] with h = sum_s c_s (to rounding), T = batch x pos.

        The dense terms are already in memory, so each statistic is one whole-tensor pass over them:
        the dots with the rebuilt input as matrix-vector products (one per window where the windows
        are views with a gap of skipped positions), the norms as one reduction; nothing of their size
        is allocated (token chunks measured slower here: per-chunk calls dominate). A vector term
        c_s[t] = a_s[t] v_s costs no pass over T x d per term: dots_s = sum <v_s, sum_t a_s[t] r_t>
        (one product of the factors with the rebuilt input for the whole group), norms_s =
        sum_t |a_s[t]| |v_s|.
        """
        n = terms.scale.shape[0]
        dense, r = terms.dense, terms.rebuilt
        s = self.sums
        dot, cnorm = s["dot"][i], s["cnorm"][i]  # this consumer's rows, added into in place
        total = []  # its norm sums per group, for ctotal
        m = dense.shape[0]
        if m:
            if dense[0].is_contiguous():  # one matrix-vector product
                dd = dense.reshape(m, -1) @ r.reshape(-1)
            else:  # one per window: the windows are views with a gap of skipped positions
                dd = sum(c.reshape(m, -1) @ rb.reshape(-1) for c, rb in zip(dense.unbind(1), r.unbind(0)))
            dot.index_add_(0, terms.dense_at, dd.to(self.dtype))
            total.append(self._sum(torch.linalg.vector_norm(dense, dim=-1).reshape(m, -1), 1))
            cnorm.index_add_(0, terms.dense_at, total[-1])
        for v, at in terms.vecs:
            a = terms.scale[at]  # [k, batch, pos]
            if v.shape[2] == 1:  # the same at every token: <v_s, sum_t a_s[t] r_t>, one product
                y = a.reshape(a.shape[0], -1) @ r.reshape(-1, r.shape[-1])  # [k, d]
                dot.index_add_(0, at, self._sum(y * v.reshape(y.shape), 1))
            else:  # the same in every window: <v_s[p], r[b, p]> per token, then weighted by a_s
                dot.index_add_(0, at, self._sum((torch.einsum("bpd,spd->sbp", r, v[:, 0]) * a).flatten(1), 1))
            total.append(self._sum((a.abs() * torch.linalg.vector_norm(v, dim=-1)).flatten(1), 1))
            cnorm.index_add_(0, at, total[-1])
        r = r.reshape(-1, r.shape[-1])
        if total:
            s["ctotal"][i].add_(torch.cat(total).sum())
        s["hh"][i].add_(self._sq(r))
        self._fold_error(i, h, r)
        self._defer_mixing(i, terms.scale.reshape(n, -1))

    def _defer_mixing(self, i: int, mixing: Tensor) -> None:
        """Keep consumer i's per-token mixing [n, T] (a copy: the adapter updates its own in place)
        for ``_mixing_consumers`` at the end of the batch, which folds every such consumer at once.
        """
        S, T = len(self.layout.source), mixing.shape[1]  # noqa: N806
        buf = self._mixing
        want = (len(self.layout.layer), S, T)
        if buf is None or buf.shape != want or buf.device != mixing.device or buf.dtype != mixing.dtype:
            buf = self._mixing = mixing.new_zeros(want)  # a consumer's columns past its n stay 0
        buf[i, : mixing.shape[0]] = mixing
        self._deferred.append(i)

    def _mixing_consumers(self) -> None:
        """Fold the deferred consumers' per-token mixing: means and spreads of all rows at once."""
        if not self._deferred:
            return
        idx = torch.tensor(self._deferred, device=self._mixing.device)
        w = self._mixing.index_select(0, idx).to(self.dtype)  # [R, S, T]
        m_b = w.mean(2)
        m2_b = (w - m_b[..., None]).pow(2).sum(2)
        self._merge_rows(idx.to(self.device), m_b, m2_b, w.abs().mean(2), w.shape[2])

    def _chunked(self, i: int, h: Tensor, contributions) -> None:
        """A consumer whose contributions c [n, t, d] are built per token chunk: rebuild, dots with
        its own rebuild, contribution norms and the error, without holding [n, T, d] at once.
        """
        n = int(self.n_sources[i])
        T, d = h.shape  # noqa: N806
        step = max(1, CHUNK_BYTES // (4 * n * d))
        dots = h.new_zeros(n, dtype=self.dtype)
        cn = h.new_zeros(n, dtype=self.dtype)
        hh = err = h.new_zeros((), dtype=self.dtype)
        for a in range(0, T, step):
            b = min(T, a + step)
            c = contributions(a, b)  # [n, t, d]
            rebuilt = c.sum(0)
            dots = dots + (c.flatten(1) @ rebuilt.flatten()).to(self.dtype)  # one matrix-vector product
            cn = cn + self._sum(torch.linalg.vector_norm(c, dim=-1), 1)
            hh = hh + self._sq(rebuilt)
            err = err + self._sq(h[a:b] - rebuilt.to(h.dtype))
        s = self.sums
        s["dot"][i, :n] += dots
        s["hh"][i] += hh
        self._fold_norms(i, cn)
        s["err"][i] += err
        s["in_sq"][i] += self._sq(h)
        self._folded.add(i)

    def _fold_norms(self, i: int, cn: Tensor) -> None:
        n = cn.shape[0]
        self.sums["cnorm"][i, :n] += cn
        self.sums["ctotal"][i] += cn.sum()

    def _fold_weights(self, i: int, per_token: Tensor, per_token_abs: Tensor) -> None:
        """Merge this batch's per-token weights [T, n] (and magnitudes) into the running means and the
        spread (Chan et al.), so the spread has no E[w^2] - E[w]^2 cancellation.
        """
        w = per_token.to(self.dtype)
        n_b = w.shape[0]
        m_b = w.mean(0)
        m2_b = (w - m_b).pow(2).sum(0)
        abs_b = per_token_abs.to(self.dtype).mean(0)
        self._merge_rows(i, m_b, m2_b, abs_b, n_b)

    def _merge_rows(self, idx, m_b: Tensor, m2_b: Tensor, abs_b: Tensor, n_b: int) -> None:
        """Merge a batch's weight means ``m_b``, their M2 and mean magnitudes (each [n] for one
        consumer ``idx``, or [R, n] for consumers ``idx`` [R], each once) over the batch's ``n_b``
        tokens into the running means and spreads of the first n sources (Chan et al.). Whole rows
        (n = S) are exact too: a source a consumer does not read has weight 0 in every batch.
        """
        s, n = self.sums, m_b.shape[-1]
        n_a = self.seen[idx].unsqueeze(-1)
        frac = n_b / (n_a + n_b)
        delta = m_b - s["mix"][idx, :n]
        s["mix"][idx, :n] += delta * frac
        s["mix_sq"][idx, :n] += m2_b + delta.pow(2) * n_a * frac
        s["mix_abs"][idx, :n] += (abs_b - s["mix_abs"][idx, :n]) * frac
        self.seen[idx] += n_b

    @torch.no_grad()
    def end_batch(self) -> tuple[np.ndarray, bool, set[int]]:
        """Fold what waits for the whole batch (the Gram products), then the batch's checks in one
        transfer: (relative rebuild error per consumer, every statistic finite, consumers folded).
        """
        if self.started:
            self._mixing_consumers()
            self._gram_consumers()
            self._token_consumers()
        s = self.sums
        if self._marks is None:
            err = torch.zeros_like(s["err"])
            in_sq = torch.zeros_like(s["in_sq"])
        else:
            err, in_sq = s["err"] - self._marks[0], s["in_sq"] - self._marks[1]
        rel = torch.where(
            in_sq > 0, (err / torch.where(in_sq > 0, in_sq, 1.0)).sqrt(), torch.where(err > 0, torch.inf, 0.0)
        )
        finite = torch.stack([torch.isfinite(t).all() for t in self._statistics()]).all()
        out = torch.cat([rel, finite.to(rel.dtype).reshape(1)]).cpu().numpy()
        folded = self._folded
        self._reset_batch()
        return out[:-1].astype(np.float64), bool(out[-1]), folded

    def _statistics(self) -> list[Tensor]:
        """Every sum the trace's statistics come from (native quantities are the model's own and may
        hold NaN by design, e.g. Block AttnRes' absent entries).
        """
        return [*self.sums.values(), *(t for _, m, m2 in self.cov.values() for t in (m, m2))]

    def _gram_consumers(self) -> None:
        """Unit and static consumers: dots, |rebuilt|^2 and norms from G = sum_t V_t V_t^T."""
        if not self._unit and not self._static:
            return
        S, T, d = self.V.shape  # noqa: N806
        flat = self.V.view(S, T * d)
        G = (flat @ flat.T).to(self.dtype)  # noqa: N806
        N = self.norms.sum(1, dtype=self.V.dtype).to(self.dtype)  # noqa: N806  (sum_t |v_s|)
        rows = [(i, None) for i in self._unit] + self._static
        W = G.new_zeros(len(rows), S)  # noqa: N806
        for r, (i, w) in enumerate(rows):
            n = int(self.n_sources[i])
            W[r, :n] = 1.0 if w is None else w.to(self.dtype)
        dots = W * (W @ G)
        idx = torch.tensor([i for i, _ in rows], device=G.device)
        s = self.sums
        s["dot"].index_add_(0, idx, dots)
        s["hh"].index_add_(0, idx, dots.sum(1))
        cn = W.abs() * N
        s["cnorm"].index_add_(0, idx, cn)
        s["ctotal"].index_add_(0, idx, cn.sum(1))
        self._merge_rows(idx, W, torch.zeros_like(W), W.abs(), T)

    def _token_consumers(self) -> None:
        """Per-token consumers: dots and |rebuilt|^2 from the per-token Grams G_t, in token chunks."""
        if not self._token:
            return
        S, T, _ = self.V.shape  # noqa: N806
        W = self.V.new_zeros(T, len(self._token), S)  # noqa: N806
        for r, (_, w) in enumerate(self._token):
            W[:, r, : w.shape[1]] = w
        step = max(1, CHUNK_BYTES // (4 * S * max(S, self.d_model)))
        dots = W.new_zeros(len(self._token), S, dtype=self.dtype)
        for a in range(0, T, step):
            b = min(T, a + step)
            Vt = self.V[:, a:b].transpose(0, 1)  # noqa: N806  [t, S, d]
            Gt = torch.bmm(Vt, Vt.transpose(1, 2))  # noqa: N806  [t, S, S]
            Wt = W[a:b]  # noqa: N806
            dots += self._sum(Wt * torch.bmm(Wt, Gt), 0)
        idx = torch.tensor([i for i, _ in self._token], device=dots.device)
        self.sums["dot"].index_add_(0, idx, dots)
        self.sums["hh"].index_add_(0, idx, dots.sum(1))

    @torch.no_grad()
    def native_mean(self, name: str, dims: tuple[str, ...], i: int, x: Tensor) -> None:
        """Token sum of a native per-token quantity [batch, pos, *dims] for consumer i."""
        _, store = self.native.setdefault(name, (dims, {}))
        total = x.to(self.dtype).sum((0, 1)).to(self.device)
        store[i] = store[i] + total if i in store else total

    # ---- state: what a capture has summed so far, for checkpoints and for merging shards ----

    def state(self) -> dict[str, np.ndarray]:
        """Everything summed so far as plain float64/int64 arrays (a checkpoint, or a shard to merge)."""
        host = lambda t: t.detach().to("cpu", torch.float64).numpy().copy()  # noqa: E731
        out = {f"sums.{k}": host(v) for k, v in self.sums.items()}
        out["seen"] = host(self.seen).round().astype(np.int64)
        out["tokens"] = np.array(self.tokens, dtype=np.int64)
        out["d_model"] = np.array(self.d_model, dtype=np.int64)
        if self.covariance:
            n_s, d = len(self.layout.source), self.d_model
            out["cov.n"] = np.zeros(n_s, dtype=np.int64)
            out["cov.mean"] = np.zeros((n_s, d))
            out["cov.m2"] = np.zeros((n_s, d, d))
            for j, (n, mean, m2) in self.cov.items():
                out["cov.n"][j], out["cov.mean"][j], out["cov.m2"][j] = n, host(mean), host(m2)
        for name, (dims, store) in self.native.items():
            shape = next(iter(store.values())).shape
            arr = np.full((len(self.layout.layer), *shape), np.nan)
            for i, total in store.items():
                arr[i] = host(total)
            out[f"native.{name}.{','.join(dims)}"] = arr
        return out

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
        dev = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64)).to(self.device, self.dtype)  # noqa: E731
        n_a, n_b = self.seen, dev(state["seen"])
        n = torch.clamp(n_a + n_b, min=1.0)[:, None]
        s = self.sums
        delta = dev(state["sums.mix"]) - s["mix"]
        s["mix_sq"] += dev(state["sums.mix_sq"]) + delta.pow(2) * (n_a * n_b)[:, None] / n
        for key in self.MEANS:
            s[key] += (dev(state[f"sums.{key}"]) - s[key]) * n_b[:, None] / n
        for key, value in state.items():
            if key.startswith("sums.") and key[5:] not in (*self.MEANS, "mix_sq"):
                s[key[5:]] += dev(value)
        self.seen += n_b
        self.tokens += int(state["tokens"])
        self.d_model = max(self.d_model, int(state["d_model"]))
        if "cov.n" in state:
            self.covariance = True
            for j in np.flatnonzero(state["cov.n"]):
                other = [int(state["cov.n"][j]), dev(state["cov.mean"][j]), dev(state["cov.m2"][j])]
                self.cov[int(j)] = other if int(j) not in self.cov else _chan(self.cov[int(j)], other)
        for key, arr in state.items():
            if key.startswith("native."):
                name, dims = key[7:].rsplit(".", 1)
                _, store = self.native.setdefault(name, (tuple(dims.split(",")) if dims else (), {}))
                for i in range(arr.shape[0]):
                    if not np.isnan(arr[i]).all():
                        store[i] = store[i] + dev(arr[i]) if i in store else dev(arr[i])

    # ---- the trace ----

    def spectra(self) -> np.ndarray:
        """Eigenvalues of each source's covariance over tokens, descending: [source, component]."""
        out = np.full((len(self.layout.source), self.d_model), np.nan)
        for j, (n, _, m2) in self.cov.items():
            m2 = m2.detach().to("cpu", torch.float64).numpy()
            out[j] = np.linalg.eigvalsh(m2 / max(n - 1, 1))[::-1].clip(min=0.0)
        return out

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
            ds["source_spectrum"] = (("source", "component"), self.spectra())
            ds["source_spectrum"].attrs.update(
                long_name="eigenvalues of the source's covariance over tokens (descending)", units="1"
            )
        for key, arr in state.items():
            if key.startswith("native."):
                name, dims = key[7:].rsplit(".", 1)
                ds[name] = (("layer", *(tuple(dims.split(",")) if dims else ())), arr / n)
                ds[name].attrs.update(long_name=f"{name} (token mean, native)", units="1")
        return ds


def _chan(a: list, b: list) -> list:
    """Merge two [tokens, mean, M2] covariance summaries (Chan et al.'s parallel update)."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    delta = mean_b - mean_a
    return [n, mean_a + delta * n_b / n, m2_a + m2_b + torch.outer(delta, delta) * n_a * n_b / n]
