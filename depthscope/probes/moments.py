"""Running means and spreads that merge exactly: the consumers' weights and the sources' covariances.

Both use Chan et al.'s parallel update (Chan, Golub and LeVeque 1979: two summaries of n_a and n_b
samples with means m_a, m_b and centred sums of squares M2_a, M2_b give n = n_a + n_b,
m = m_a + (m_b - m_a) n_b / n, M2 = M2_a + M2_b + (m_b - m_a)^2 n_a n_b / n), so batches, shards of
a capture and resumed partial states add up to one pass's numbers with no E[w^2] - E[w]^2
cancellation. States are plain float64/int64 NumPy arrays, under the keys a partial state has
always had (``sums.mix``, ``sums.mix_abs``, ``sums.mix_sq``, ``seen``; ``cov.n``, ``cov.mean``,
``cov.m2``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def host(t: Tensor) -> np.ndarray:
    """A float64 NumPy copy of ``t``."""
    return t.detach().to("cpu", torch.float64).numpy().copy()


class Moments:
    """Per consumer and source: the token mean of the weight (``mix``), of its magnitude
    (``mix_abs``) and the weight's M2 (``mix_sq``), over the ``seen`` tokens of each consumer.
    """

    KEYS = ("mix", "mix_abs", "mix_sq")

    def __init__(self, n_layers: int, n_sources: int, dtype: torch.dtype = torch.float64):
        self.sums = {k: torch.zeros(n_layers, n_sources, dtype=dtype) for k in self.KEYS}
        self.seen = torch.zeros(n_layers, dtype=dtype)

    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        """Move the sums (the engine keeps them on the model's device)."""
        self.sums = {k: t.to(device, dtype) for k, t in self.sums.items()}
        self.seen = self.seen.to(device, dtype)

    def add(self, idx, m_b: Tensor, m2_b: Tensor, abs_b: Tensor, n_b) -> None:
        """Merge a batch's weight means ``m_b``, their M2 and mean magnitudes (each [n] for one
        consumer ``idx``, or [R, n] for consumers ``idx`` [R], each once) over its ``n_b`` tokens (a
        number, or [R] per consumer) into the first n sources. Whole rows (n = S) are exact too: a
        source a consumer does not read has weight 0 in every batch. Into an empty summary the batch's
        numbers are taken as they are (a fraction of exactly 1), so a shard's merge moves no bit.
        """
        s, n = self.sums, m_b.shape[-1]
        n_a = self.seen[idx]
        # a count of tokens as a fill, not a tensor made on the host (on a GPU a copy that waits)
        n_b = n_b.to(n_a.dtype).expand_as(n_a) if isinstance(n_b, Tensor) else torch.full_like(n_a, n_b)
        frac = (n_b / torch.clamp(n_a + n_b, min=1.0)).unsqueeze(-1)
        delta = m_b - s["mix"][idx, :n]
        s["mix"][idx, :n] += delta * frac
        s["mix_sq"][idx, :n] += m2_b + delta.pow(2) * n_a.unsqueeze(-1) * frac
        s["mix_abs"][idx, :n] += (abs_b - s["mix_abs"][idx, :n]) * frac
        self.seen[idx] += n_b

    def add_tokens(self, idx, w: Tensor, w_abs: Tensor | None, group: int) -> None:
        """Merge per-token weights ``w`` [..., T, n] and their magnitudes ``w_abs`` (None: |w|) of
        consumer(s) ``idx``; the consumers of ``w`` [R, T, n] in groups of at most ``group`` bytes of
        float64 weights (the folds' chunk), each group converted and its magnitudes taken on its own:
        on a CPU whole-batch temporaries of several MB cost more to allocate than their arithmetic
        (a post-LN BERT's 17 x 36 x 2048 weights: 24 ms a batch at once, 4 ms in 1 MB groups). Each
        consumer's moments are its own, so any grouping gives the same numbers.
        """
        if w.ndim == 3:
            step = max(1, group // (8 * w[0].numel()))
            if step < w.shape[0]:
                for a in range(0, w.shape[0], step):
                    part = None if w_abs is None else w_abs[a : a + step]
                    self._add_tokens(idx[a : a + step], w[a : a + step], part)
                return
        self._add_tokens(idx, w, w_abs)

    def _add_tokens(self, idx, w: Tensor, w_abs: Tensor | None) -> None:
        w = w.to(self.seen.dtype)
        w_abs = w.abs() if w_abs is None else w_abs.to(self.seen.dtype)
        first = w[..., :1, :]  # shifted by the first token: weights the same at every token (a GRN-v2's)
        m_b = first.squeeze(-2) + (w - first).mean(-2)  # have exactly that mean, in any shard
        m2_b = (w - m_b.unsqueeze(-2)).pow(2).sum(-2)
        self.add(idx, m_b, m2_b, w_abs.mean(-2), w.shape[-2])

    def state(self) -> dict[str, np.ndarray]:
        """The sums as arrays (``seen`` as integers)."""
        out = {f"sums.{k}": host(v) for k, v in self.sums.items()}
        out["seen"] = host(self.seen).round().astype(np.int64)
        return out

    def merge(self, state: dict[str, np.ndarray]) -> None:
        """Add another run's ``state`` (its tokens after this one's), per consumer by the tokens seen."""
        dev = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64)).to(self.seen)  # noqa: E731
        every = torch.arange(len(self.seen), device=self.seen.device)
        self.add(every, *(dev(state[f"sums.{k}"]) for k in ("mix", "mix_sq", "mix_abs")), dev(state["seen"]))


