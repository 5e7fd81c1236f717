"""Does the weight matter? Direct logit attribution, the logit lens, and source ablation.

A heatmap of mixing weights says where a layer reads from, not whether that reading matters. These
views need the model's final norm and unembedding (``Adapter.head``) and run inside a capture
(``capture(..., logits=True, ablate=...)``); every statistic is over the positions that have a next
token, after any skipped positions, as float64 sums merged batch by batch.

* **Direct logit attribution** (Elhage et al. 2021): the read-out's final norm is linearised at
  each token's own statistics, x -> gamma * (x - mean x) / sigma(x) + beta for a LayerNorm and
  x -> gamma * x / rms(x) for an RMSNorm, which is exact for that forward pass; so the logit of a
  target token is sum_s <gamma * c_s' / sigma, W_U[t]> + <beta, W_U[t]> + b_U[t] over the
  read-out's terms c_s (c_s' centred for a LayerNorm). Targets: ``correct`` (the next token),
  ``top1`` (the model's own prediction) and ``margin`` (correct minus the best wrong token: the
  most telling of the three, since a source that raises every logit alike moves neither the
  prediction nor the loss). ``logit_attribution`` (source, target) is the token mean,
  ``logit_bias`` (target) the norm's and unembedding's biases, and ``logit_error`` (target) the
  relative error of the sum against the model's actual logits: checked, and refused above 1e-4.
* **Logit lens** (nostalgebraist 2020): each consumer's input (the mixed input the sublayer
  actually reads; for a multi-stream model that is the collapsed input, not one stream) decoded by
  the final norm and the unembedding: ``lens_loss`` (layer), cross-entropy in nats per token
  against the next token, and ``lens_agreement`` (layer), the fraction of tokens whose top-1 is
  the model's final top-1.
* **Source ablation**: ``ablation_effect`` (source) is the increase in loss (nats per token) when
  source s is removed from every later consumer's input: its term c[l, s] is subtracted at each
  consumer's mixed input (``mean`` ablation: replaced by its token mean), with the weights and
  sources of the ablated forward itself; ``ablation_effect_cell`` (layer, source) removes it from
  one consumer only. One forward per source (per cell), several in one batch. Needs consumer taps
  that are views of the stream (``Adapter.views``).

Legend: batch, pos, d_model, source, target (correct, top1, margin), vocab.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from depthscope.errors import DepthscopeError, TraceError
from depthscope.probes.adapters.base import Adapter, Head
from depthscope.probes.settings import ABLATE
from depthscope.probes.terms import Split, block_terms, whole

TARGETS = ("correct", "top1", "margin")


def require_head(ad: Adapter, what: str) -> Head:
    """The adapter's final norm and unembedding; DepthscopeError naming ``what`` if the model has none."""
    if ad.head is None:
        if ad.family == "spec":
            raise DepthscopeError(
                f"{what} needs the model's LM head: name it in the spec, ModelSpec(head=('FINAL_NORM', "
                "'UNEMBEDDING')) (module paths; by default the read-out module and lm_head, which this "
                "model does not have)"
            )
        raise DepthscopeError(
            f"{what} needs the model's LM head, and this {ad.family} model has none (an encoder?)"
        )
    return ad.head


class Sums:
    """Plain float64 sums over tokens (``FIELDS``), so a probe's state saves and merges by addition."""

    FIELDS: tuple[str, ...] = ()

    def state(self) -> dict[str, np.ndarray]:
        """The sums as float64 arrays by field name: what a partial capture saves and ``merge`` adds."""
        return {f: np.array(getattr(self, f), dtype=np.float64) for f in self.FIELDS}

    def merge(self, state: dict[str, np.ndarray]) -> None:
        """Add the sums of another ``state`` (a saved partial capture, another process's) to these."""
        for f in self.FIELDS:
            value = getattr(self, f) + state[f]
            setattr(self, f, value if isinstance(value, np.ndarray) else float(value))


