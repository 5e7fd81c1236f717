"""How each kind of consumer weights is folded into the trace's sums: one small object per kind.

Every fold has the same two steps, which the accumulator (``probes.accumulate``) calls:
``consumer(i, h, w)`` when consumer i's input h [T, d] and weights w arrive (its rebuild error at
once, while h is in memory) and ``end_batch()`` for what waits for the whole batch (products over
every consumer of the kind at once). What a fold reads of the batch (the source buffer
``V`` [S, T, d], the per-token norms ``norms`` [S, T]) and the sums it adds into are the
accumulator's. Legend: T = tokens of the batch, S = sources, n = a consumer's sources, d = d_model.

* ``Gram``: unit weights (standard residuals, every Hugging Face decoder) and static weights w [n]:
  the rebuild is the running sum of the sources (or sum_s w_s v_s); dots and norms come at the end
  from G = sum_t V_t V_t^T (one [S, T d] x [T d, S] product): dots[l, s] = w_s (G w)_s and
  |rebuilt_l|^2 = w^T G w.
* ``PerToken``: weights W [T, n] (AttnRes, unrolled HC/mHC streams): one batched product rebuilds,
  and the per-token Grams G_t = V_t V_t^T (in token chunks) give the dots at the end.
* ``PerFeature``: weights [T, n, d], or ``Split`` into a static per-feature part b [n, d] and a
  per-token gate g [T, n] (DCA's GRN-v2/v3), or ``Factored`` (a per-token product of two small
  factors: qwen4_exp's gated streams), in cache-sized token chunks.
* ``PerBlock``: block weights [T, m, n, m] (Frac-Connections: a term is the source's fractions
  mixed), the terms formed in token chunks (``probes.terms.block_terms``).
* ``Carried``: a post-LN consumer's ``Terms``, already in memory: whole-tensor passes, and the
  per-token mixing of every such consumer folded at the batch's end in one set of products.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from depthscope.probes.moments import Moments
from depthscope.probes.terms import Factored, Split, Terms, Windows, block_mixing, block_terms
from depthscope.probes.workspace import Workspace

CHUNK_BYTES = 1 << 20  # token chunks of per-token and per-feature work on a CPU: about 1 MB, cache-sized
ACCELERATOR_CHUNK_BYTES = 1 << 26  # on an accelerator whose memory size torch does not report


def chunk_bytes(device: torch.device) -> int:
    """How large a token chunk of per-token, per-feature and block work is on ``device``: cache-sized
    on a CPU (measured faster than whole tensors there); on an accelerator 1/256 of its memory, since
    there each chunk costs a handful of kernel launches and cache-sized chunks leave the device idle
    while the host launches them (DCA's per-feature fold at width 256 on an H200: 50,000 launches per
    8 batches, the GPU busy 7% of the time; ``docs/data/gpu.json``).
    """
    if device.type == "cpu":
        return CHUNK_BYTES
    if device.type == "cuda":
        return max(CHUNK_BYTES, torch.cuda.get_device_properties(device).total_memory // 256)
    return ACCELERATOR_CHUNK_BYTES


class Batch(Protocol):
    """What a fold reads of the batch and adds into: the accumulator's side of the interface
    (``probes.accumulate.Accumulator`` implements it), typed here so a fold names every member it
    uses and the accumulator's module is never imported by this one.
    """

    V: Tensor  # the batch's sources [S, T, d]
    norms: Tensor  # their per-token norms [S, T]
    dtype: torch.dtype  # of the sums
    device: torch.device
    d_model: int
    n_layers: int
    chunk: int  # bytes of a token chunk on the batch's device (``chunk_bytes``)
    workspace: Workspace  # reused buffers and constants
    moments: Moments  # the weights' token moments

    def n_of(self, i: int) -> int:
        """Consumer i's number of sources."""

    def index(self, rows: Sequence[int]) -> Tensor:
        """``rows`` as an index tensor on the batch's device, made once per distinct list."""

    def total(self, x: Tensor, dims=None) -> Tensor:
        """``x`` summed (over ``dims``) in the sums' dtype."""

    def sq(self, x: Tensor) -> Tensor:
        """Per-token squared norms of ``x``, in the sums' dtype."""

    def fold_error(self, i: int, h: Tensor, rebuilt: Tensor) -> None:
        """Add consumer i's rebuild error of this batch."""

    def add_error(self, i: int, err: Tensor, in_sq: Tensor) -> None:
        """Add consumer i's squared rebuild error and input energy."""

    def fold_norms(self, i: int, cn: Tensor) -> None:
        """Add consumer i's contribution norms."""

    def add_rows(self, idx, dots: Tensor, cnorm: Tensor | None = None, hh: Tensor | None = None) -> None:
        """Add the dots (and norms, energies) of the consumers ``idx``."""


