"""One prompt, position by position: where each token's inputs come from.

``capture`` keeps token means, so "where do this token's inputs come from?" (TransformerLens's
``run_with_cache`` habit) needs its own view: ``inspect(model, text_or_ids)`` runs one forward of
one prompt through the same adapter as ``capture`` (any family, a ``ModelSpec`` or discovery) and
returns, for every position (the first included), every consumer and every source:

* ``contribution_share`` (pos, layer, source): <c[l, s], h_l> / |h_l|^2 at that position, with
  c[l, s] = M[l, s] (*) v_s the part of consumer l's input from source s; each row sums to 1;
* ``mixing`` (pos, layer, source): M[l, s] at that position (its mean over features for
  per-feature weights);
* ``input_rms`` (pos, layer): the root-mean-square of h_l;
* ``residual_error`` (layer): the largest relative error of rebuilding h_l from its terms over the
  positions (the same identity every capture checks; refused above the engine's tolerance);

and a ``token`` coordinate along ``pos`` with each position's decoded token. The |h_l|^2-weighted
mean over positions of ``contribution_share`` is ``capture``'s share on the same tokens (tested).

Legend: pos (positions of the prompt), d (width), n (sources available to a consumer). Post-LN
encoders (carried terms) are not inspected per position yet: refused in one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from depthscope.errors import DepthscopeError, TraceError
from depthscope.probes.adapters import Adapter
from depthscope.probes.adapters.base import evaluating, input_device
from depthscope.probes.capture import LOW_PRECISION, _adapter, tolerance, unwrap
from depthscope.probes.terms import block_mixing, block_terms, whole


def _ids(ad: Adapter, text_or_ids: Any, tokenizer: Any) -> tuple[Tensor, list[str]]:
    """Token ids [1, pos] of the prompt and each position's decoded token."""
    if isinstance(text_or_ids, str):
        if ad.encode is None:  # a byte-level model
            ids = list(text_or_ids.encode("utf-8"))
        else:
            ids = list(ad.encode(text_or_ids))
    else:
        ids = [int(i) for i in torch.as_tensor(text_or_ids).reshape(-1)]
    if not ids:
        raise DepthscopeError("inspect needs at least one token")
    if len(ids) > ad.ctx:
        raise DepthscopeError(f"the prompt has {len(ids)} tokens, more than the model's context of {ad.ctx}")
    if min(ids) < 0 or max(ids) >= ad.vocab:
        raise DepthscopeError(f"token ids must lie in [0, {ad.vocab}), got {min(ids)}..{max(ids)}")
    decode = getattr(tokenizer, "decode", None)
    if decode is not None:
        tokens = [decode([i]) for i in ids]
    elif ad.encode is None:
        tokens = [bytes([i]).decode("latin-1") if i < 256 else f"<{i}>" for i in ids]
    else:
        tokens = [str(i) for i in ids]
    return torch.tensor([ids]), tokens


def inspect(
    model: Any,
    text_or_ids: Any,
    *,
    adapter: Any = None,
    spec: Any = None,
    tokenizer: Any = None,
    forward: Any = None,
) -> xr.Dataset:
    """Per-position contribution shares, weights and input norms of one prompt (see the module
    docstring). ``adapter``, ``spec``, ``tokenizer`` and ``forward`` as for ``capture``.
    """
    model, tokenizer = unwrap(model, tokenizer)
    ad = _adapter(model, spec if spec is not None else adapter, tokenizer, forward)
    if any(c.terms for c in ad.consumers):
        raise DepthscopeError(
            f"inspect does not read {ad.family} models yet (their inputs are carried terms, not weighted "
            "sources): capture them over a corpus"
        )
    ids, tokens = _ids(ad, text_or_ids, tokenizer or getattr(model, "tokenizer", None))
    sources: dict[int, Tensor] = {}
    inputs: dict[int, Tensor] = {}
    weights: dict[int, Tensor] = {}

    def keep(store: dict, k: int):
        def hook(t: Tensor) -> None:
            t = whole(t).detach()  # (Split weights formed whole: a prompt is a few tokens)
            store[k] = (t.float() if t.dtype in LOW_PRECISION else t).double().cpu()

        return hook

    taps = [(s.tap, keep(sources, j)) for j, s in enumerate(ad.sources)]
    for i, c in enumerate(ad.consumers):
        taps.append((c.tap, keep(inputs, i)))
        if c.weights is not None:
            taps.append((c.weights, keep(weights, i)))
    with evaluating(model), torch.no_grad(), ad.attach(model, taps):
        ad.forward(model, ids.to(input_device(model)))
    missing = [s.label for j, s in enumerate(ad.sources) if j not in sources]
    missing += [c.label for i, c in enumerate(ad.consumers) if i not in inputs]
    if missing:
        raise TraceError(f"{missing[0]} was not seen in the forward of the prompt")
    return _dataset(ad, sources, inputs, weights, tokens, tolerance(next(iter(sources.values())).dtype))