class Covariance:
    """Each source's running mean and scatter matrix over tokens (d x d per source), over every token
    and over every other batch (``half``: the even batches, for how far a rank estimate has
    converged: the same estimate from half the tokens).
    """

    def __init__(self) -> None:
        self.parts: dict[int, list] = {}  # source -> [tokens, mean (d,), M2 (d, d)]
        self.half: dict[int, list] = {}  # the same over the even batches

    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        """Move the sums."""
        for held in (self.parts, self.half):
            for j, (n, m, m2) in list(held.items()):
                held[j] = [n, m.to(device, dtype), m2.to(device, dtype)]

    def add(self, j: int, x: Tensor, dtype: torch.dtype, half: bool = False) -> None:
        """Merge a batch [T, d] of source j, its scatter formed in the data's dtype, summed in ``dtype``
        (into the half's sums too when ``half``).
        """
        mean_b = x.mean(0, dtype=torch.float64 if dtype == torch.float64 else x.dtype)
        centred = x - mean_b.to(x.dtype)
        part = [x.shape[0], mean_b.to(dtype), (centred.T @ centred).to(dtype)]
        for held in (self.parts, self.half) if half else (self.parts,):
            held[j] = part if j not in held else _chan(held[j], part)

    def tensors(self) -> list[Tensor]:
        """Every sum (for the finiteness check)."""
        return [t for held in (self.parts, self.half) for _, m, m2 in held.values() for t in (m, m2)]

    def state(self, n_sources: int, d: int) -> dict[str, np.ndarray]:
        """The summaries as arrays [source, ...] (zero tokens where a source has none)."""
        out = {}
        for prefix, held in (("cov.", self.parts), ("cov.half.", self.half)):
            out[f"{prefix}n"] = np.zeros(n_sources, dtype=np.int64)
            out[f"{prefix}mean"], out[f"{prefix}m2"] = np.zeros((n_sources, d)), np.zeros((n_sources, d, d))
            for j, (n, mean, m2) in held.items():
                out[f"{prefix}n"][j], out[f"{prefix}mean"][j], out[f"{prefix}m2"][j] = n, host(mean), host(m2)
        return out

    def merge(self, state: dict[str, np.ndarray], like: Tensor) -> None:
        """Add another run's summaries (on ``like``'s device and dtype)."""
        dev = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64)).to(like)  # noqa: E731
        for prefix, held in (("cov.", self.parts), ("cov.half.", self.half)):
            if f"{prefix}n" not in state:  # a partial state from before the half was kept
                continue
            for j in np.flatnonzero(state[f"{prefix}n"]):
                other = [
                    int(state[f"{prefix}n"][j]),
                    dev(state[f"{prefix}mean"][j]),
                    dev(state[f"{prefix}m2"][j]),
                ]
                held[int(j)] = other if int(j) not in held else _chan(held[int(j)], other)

    def spectra(self, n_sources: int, d: int, half: bool = False) -> np.ndarray:
        """Eigenvalues of each source's covariance (or the half's), descending: [source, component]."""
        out = np.full((n_sources, d), np.nan)
        for j, (n, _, m2) in (self.half if half else self.parts).items():
            out[j] = np.linalg.eigvalsh(host(m2) / max(n - 1, 1))[::-1].clip(min=0.0)
        return out

    def tokens(self, half: bool = False) -> int:
        """Tokens summed (of the half): the most any source holds."""
        return max((n for n, _, _ in (self.half if half else self.parts).values()), default=0)


def _chan(a: list, b: list) -> list:
    """Merge two [tokens, mean, M2] covariance summaries."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    delta = mean_b - mean_a
    return [n, mean_a + delta * n_b / n, m2_a + m2_b + torch.outer(delta, delta) * n_a * n_b / n]