class Fold(abc.ABC):
    """One weight kind: ``consumer`` as each consumer arrives, ``end_batch`` once a batch."""

    def __init__(self, acc: Batch):  # the accumulator that owns the fold
        self.acc = acc
        self.rows: list = []  # this batch's consumers of the kind, with what end_batch needs

    @abc.abstractmethod
    def consumer(self, i: int, h: Tensor, w) -> None:
        """Fold consumer i: input h [T, d] and its weights ``w``."""

    def end_batch(self) -> None:
        """Fold what waits for the whole batch; then forget the batch's consumers."""
        self.rows = []


class Gram(Fold):
    """Unit (w None) and static (w [n]) weights: dots and norms from the sources' Gram matrix."""

    def start_batch(self) -> None:
        """A new batch: no running sum yet."""
        self.R: Tensor | None = None  # running sum of the first sources, built when a unit consumer asks
        self.in_r = 0  # how many sources R holds

    def _running_sum(self, n: int) -> Tensor:
        """sum_{s < n} v_s: the running sum grown to n sources (consumers come in order, so each source
        is added once; nothing is summed for a model without unit consumers).
        """
        V = self.acc.V  # noqa: N806
        if self.R is None:
            self.R = torch.zeros_like(V[0])
            self.in_r = 0
        if self.in_r > n:
            return V[:n].sum(0)
        for j in range(self.in_r, n):
            self.R += V[j]
        self.in_r = n
        return self.R

    def consumer(self, i: int, h: Tensor, w: Tensor | None) -> None:
        """Fold consumer i: input h [T, d] and its weights ``w``."""
        n, V = self.acc.n_of(i), self.acc.V  # noqa: N806
        if w is None:
            rebuilt = self._running_sum(n)
        else:
            w = w.to(V.dtype)
            rebuilt = torch.einsum("s,std->td", w, V[:n])
        self.acc.fold_error(i, h, rebuilt)
        self.rows.append((i, w))

    def end_batch(self) -> None:
        """Fold what waits for the whole batch; then forget the batch's consumers."""
        acc = self.acc
        if self.rows:
            S, T, d = acc.V.shape  # noqa: N806
            flat = acc.V.view(S, T * d)
            G = (flat @ flat.T).to(acc.dtype)  # noqa: N806
            N = acc.norms.sum(1, dtype=acc.V.dtype).to(acc.dtype)  # noqa: N806  (sum_t |v_s|)
            # [R, S]: ones over each row's sources, then the static weights where given, in one
            # call each, not one per row (on a GPU every call is a kernel launch)
            ns = acc.index([acc.n_of(i) for i, _ in self.rows])
            W = (acc.index(range(S)) < ns.unsqueeze(1)).to(acc.dtype)  # noqa: N806
            given = [(r, w) for r, (_, w) in enumerate(self.rows) if w is not None]
            if given:
                at = acc.index([r * S + k for r, w in given for k in range(w.shape[0])])
                W.view(-1)[at] = torch.cat([w for _, w in given]).to(acc.dtype)
            dots = W * (W @ G)
            idx = acc.index([i for i, _ in self.rows])
            acc.add_rows(idx, dots, W.abs() * N)
            acc.moments.add(idx, W, torch.zeros_like(W), W.abs(), T)
        self.R = None
        super().end_batch()


