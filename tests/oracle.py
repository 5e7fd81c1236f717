"""A dense float64 oracle of the trace's table, for the engine's tests.

One forward over every window at once with a callback on each of the adapter's taps keeps every
source output, consumer input, weight and native quantity in float64; each consumer's terms
c[l, s] [source, batch, pos, d] are then materialised whole (unit, static, per-token or
per-feature weights times the sources, block weights fraction by fraction; post-LN terms as the
adapter hands them) and every statistic
of ``depthscope.trace.format`` is one einsum or reduction over all tokens at once: no batches, no
Gram products, no merges, none of the engine's buffers.

It listens on the adapter's own taps and compares arrays by position: it proves the engine's
arithmetic, not which module each label belongs to (a reversed list of source labels passes it).
The labels are checked by ``tests/probes/layouts.py``: every family's sources and consumer inputs
written out as module paths, read with plain torch hooks, compared cell by label.
"""

from __future__ import annotations

import numpy as np
import torch

from depthscope.probes.adapters.base import evaluating
from depthscope.probes.terms import Factored, Split, Terms

SCALE = {"mixing_std": "mixing_abs"}  # a spread of weights constant over tokens is their rounding
TABLE = ("mixing", "mixing_abs", "mixing_std", "contribution_share", "norm_share")


def record(model, ad, tokens: torch.Tensor) -> dict[str, dict]:
    """Every tap's value in float64 (post-LN terms as (terms [n, b, p, d], mixing [n, b, p]))."""
    got: dict[str, dict] = {"v": {}, "h": {}, "w": {}, "native": {}}

    def keep(kind: str, key):
        def fn(t):
            if isinstance(t, Terms):  # the adapter reuses its buffers: copied now
                got[kind][key] = (t.full().double().clone(), t.scale.double().clone())
            elif isinstance(t, Split):  # per-feature weights in two parts, whole here
                got[kind][key] = t.full().double()
            elif isinstance(t, Factored):  # per-feature weights as two factors: their product, in float64
                got[kind][key] = torch.matmul(t.coef.double().mT, t.basis.double())
            else:
                got[kind][key] = t.detach().double().clone()

        return fn

    taps = [(s.tap, keep("v", j)) for j, s in enumerate(ad.sources)]
    for i, c in enumerate(ad.consumers):
        taps.append((c.tap, keep("h", i)))
        if c.weights is not None:
            taps.append((c.weights, keep("w", i)))
    taps += [(n.tap, keep("native", k)) for k, n in enumerate(ad.native)]
    with evaluating(model), torch.no_grad(), ad.attach(model, taps):
        ad.forward(model, tokens)
    return got


