"""What an adapter may hand the engine instead of plain weights tensors.

``Terms``: a post-LN consumer's terms. A LayerNorm acts on each token as a fixed linear map times
that token's 1/sigma, so every source's term can be carried through the later LayerNorms exactly
(``probes.adapters.carry``); ``Terms`` is how they travel, source-major, with the terms that are
one vector per position kept as vectors.

``Split``: per-feature weights that are a static per-feature part plus a per-token scalar
(GRN-v2/v3 and DCA, ``probes.adapters.grn``), handed in those two parts.

``Factored``: per-feature weights that are a per-token product of two small factors (a gated
residual's stream weights unrolled over the sources it wrote: qwen4_exp), formed a chunk of tokens
at a time by the engine.

Block weights (Frac-Connections, arXiv 2503.14125): a plain tensor w [..., frac, source, frac]
(``block_terms``): the features fall into m equal fractions and source s's term in fraction f of
the input is sum_g w[f, s, g] times fraction g of the source, so a term is the source's
fractions mixed, not the source scaled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


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


@dataclass(frozen=True)
class Split:
    """Per-feature weights w[..., s, f] = static[s, f] + gate[..., s] (arXiv 2502.06785, Sec. 3: a
    GRN-v3 coefficient b_i + relu(w . N(g_i))), never formed whole: ``static`` [n, d_model],
    ``gate`` [batch, pos, n] (``flat``: [T, n]).

    ``base``: a key shared by two consumers whose weights agree: the one with ``extra`` 0 and the one
    with the same static and gate on those sources plus ``extra`` sources of weight 1 after them (a DCA
    block's query view and its MLP, which reads the query's input plus the attention's output). The
    engine then forms their terms once (``probes.folds.PerFeature``).
    """

    static: Tensor
    gate: Tensor
    base: str | None = None
    extra: int = 0

    def cut(self, skip: int) -> Split:
        """Without the first ``skip`` positions of every window (a view)."""
        return replace(self, gate=self.gate[:, skip:]) if skip else self

    def to(self, device: torch.device, dtype: torch.dtype) -> Split:
        """Both parts on ``device`` in ``dtype``."""
        return replace(self, static=self.static.to(device, dtype), gate=self.gate.to(device, dtype))

    def flat(self) -> Split:
        """The gate's (batch, pos) flattened to tokens: [T, n]."""
        return replace(self, gate=self.gate.flatten(0, 1))

    def full(self) -> Tensor:
        """The whole weights [..., n, d_model] (the read-out's logit attribution; the tests)."""
        return self.static + self.gate.unsqueeze(-1)


@dataclass(frozen=True)
class Windows:
    """Whole per-feature weights [batch, pos, n, d_model] with the first ``skip`` positions of every
    window cut, kept uncut and flattened (``flat`` [batch * window, n, d_model], a view of the
    adapter's tensor): a token chunk inside one window is then a view too (``rows``), where the cut
    flattened to tokens [T, n, d_model] is a copy of weights d_model times a per-token weight's size.
    """

    flat: Tensor
    window: int  # positions per window, uncut
    skip: int

    @classmethod
    def of(cls, w: Tensor, skip: int) -> Windows:
        """``w`` [batch, pos, n, d_model] with its first ``skip`` positions of each window to be cut."""
        return cls(w.flatten(0, 1), w.shape[1], skip)

    @property
    def kept(self) -> int:
        """Tokens kept per window."""
        return self.window - self.skip

    def to(self, device: torch.device, dtype: torch.dtype) -> Windows:
        """On ``device`` in ``dtype``."""
        return replace(self, flat=self.flat.to(device, dtype))

    def spans(self, step: int) -> list[tuple[int, int]]:
        """Token ranges (a, b) of at most ``step`` tokens covering every kept token in order, none
        crossing a window's end (so each is one ``rows`` view).
        """
        kept, windows = self.kept, self.flat.shape[0] // self.window
        return [
            (r * kept + a, r * kept + min(kept, a + step))
            for r in range(windows)
            for a in range(0, kept, step)
        ]

    def rows(self, a: int, b: int) -> Tensor:
        """The weights of kept tokens a..b [b - a, n, d_model] (inside one window: ``spans``)."""
        r, o = divmod(a, self.kept)
        if b - a > self.kept - o:
            raise ValueError(f"tokens {a}..{b} cross the end of window {r}")
        start = r * self.window + self.skip + o
        return self.flat[start : start + (b - a)]

    def full(self) -> Tensor:
        """The kept tokens' weights whole [T, n, d_model] (a copy: the read-out's attribution, tests)."""
        return self.flat.unflatten(0, (-1, self.window))[:, self.skip :].flatten(0, 1)


@dataclass(frozen=True)
class Factored:
    """Per-feature weights w[..., s, f] = sum_k coef[..., k, s] basis[..., k, f], never formed whole:
    ``coef`` [batch, pos, k, n] (each of k streams' share of each source), ``basis`` [batch, pos, k,
    d_model] (what a read weighs each stream's channels by); ``flat``: [T, k, n] and [T, k, d_model].
    Formed whole in memory they are d_model / k times the factors' size, and building them cost more
    than the fold that reads them; the engine forms them a chunk of tokens at a time, in cache
    (``probes.folds.PerFeature``), by the same products in the same dtype (``rows``).
    """

    coef: Tensor
    basis: Tensor

    def cut(self, skip: int) -> Factored:
        """Without the first ``skip`` positions of every window (views)."""
        return replace(self, coef=self.coef[:, skip:], basis=self.basis[:, skip:]) if skip else self

    def to(self, device: torch.device, dtype: torch.dtype) -> Factored:
        """Both factors on ``device`` in ``dtype``."""
        return replace(self, coef=self.coef.to(device, dtype), basis=self.basis.to(device, dtype))

    def flat(self) -> Factored:
        """(batch, pos) flattened to tokens."""
        return replace(self, coef=self.coef.flatten(0, 1), basis=self.basis.flatten(0, 1))

    def rows(self, a: int, b: int, out: Tensor | None = None) -> Tensor:
        """The weights of flat tokens a..b [b - a, n, d_model] (into ``out`` where given)."""
        return torch.matmul(self.coef[a:b].mT, self.basis[a:b], out=out)

    def full(self) -> Tensor:
        """The whole weights [..., n, d_model] (the read-out's logit attribution; the tests)."""
        return torch.matmul(self.coef.mT, self.basis)


def whole(w: Tensor | Split | Factored) -> Tensor:
    """Weights as one tensor: ``Split`` and ``Factored`` ones formed whole (for what reads a few
    tokens, or needs them so).
    """
    return w.full() if isinstance(w, (Split, Factored)) else w


def block_terms(w: Tensor, values: Tensor) -> Tensor:
    """The terms of block weights: w [..., m, n, m] (fraction of the input, source, fraction of the
    source) and the sources ``values`` [n, ..., d] with d = m * (d / m) -> [n, ..., d], term s in
    fraction f being sum_g w[..., f, s, g] values[s, ..., g-th fraction].
    """
    m = w.shape[-1]
    v = values.unflatten(-1, (m, values.shape[-1] // m))  # [n, ..., m, d/m]
    return torch.einsum("...fsg,s...gk->s...fk", w.to(v.dtype), v).flatten(-2)


def block_mixing(w: Tensor) -> Tensor:
    """What the trace reports as block weights' mixing: w [..., m, n, m] -> [..., n], the mean over
    fractions of w[f, s, f], the weight a fraction of the source keeps in its own place. It is the
    trace of the source's linear map over d (the mean of its diagonal, as per-feature weights
    report their feature mean), and the scalar weight itself where the blocks are a multiple of the
    identity.
    """
    return w.diagonal(dim1=-3, dim2=-1).mean(-1)