class PerToken(Fold):
    """Per-token weights W [T, n]: one batched product rebuilds; per-token Grams give the dots."""

    def consumer(self, i: int, h: Tensor, w: Tensor) -> None:
        """Fold consumer i: input h [T, d] and its weights ``w``."""
        acc = self.acc
        n, V = acc.n_of(i), acc.V  # noqa: N806
        w = w.to(V.dtype)
        if not n:
            residual = h
        elif n * V[0].numel() * V.element_size() <= acc.chunk:  # the terms fit one chunk: one product
            residual = h - torch.einsum("tn,ntd->td", w, V[:n])
        else:
            # h - sum_s w_s v_s, a source at a time: n passes of one source each, faster on a CPU than
            # one batched product over the sources' strided [T, n, d] view (which copies it first)
            residual = torch.addcmul(h, V[0], w[:, :1], value=-1)
            for s in range(1, n):
                residual.addcmul_(V[s], w[:, s : s + 1], value=-1)
        acc.add_error(i, acc.sq(residual), acc.sq(h))
        acc.fold_norms(i, acc.total(w.abs() * acc.norms[:n].T, 0))
        self.rows.append((i, w))

    def end_batch(self) -> None:
        """Fold what waits for the whole batch; then forget the batch's consumers."""
        acc = self.acc
        if self.rows:
            S, T, _ = acc.V.shape  # noqa: N806
            W = acc.V.new_zeros(T, len(self.rows), S)  # noqa: N806
            for r, (_, w) in enumerate(self.rows):
                W[:, r, : w.shape[1]] = w
            step = max(1, acc.chunk // (acc.V.element_size() * S * max(S, acc.d_model)))
            dots = W.new_zeros(len(self.rows), S, dtype=acc.dtype)
            for a in range(0, T, step):
                b = min(T, a + step)
                Vt = acc.V[:, a:b].transpose(0, 1)  # noqa: N806  [t, S, d]
                Gt = torch.bmm(Vt, Vt.transpose(1, 2))  # noqa: N806  [t, S, S]
                Wt = W[a:b]  # noqa: N806
                dots += acc.total(Wt * torch.bmm(Wt, Gt), 0)
            idx = acc.index([i for i, _ in self.rows])
            acc.add_rows(idx, dots)
            # every consumer's weight moments at once: a row's columns past its n are 0 in every batch
            W = W.transpose(0, 1)  # noqa: N806  [R, T, S]
            acc.moments.add_tokens(idx.to(acc.device), W, None, acc.chunk)
        super().end_batch()


class PerFeature(Fold):
    """Per-feature weights, whole [T, n, d] (or ``Windows``: uncut, each chunk inside one window),
    ``Split`` (b [n, d] + g [T, n]) or ``Factored`` (C^T A per token), folded in token chunks
    (``chunk_bytes``: on a CPU) so that the terms [n, t, d] of a chunk stay in cache: the terms (one product,
    into a workspace buffer), the rebuild (one sum, into the workspace's [T, d] rebuilt input), the
    dots with it (one matrix-vector product) and the norms, each from the chunk in cache; the rebuild
    error once at the end (|rebuilt|^2 is the dots' sum). Split weights are formed a chunk at a time,
    w = b + g, in cache too, and so are factored ones (one batched product per chunk): the sources are
    read from memory once per consumer, where whole weights cost their own [T, n, d] in memory besides,
    and their building before. Split weights' feature means (of w and |w|) need no pass at all
    (``split_means``). Five operations a chunk, nothing allocated but [n] and [n, t] results: at a few
    hundred chunks a batch the calls, not only the arithmetic, are the cost.

    Two consumers sharing a ``Split.base`` (a DCA block's query view and its MLP, which reads the
    same weighted terms plus the attention's output) are folded together: the first waits (its input
    held, not copied: only depthscope's own models hand such weights, and they never change a tensor
    in place) until the second arrives, or the batch ends, and the terms are formed once for both.
    """

    def __init__(self, acc: Batch):
        super().__init__(acc)
        self.waiting: dict[str, tuple[int, Tensor, Split]] = {}  # base -> (consumer, input, weights)

    def consumer(self, i: int, h: Tensor, w: Tensor | Split) -> None:
        """Fold consumer i: input h [T, d] and its weights ``w``."""
        if isinstance(w, Split) and w.base is not None:
            if not w.extra:  # its extension comes later in the forward
                self.waiting[w.base] = (i, h, w)
                return
            if w.base in self.waiting:
                self._fold(*self.waiting.pop(w.base), also=(i, h, w))
                return
        self._fold(i, h, w)

    def end_batch(self) -> None:
        """Fold the consumers still waiting for an extension; then forget the batch's consumers."""
        for i, h, w in self.waiting.values():
            self._fold(i, h, w)
        self.waiting = {}
        if self.rows:  # the consumers' weight moments in groups: columns past a row's n stay 0
            acc, (_, first, _) = self.acc, self.rows[0]
            S, T = acc.V.shape[0], first.shape[0]  # noqa: N806
            step = max(1, acc.chunk // (8 * T * S))
            for a in range(0, len(self.rows), step):
                rows = self.rows[a : a + step]
                means = first.new_zeros(2, len(rows), T, S)  # [2, R, T, S]
                for r, (_, mean, magnitude) in enumerate(rows):
                    means[0, r, :, : mean.shape[1]] = mean
                    means[1, r, :, : mean.shape[1]] = magnitude
                idx = acc.index([i for i, _, _ in rows])
                acc.moments.add_tokens(idx, means[0], means[1], acc.chunk)
        super().end_batch()

    def _fold(
        self, i: int, h: Tensor, w: Tensor | Split, also: tuple[int, Tensor, Split] | None = None
    ) -> None:
        """Fold consumer i, and ``also`` the consumer whose weights extend its own by unit weights on
        the sources after its n.
        """
        acc, n, V = self.acc, self.acc.n_of(i), self.acc.V  # noqa: N806
        T, d = h.shape  # noqa: N806
        step = max(1, acc.chunk // (V.element_size() * n * d))
        # one size for every consumer of the batch (the workspace keeps a buffer of one shape)
        room = min(acc.chunk // V.element_size(), T * V.shape[0] * d)
        ws, size = acc.workspace, (max(min(T, step) * n * d, room),)
        terms = ws.buffer("feature terms", size, V)
        rebuilt = ws.buffer("feature rebuilt", (T, d), V)
        split = isinstance(w, Split)
        if split or isinstance(w, Factored):
            formed = ws.buffer("feature weights", size, V)
        if split:
            static = w.static.to(V.dtype).unsqueeze(1)  # [n, 1, d]
            gate = w.gate.to(V.dtype).T.unsqueeze(-1)  # [n, T, 1]
        elif isinstance(w, (Windows, Factored)):
            w = w.to(V.device, V.dtype)
        else:
            w = w.to(V.dtype)
        if also is not None:  # the extension: rebuilt2 = rebuilt + its unit sources; dots with both
            m = acc.n_of(also[0])
            rebuilt2 = ws.buffer("feature rebuilt (extension)", (T, d), V)
        dots, norms, means, dots2 = [], [], [], []  # per chunk: [n], [n, t], [2, n, t] (whole weights)
        windows = isinstance(w, Windows)  # whole weights with each window's first positions cut
        spans = w.spans(step) if windows else [(a, min(T, a + step)) for a in range(0, T, step)]
        for a, b in spans:
            shape = (n, b - a, d)
            if split:
                chunk = torch.add(static, gate[:, a:b], out=formed[: n * (b - a) * d].view(shape))
            else:
                if isinstance(w, Factored):
                    chunk = w.rows(a, b, out=formed[: n * (b - a) * d].view(b - a, n, d))
                else:
                    chunk = w.rows(a, b) if windows else w[a:b]
                chunk = chunk.transpose(0, 1)
                means.append(torch.stack([chunk.sum(-1), chunk.abs().sum(-1)]))
            c = torch.mul(V[:n, a:b], chunk, out=terms[: n * (b - a) * d].view(shape))  # V first: its layout
            r = torch.sum(c, 0, out=rebuilt[a:b])
            dots.append(torch.mv(c.view(n, -1), r.view(-1)))
            norms.append(torch.linalg.vector_norm(c, dim=-1))
            if also is not None:
                unit = V[n:m, a:b]
                r2 = torch.add(r, unit.sum(0), out=rebuilt2[a:b])
                dots2.append(
                    torch.cat([torch.mv(c.view(n, -1), r2.view(-1)), unit.reshape(m - n, -1) @ r2.view(-1)])
                )
        norms = acc.total(torch.cat(norms, 1), 1)
        if also is not None:
            j, h2, w2 = also
            norms2 = torch.cat([norms, acc.total(acc.norms[n:m], 1)])
            self._add(j, h2, w2, acc.total(torch.stack(dots2), 0), norms2, rebuilt2)
        self._add(i, h, w if split else None, acc.total(torch.stack(dots), 0), norms, rebuilt, means)

    def _add(
        self, i: int, h: Tensor, w: Split | None, dots: Tensor, norms: Tensor, rebuilt: Tensor, means=None
    ):
        """Add consumer i's sums: its dots and norms [n], its rebuild error (the buffer ``rebuilt``
        becomes the error), its weights' feature means per token (``Split`` w, or the whole
        weights' per chunk), whose moments ``end_batch`` adds for every consumer at once.
        """
        acc = self.acc
        acc.add_rows(i, dots, norms)  # |rebuilt|^2: the dots' sum, which it equals
        acc.add_error(i, acc.sq(rebuilt.sub_(h)), acc.sq(h))
        if w is not None:  # in the data's precision, summed in the moments' (float64)
            # the static part is the same in every batch: sorted once a capture
            ordered = acc.workspace.constant(("feature static", i), lambda: sorted_static(w.static))
            self.rows.append((i, *split_means(ordered, w.gate)))
        else:
            m = torch.cat(means, dim=2).transpose(1, 2) / h.shape[1]  # [2, T, n]
            self.rows.append((i, m[0], m[1]))


def sorted_static(b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """What ``split_means`` needs of a static part b [n, d]: b sorted along features, the prefix sums
    P_0 = 0 ... P_d of the sorted values [n, d + 1], and the mean [n].
    """
    ordered = b.sort(1).values
    return ordered, torch.nn.functional.pad(ordered.cumsum(1), (1, 0)), b.mean(1)


def split_means(static: tuple[Tensor, Tensor, Tensor], g: Tensor) -> tuple[Tensor, Tensor]:
    """The feature means of w = b + g and of |w| per token, [T, n] each, for b [n, d] (given as
    ``sorted_static(b)``) and g [T, n], without forming w: mean_f (b_f + g) = mean(b) + g, and with b
    sorted, k of its d values below -g and P_k their sum, sum_f |b_f + g| = (sum(b) - 2 P_k) + g (d - 2 k),
    a search and a gather.
    """
    ordered, prefix, mean = static
    d = ordered.shape[1]
    k = torch.searchsorted(ordered, -g.T.contiguous())  # [n, T]: how many b_f < -g
    magnitude = prefix[:, -1:] - 2 * prefix.gather(1, k) + g.T * (d - 2 * k)
    return mean + g, (magnitude / d).T


class PerBlock(Fold):
    """Block weights w [T, m, n, m] (``probes.terms.block_terms``): in cache-sized token chunks, the
    terms, their sum (the rebuilt input), the dots with it and the norms; the mixing the trace
    reports is ``block_mixing`` (the mean weight a fraction keeps in its own place).
    """

    def consumer(self, i: int, h: Tensor, w: Tensor) -> None:
        """Fold consumer i: input h [T, d] and its block weights ``w``."""
        acc = self.acc
        n, V = acc.n_of(i), acc.V  # noqa: N806
        T, d = h.shape  # noqa: N806
        w = w.to(V.dtype)
        step = max(1, acc.chunk // (V.element_size() * n * d))
        dots = torch.zeros(n, dtype=acc.dtype, device=V.device)
        norms = torch.zeros_like(dots)
        err = torch.zeros((), dtype=acc.dtype, device=V.device)
        for a in range(0, T, step):
            b = min(T, a + step)
            c = block_terms(w[a:b], V[:n, a:b])  # [n, t, d]
            r = c.sum(0)
            dots += (c.reshape(n, -1) @ r.reshape(-1)).to(acc.dtype)
            norms += acc.total(torch.linalg.vector_norm(c, dim=-1), 1)
            err = err + acc.sq(r - h[a:b])
        acc.add_rows(i, dots, norms)  # |rebuilt|^2: the dots' sum, which it equals
        acc.add_error(i, err, acc.sq(h))
        acc.moments.add_tokens(i, block_mixing(w), block_mixing(w.abs()), acc.chunk)


class Carried(Fold):
    """Post-LN consumers: their ``Terms`` directly (h = sum_s c_s to rounding).

    The dense terms are already in memory, so each statistic is one whole-tensor pass over them: the
    dots with the rebuilt input as matrix-vector products (one per window where the windows are views
    with a gap of skipped positions), the norms as one reduction; nothing of their size is allocated
    (token chunks measured slower here: per-chunk calls dominate). A vector term c_s[t] = a_s[t] v_s
    costs no pass over T x d per term: dots_s = sum <v_s, sum_t a_s[t] r_t> (one product of the
    factors with the rebuilt input for the whole group), norms_s = sum_t |a_s[t]| |v_s|. Each
    consumer's per-token mixing is copied into a workspace buffer [consumer, source, T] (the adapter
    updates its own in place) and folded for all of them at the batch's end.
    """

    def consumer(self, i: int, h: Tensor, terms: Terms) -> None:
        """Fold consumer i: input h [T, d] and its weights ``w``."""
        acc = self.acc
        n = terms.scale.shape[0]
        dense, r = terms.dense, terms.rebuilt
        dot = torch.zeros(n, dtype=acc.dtype, device=r.device)
        cnorm = torch.zeros_like(dot)
        m = dense.shape[0]
        if m:
            if dense[0].is_contiguous():  # one matrix-vector product
                dd = dense.reshape(m, -1) @ r.reshape(-1)
            else:  # one per window: the windows are views with a gap of skipped positions
                dd = sum(c.reshape(m, -1) @ rb.reshape(-1) for c, rb in zip(dense.unbind(1), r.unbind(0)))
            dot.index_add_(0, terms.dense_at, dd.to(acc.dtype))
            cnorm.index_add_(
                0, terms.dense_at, acc.total(torch.linalg.vector_norm(dense, dim=-1).reshape(m, -1), 1)
            )
        for v, at in terms.vecs:
            a = terms.scale[at]  # [k, batch, pos]
            if v.shape[2] == 1:  # the same at every token: <v_s, sum_t a_s[t] r_t>, one product
                y = a.reshape(a.shape[0], -1) @ r.reshape(-1, r.shape[-1])  # [k, d]
                dot.index_add_(0, at, acc.total(y * v.reshape(y.shape), 1))
            else:  # the same in every window: <v_s[p], r[b, p]> per token, then weighted by a_s
                dot.index_add_(0, at, acc.total((torch.einsum("bpd,spd->sbp", r, v[:, 0]) * a).flatten(1), 1))
            cnorm.index_add_(0, at, acc.total((a.abs() * torch.linalg.vector_norm(v, dim=-1)).flatten(1), 1))
        r = r.reshape(-1, r.shape[-1])
        acc.add_rows(i, dot, cnorm, acc.sq(r))
        acc.fold_error(i, h, r)
        mixing = terms.scale.reshape(n, -1)
        S, T = acc.V.shape[0], mixing.shape[1]  # noqa: N806
        if not self.rows:  # a consumer's columns past its n stay 0
            self.buf = acc.workspace.buffer("carried mixing", (acc.n_layers, S, T), mixing).zero_()
        self.buf[i, :n] = mixing
        self.rows.append(i)

    def end_batch(self) -> None:
        """Fold what waits for the whole batch; then forget the batch's consumers."""
        if self.rows:
            idx = self.acc.index(self.rows)
            w = self.buf.index_select(0, idx.to(self.buf.device))  # [R, S, T], in float64 a group at a time
            self.acc.moments.add_tokens(idx, w.transpose(1, 2), None, self.acc.chunk)
        super().end_batch()


def kind_of(w) -> str:
    """The fold of a consumer's weights: None (unit) or [n] (static): ``gram``; [T, n]: ``token``;
    [T, n, d], ``Windows``, ``Split`` or ``Factored``: ``feature``; [T, m, n, m]: ``block``;
    ``Terms``: ``carried``.
    """
    if isinstance(w, Terms):
        return "carried"
    if isinstance(w, (Split, Factored, Windows)):
        return "feature"
    if w is None or w.ndim == 1:
        return "gram"
    return {2: "token", 3: "feature"}.get(w.ndim, "block")


FOLDS = {"gram": Gram, "token": PerToken, "feature": PerFeature, "block": PerBlock, "carried": Carried}