def oracle(model, ad, tokens: torch.Tensor, skip: int | None = None) -> dict[str, np.ndarray]:
    """The trace's variables (NaN on unavailable cells) from one dense float64 pass."""
    skip = ad.skip_positions if skip is None else skip
    got = record(model, ad, tokens)
    b, p = tokens.shape[0], tokens.shape[1] - skip
    V = torch.stack([v.expand(b, *v.shape[1:])[:, skip:] for _, v in sorted(got["v"].items())])  # noqa: N806
    S, d, n_tok = V.shape[0], V.shape[-1], b * p  # noqa: N806
    out = {k: np.full((len(ad.consumers), S), np.nan) for k in TABLE}
    for k in ("input_rms", "residual_error", "first_position_share"):
        out[k] = np.full(len(ad.consumers), np.nan)
    for i, c in enumerate(ad.consumers):
        n, h, w = c.n_sources, got["h"][i], got["w"].get(i)
        if c.terms:
            C, mix, absmix = w[0][:, :, skip:], w[1][:, :, skip:], w[1][:, :, skip:].abs()  # noqa: N806
        elif (
            w is not None and w.ndim == 5
        ):  # block [b, p, m, n, m]: fraction f of c_s is sum_g w[f, s, g] v_s[g]
            m = w.shape[-1]
            wb, vb = (
                w[:, skip:].permute(3, 0, 1, 2, 4),
                V[:n].unflatten(-1, (m, -1)),
            )  # [n, b, p, f, g], [n, b, p, g, k]
            C = sum(wb[..., g, None] * vb[..., g, None, :] for g in range(m)).flatten(-2)  # noqa: N806
            diag = wb.diagonal(
                dim1=-2, dim2=-1
            )  # the trace's mixing: the mean weight of a fraction in its place
            mix, absmix = diag.mean(-1), diag.abs().mean(-1)
        elif w is not None and w.ndim == 4:  # per feature [b, p, n, d]
            wf = w[:, skip:].permute(2, 0, 1, 3)
            C, mix, absmix = wf * V[:n], wf.mean(-1), wf.abs().mean(-1)  # noqa: N806
        else:  # per token [b, p, n], static [n] or unit
            if w is not None:
                wt = w[:, skip:].permute(2, 0, 1)
            else:
                wt = torch.tensor(c.static or (1.0,) * n, dtype=torch.float64)[:, None, None].expand(n, b, p)
            C, mix, absmix = wt[..., None] * V[:n], wt, wt.abs()  # noqa: N806
        r = C.sum(0)
        hh = torch.einsum("bpd,bpd->", r, r)
        cnorm = torch.linalg.vector_norm(C, dim=-1).sum((1, 2))
        row = {
            "mixing": mix.mean((1, 2)),
            "mixing_abs": absmix.mean((1, 2)),
            "mixing_std": mix.reshape(n, -1).std(1, correction=0),
            "contribution_share": torch.einsum("sbpd,bpd->s", C, r) / hh,
            "norm_share": cnorm / cnorm.sum(),
        }
        for k, x in row.items():
            out[k][i, :n] = x.numpy()
        hc = h[:, skip:]
        out["input_rms"][i] = float((hc.pow(2).sum() / (n_tok * d)).sqrt())
        out["residual_error"][i] = float(((hc - r).pow(2).sum() / hc.pow(2).sum()).sqrt())
        out["first_position_share"][i] = float(h[:, 0].pow(2).sum() / h.pow(2).sum())
    out["source_rms"] = (V.pow(2).sum((1, 2, 3)) / (n_tok * d)).sqrt().numpy()
    flat = V.reshape(S, n_tok, d)
    centred = flat - flat.mean(1, keepdim=True)
    cov = centred.transpose(1, 2) @ centred / max(n_tok - 1, 1)
    out["source_spectrum"] = torch.linalg.eigvalsh(cov).flip(-1).clamp(min=0).numpy()
    natives(out, ad, [got["native"][k][:, skip:] for k in range(len(ad.native))], V, n_tok)
    return out


def natives(out: dict, ad, taps: list[torch.Tensor], V: torch.Tensor, n_tok: int) -> None:  # noqa: N803
    """Each native quantity's token mean into ``out``; the parts of a write as <part, write> (each
    part mapped first where it comes before a linear map) beside |write|^2."""
    labels = [c.label for c in ad.consumers]
    for spec, x in zip(ad.native, taps):
        i = labels.index(spec.layer)
        if spec.parts_of is not None:  # the parts of a write: <part, write> and |write|^2 per token
            write = V[[s.label for s in ad.sources].index(spec.parts_of)]
            if spec.project is not None:  # parts before a linear map W: W part = x @ W^T, per part
                x = x @ spec.project.detach().to(x.dtype).T
            x, total = (x * write[:, :, None]).sum(-1), write.square().sum(-1)
            out.setdefault(f"{spec.name}_total", np.full(len(ad.consumers), np.nan))[i] = total.sum() / n_tok
        rows = out.setdefault(spec.name, np.full((len(ad.consumers), *x.shape[2:]), np.nan))
        rows[i] = x.sum((0, 1)).numpy() / n_tok


def assert_agrees(trace, expect: dict[str, np.ndarray], rtol: float = 1e-10, what: str = "") -> None:
    """Every variable the oracle computes equals the trace's to ``rtol`` of its largest magnitude
    (a spread, to that of the weights; the rebuild error itself, a rounding error, to ``rtol`` in
    absolute terms); NaN cells alike.
    """
    for name, b in expect.items():
        a = trace[name].values
        assert a.shape == b.shape, f"{what}: {name} shape {a.shape} vs {b.shape}"
        assert np.array_equal(np.isnan(a), np.isnan(b)), f"{what}: {name} NaN cells differ"
        scale = 1.0 if name == "residual_error" else np.nanmax(np.abs(expect[SCALE.get(name, name)]))
        err = np.nanmax(np.abs(a - b), initial=0.0)
        assert err <= rtol * scale + 1e-300, f"{what}: {name} off by {err:.3g} (scale {scale:.3g})"