def _row(t: Tensor) -> Tensor:
    """A tap's value of the one prompt as [pos, d] ([pos, d] itself: shared over the batch)."""
    return (t if t.ndim == 3 else t.unsqueeze(0))[0]


def _dataset(
    ad: Adapter, sources: dict, inputs: dict, weights: dict, tokens: list[str], tol: float
) -> xr.Dataset:
    pos = len(tokens)
    v = torch.stack([_row(sources[j]) for j in range(len(sources))])  # [source, pos, d]
    n_layer, n_source = len(ad.consumers), len(ad.sources)
    share = np.full((pos, n_layer, n_source), np.nan)
    mixing = np.full((pos, n_layer, n_source), np.nan)
    rms = np.zeros((pos, n_layer))
    errors = np.zeros(n_layer)
    for i, c in enumerate(ad.consumers):
        n = c.n_sources
        h = _row(inputs[i])  # [pos, d]
        if c.weights is not None:
            w = weights[i][0]  # [pos, n] or [pos, n, d]
        elif c.static is not None:
            w = torch.tensor(c.static, dtype=torch.float64).expand(pos, n)
        else:
            w = torch.ones(pos, n, dtype=torch.float64)
        if w.ndim == 4:  # block weights [pos, m, n, m]
            terms = block_terms(w, v[:n])
        else:
            terms = w.permute(1, 0, 2) * v[:n] if w.ndim == 3 else w.T.unsqueeze(-1) * v[:n]  # [n, pos, d]
        rebuilt = terms.sum(0)
        err = (rebuilt - h).norm(dim=-1) / h.norm(dim=-1).clamp_min(1e-300)
        errors[i] = float(err.max())
        hh = (h * h).sum(-1)  # [pos]
        share[:, i, :n] = ((terms * h).sum(-1) / hh).T.numpy()
        mixing[:, i, :n] = (block_mixing(w) if w.ndim == 4 else w.mean(-1) if w.ndim == 3 else w).numpy()
        rms[:, i] = h.pow(2).mean(-1).sqrt().numpy()
    if not np.all(errors <= tol):
        worst = int(np.nanargmax(np.where(np.isnan(errors), np.inf, errors)))
        raise TraceError(
            f"{ad.family} model is not additive on this prompt: its input at {ad.consumers[worst].label} is "
            f"not the sum of the captured sources (relative error {errors[worst]:.3g}, tolerance {tol:g})"
        )
    lay = ad.layout()
    coords = {
        "pos": np.arange(pos),
        "token": ("pos", np.array(tokens, dtype=object)),
        "layer": lay.layer,
        "source": lay.source,
        "layer_kind": ("layer", np.array(lay.layer_kind, dtype=object)),
        "source_kind": ("source", np.array(lay.source_kind, dtype=object)),
        "layer_depth": ("layer", np.array(lay.layer_depth)),
        "source_depth": ("source", np.array(lay.source_depth)),
    }
    dims = ("pos", "layer", "source")
    out = xr.Dataset(
        {
            "contribution_share": (
                dims,
                share,
                {"long_name": "contribution share at this position", "units": "1"},
            ),
            "mixing": (dims, mixing, {"long_name": "weight M[l, s] at this position", "units": "1"}),
            "input_rms": (("pos", "layer"), rms, {"long_name": "RMS of the consumer's input", "units": "1"}),
            "residual_error": (
                ("layer",),
                errors,
                {"long_name": "largest relative rebuild error", "units": "1"},
            ),
        },
        coords=coords,
        attrs={
            **{k: v for k, v in ad.attrs.items() if isinstance(v, (str, int, float))},
            "prompt_tokens": pos,
        },
    )
    return out