class LogitProbe(Sums):
    """Direct logit attribution (and, with ``lens``, the logit lens), summed over a capture's batches.

    The attribution never builds the read-out's [T, source, d_model] terms: with x_t the target's
    unembedding row times the norm's gain (centred for a LayerNorm, which moves the centring from
    the terms to x), <c_s, x_t> = w_s <v_s, x_t> is one batched product over the source buffer
    for the three targets at once.
    """

    FIELDS = ("attr", "bias", "err", "actual", "lens_ce", "lens_agree", "loss", "tokens")

    def __init__(self, ad: Adapter, skip: int, lens: bool = False):
        self.head = require_head(ad, "--logits")
        self.skip, self.lens_on = skip, lens
        n_l, n_s = len(ad.consumers), len(ad.sources)
        self.attr = np.zeros((n_s, len(TARGETS)))
        self.bias = np.zeros(len(TARGETS))
        self.err = np.zeros(len(TARGETS))
        self.actual = np.zeros(len(TARGETS))
        self.lens_ce = np.zeros(n_l)
        self.lens_agree = np.zeros(n_l)
        self.loss = 0.0
        self.tokens = 0.0
        self._top1: dict[int, Tensor] = {}
        self._readout: tuple | None = None
        self._next: Tensor | None = None

    def new_batch(self, chunk: Tensor) -> None:
        """Start a batch of windows [batch, pos]: its next tokens are the targets."""
        if chunk.shape[1] - 1 <= self.skip:
            raise DepthscopeError(
                f"windows of {chunk.shape[1]} leave no position with a next token after {self.skip} skipped"
            )
        self._next, self._top1, self._readout = chunk[:, self.skip + 1 :], {}, None

    @staticmethod
    def _cut(t: Tensor) -> Tensor:
        """Tensors arrive with the skipped positions already cut: drop the last (no next token)."""
        return t[:, :-1]

    @torch.no_grad()
    def lens(self, i: int, h: Tensor) -> None:
        """Consumer i's input [batch, pos, d_model] (skipped positions cut): decoded, scored."""
        logits = self.head.logits(self._cut(h).to(self.head.W_U.device)).double()
        nxt = self._next.to(logits.device)
        self.lens_ce[i] += float(F.cross_entropy(logits.flatten(0, 1), nxt.flatten(), reduction="sum"))
        self._top1[i] = logits.argmax(-1)

    def readout(self, h: Tensor, kind: str, w: Tensor | None, values: Tensor) -> None:
        """The read-out's input [batch, pos, d] and how it is made: ``kind`` ``unit`` (w None), ``static``
        (w [n]), ``token`` (w [T, n]), ``feature`` (w [T, n, d]) or ``terms`` (w: terms [n, T, d]),
        over ``values`` [n, T, d] (the source buffer; T = batch x pos).
        """
        self._readout = (h, kind, w, values)

    @torch.no_grad()
    def end_batch(self, logits: Tensor) -> None:
        """The model's logits [batch, pos, vocab]: the loss, the lens agreement, the attribution.

        The logits are read in token chunks (no float64 copy of the whole [T, vocab] array: 400 MB
        for 1024 tokens of a 49k vocabulary), each chunk in float64.
        """
        logits = logits[:, self.skip : -1]
        nxt = self._next = self._next.to(logits.device)
        flat, targets = logits.flatten(0, 1), nxt.flatten()
        step = max(1, (1 << 24) // (8 * flat.shape[-1]))  # 16 MB of float64 logits at a time
        loss = flat.new_zeros((), dtype=torch.float64)
        top1, wrong, picked = [], [], []
        for a in range(0, flat.shape[0], step):
            x, t = flat[a : a + step].double(), targets[a : a + step]
            correct = x.gather(-1, t[:, None]).squeeze(-1)
            loss += (torch.logsumexp(x, -1) - correct).sum()
            best = x.topk(2, dim=-1)
            first = best.indices[:, 0]
            runner = torch.where(first == t, best.indices[:, 1], first)  # the best wrong token
            top1.append(first)
            wrong.append(runner)
            margin = correct - x.gather(-1, runner[:, None]).squeeze(-1)
            picked.append(torch.stack([correct, best.values[:, 0], margin], -1))
        self.loss += float(loss)
        self.tokens += nxt.numel()
        shape = nxt.shape
        top1_all = torch.cat(top1).view(shape)
        for i, pred in self._top1.items():
            self.lens_agree[i] += float((pred.to(top1_all.device) == top1_all).sum())
        if self._readout is None:
            raise TraceError("the read-out consumer did not fire: no logit attribution")
        actual = torch.cat(picked).view(*shape, len(TARGETS)).double()
        self._attribute(top1_all, torch.cat(wrong).view(shape), actual)

    def _targets(self, top1: Tensor, wrong: Tensor) -> tuple[Tensor, Tensor]:
        """Per token, for correct, top1 and margin: unembedding rows u [b, p', 3, d] and unembedding
        biases [b, p', 3] (p' = positions with a next token).
        """
        head = self.head
        dev = head.W_U.device
        nxt, top1, wrong = self._next.to(dev), top1.to(dev), wrong.to(dev)
        W_U = head.W_U  # noqa: N806 (the usual name)
        rows = lambda t: W_U[t].to(dev, torch.float64)  # noqa: E731  (the rows needed, not a float64 W_U)
        u = torch.stack([rows(nxt), rows(top1), rows(nxt) - rows(wrong)], dim=2)
        if head.b_U is None:
            b = u.new_zeros(u.shape[:-1])
        else:
            bias = lambda t: head.b_U[t].to(dev, torch.float64)  # noqa: E731
            b = torch.stack([bias(nxt), bias(top1), bias(nxt) - bias(wrong)], dim=2)
        return u, b

    def _attribute(self, top1: Tensor, wrong: Tensor, actual: Tensor) -> None:
        """Each read-out term's share of the correct, top-1 and margin logits, checked against the
        model's own (``actual`` [b, p', 3]).
        """
        head = self.head
        h, kind, w, values = self._readout
        dev = values.device
        u, b = (x.to(dev) for x in self._targets(top1, wrong))
        actual = actual.to(dev)
        hc = self._cut(h).to(dev, torch.float64)
        if head.centred:
            hc = hc - hc.mean(-1, keepdim=True)
        inv = torch.rsqrt(hc.pow(2).mean(-1) + head.eps)  # [b, p']
        gamma = head.weight.to(dev, torch.float64) if head.weight is not None else 1.0
        x = u * gamma
        if head.centred:
            x = x - x.mean(-1, keepdim=True)
        beta = head.bias.to(dev, torch.float64) if head.bias is not None else None
        bias = b + (u @ beta if beta is not None else 0.0)  # [b, p', 3]
        n_b, p = h.shape[0], h.shape[1]
        x_full = x.new_zeros(n_b, p, len(TARGETS), x.shape[-1])  # zero at each window's last position
        x_full[:, :-1] = x * inv[..., None, None]
        attr = self._dots(kind, w, values, x_full.flatten(0, 1).to(values.dtype))  # [T, n, 3]
        attr = attr.unflatten(0, (n_b, p))[:, :-1].to(torch.float64)  # [b, p', n, 3]
        total = attr.sum(2) + bias
        n = attr.shape[2]
        sums = (
            torch.cat(
                [
                    attr.sum((0, 1)).flatten(),
                    bias.sum((0, 1)),
                    (total - actual).pow(2).sum((0, 1)),
                    actual.pow(2).sum((0, 1)),
                ]
            )
            .cpu()
            .numpy()
        )
        k = len(TARGETS)
        self.attr[:n] += sums[: n * k].reshape(n, k)
        self.bias += sums[n * k : n * k + k]
        self.err += sums[n * k + k : n * k + 2 * k]
        self.actual += sums[n * k + 2 * k :]

    @staticmethod
    def _dots(kind: str, w: Tensor | None, values: Tensor, x: Tensor) -> Tensor:
        """<c_s, x_t,k> for every token t, source s and target k: [T, n, 3], from the source buffer
        [n, T, d] and the read-out's weights (``readout``'s kinds), x [T, 3, d].
        """
        if kind == "terms":  # terms [n, T, d]
            return torch.bmm(w.transpose(0, 1).to(x.dtype), x.transpose(1, 2))
        v = values.transpose(0, 1)  # [T, n, d]
        if kind == "feature":
            return torch.bmm(w * v, x.transpose(1, 2))
        g = torch.bmm(v, x.transpose(1, 2))  # [T, n, 3]
        if kind == "unit":
            return g
        if kind == "static":
            return g * w.to(g.dtype)[None, :, None]
        return g * w[..., None]  # per-token weights [T, n]

    def check(self, tol: float) -> np.ndarray:
        """Relative error of the attribution against the actual logits, per target; refused above tol."""
        err = np.sqrt(self.err / np.maximum(self.actual, 1e-300))
        if not np.all(err <= tol):
            k = int(np.nanargmax(np.where(np.isnan(err), np.inf, err)))
            raise TraceError(
                f"direct logit attribution does not add up to the {TARGETS[k]} logits (relative error "
                f"{err[k]:.3g}, tolerance {tol:g}): the final norm or unembedding is not the one read"
            )
        return err

    def variables(self, tol: float) -> dict[str, tuple]:
        """The probe's trace variables (token means), after checking the attribution adds up."""
        n = max(self.tokens, 1)
        err = self.check(tol)
        out = {
            "logit_attribution": (("source", "target"), self.attr / n),
            "logit_bias": (("target",), self.bias / n),
            "logit_error": (("target",), err),
        }
        if self.lens_on:
            out["lens_loss"] = (("layer",), self.lens_ce / n)
            out["lens_agreement"] = (("layer",), self.lens_agree / n)
        return out


def units(ad: Adapter, mode: str) -> list[tuple[int, int | None]]:
    """(source, consumer or None = every consumer that reads it) of each ablation."""
    if mode == "sources":
        return [(j, None) for j in range(len(ad.sources)) if any(c.n_sources > j for c in ad.consumers)]
    return [(j, i) for i, c in enumerate(ad.consumers) for j in range(c.n_sources)]


class Ablation(Sums):
    """Runs the ablated forwards of one batch and sums their losses per unit."""

    FIELDS = ("loss", "clean", "tokens")

    def __init__(self, ad: Adapter, skip: int, mode: str, mean: bool = False, group: int = 4):
        require_head(ad, "--ablate")
        if mode not in ABLATE:
            raise DepthscopeError(f"ablate must be one of {', '.join(ABLATE)}, got {mode!r}")
        if not ad.views:
            why = f" ({ad.attrs['not_views']})" if ad.attrs.get("not_views") else ""
            raise DepthscopeError(
                f"ablation needs consumer inputs that are views of the stream; a {ad.family} model's are not"
                f"{why}"
            )
        if any(c.terms for c in ad.consumers):
            raise DepthscopeError(
                f"ablation of a {ad.family} model (terms through its norms) is not supported"
            )
        self.ad, self.skip, self.mode, self.mean, self.group = ad, skip, mode, mean, group
        self.units = units(ad, mode)
        self.loss = np.zeros(len(self.units))
        self.clean = 0.0  # the unablated loss summed over the same tokens
        self.tokens = 0.0

    @torch.no_grad()
    def run(self, model: Any, chunk: Tensor) -> None:
        """The unablated and the ablated forwards of ``chunk`` (windows [n, pos])."""
        nxt = chunk[:, self.skip + 1 :]
        logits = self.ad.logits(self.ad.forward(model, chunk))[:, self.skip : -1].double()
        self.clean += float(
            F.cross_entropy(logits.flatten(0, 1), nxt.to(logits.device).flatten(), reduction="sum")
        )
        self.tokens += nxt.numel()
        for start in range(0, len(self.units), self.group):
            batch = self.units[start : start + self.group]
            tokens = chunk.repeat(len(batch), 1)
            with self.attach(model, batch, chunk.shape[0]):
                logits = self.ad.logits(self.ad.forward(model, tokens))
            logits = logits[:, self.skip : -1].double().unflatten(0, (len(batch), chunk.shape[0]))
            nxt = nxt.to(logits.device)
            for g in range(len(batch)):
                ce = F.cross_entropy(logits[g].flatten(0, 1), nxt.flatten(), reduction="sum")
                self.loss[start + g] += float(ce)

    @contextlib.contextmanager
    def attach(self, model: Any, batch: list[tuple[int, int | None]], size: int) -> Iterator[None]:
        """While active, the forward of ``batch`` (the windows repeated, ``size`` rows per unit) loses each
        unit's source term at the consumers it names (all that read it when None), in that unit's rows.

        The term comes from the ablated forward's own sources and weights; with ``mean`` its token mean
        stays (mean ablation).
        """
        ad = self.ad
        values: dict[int, Tensor] = {}
        weights: dict[int, Tensor] = {}

        def on_source(j: int):
            def hook(t: Tensor) -> None:
                values[j] = t.clone()  # as written: research code may update a module's output in place

            return hook

        def on_weights(i: int):
            def hook(t: Tensor | Split) -> None:
                weights[i] = whole(t)  # (an ablation's term needs them whole)

            return hook

        def on_input(i: int):
            spec = ad.consumers[i]

            def hook(h: Tensor) -> Tensor | None:
                hit = [
                    (g, j) for g, (j, only) in enumerate(batch) if j < spec.n_sources and only in (None, i)
                ]
                if not hit:
                    return None
                h = h.clone()
                for g, j in hit:
                    rows = slice(g * size, (g + 1) * size)
                    term = self._term(spec, j, values[j], weights.get(i), rows)
                    h[rows] = h[rows] - term.to(h.device, h.dtype)
                return h

            return hook

        taps = [(s.tap, on_source(j)) for j, s in enumerate(ad.sources)]
        taps += [(c.weights, on_weights(i)) for i, c in enumerate(ad.consumers) if c.weights is not None]
        taps += [(c.tap, on_input(i)) for i, c in enumerate(ad.consumers)]
        with ad.attach(model, taps):
            yield

    def _term(self, spec: Any, j: int, value: Tensor, w: Tensor | None, rows: slice) -> Tensor:
        """Source j's term in one consumer's input, in one unit's rows (its token mean kept when
        ablating by the mean).
        """
        v = value[rows] if value.shape[0] > 1 else value
        if w is not None:  # (on the weights' device: a device map may put them elsewhere)
            if w.ndim == 5:  # block weights [batch, pos, m, n, m]: the source's fractions mixed
                term = block_terms(w[rows][..., j : j + 1, :], v.to(w.device)[None])[0]
            else:
                term = (w[rows][..., j, None] if w.ndim == 3 else w[rows][..., j, :]) * v.to(w.device)
        else:  # unit weights, or the consumer's static weight on that source
            term = v * spec.static[j] if spec.static else v
        return term - term.mean((0, 1), keepdim=True) if self.mean else term

    def variables(self, layers: int, sources: int) -> dict[str, tuple]:
        """The loss increase in nats per token: ``ablation_effect`` (source) or ``ablation_effect_cell``
        (layer, source), NaN where nothing was ablated.
        """
        effect = (self.loss - self.clean) / max(self.tokens, 1)
        if self.mode == "sources":
            out = np.full(sources, np.nan)
            for (j, _), e in zip(self.units, effect):
                out[j] = e
            return {"ablation_effect": (("source",), out)}
        cells = np.full((layers, sources), np.nan)
        for (j, i), e in zip(self.units, effect):
            cells[i, j] = e
        return {"ablation_effect_cell": (("layer", "source"), cells)}
