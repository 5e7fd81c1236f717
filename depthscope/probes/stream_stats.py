"""Per-stream statistics of a multi-stream residual model, for the stream-collapse estimator
(``depthscope.analysis.streams``; arXiv 2606.03483).

Legend: batch, pos, stream, stream_from / stream_to (source-row: R[s, t] carries stream s into
stream t), d_model, layer (each sublayer's read, then the read-out).

A trace keeps each consumer's weights over sources and the token-mean stream matrices, not the
streams themselves: how much of a read each stream carries needs the streams' states, so this probe
runs its own forward. At every read it sees the streams h_s [batch, pos, stream, d_model], the read
weights A_s (per stream, or per stream and channel) and, where the family mixes its streams, the
per-token matrix R, and adds up, in float64 over the tokens (the adapter's skipped positions left
out): sum <c_s, y>, sum |c_s| (c_s = A_s h_s, y = sum_s c_s), sum |y|^2, sum |h_s|^2, sum <h_s, h_t>,
sum cos(h_s, h_t), sum |R - I|_F and the token count; at the read-out also sum |P - I|_F and
sum |P - J/n|_F of the per-token product P of every sublayer's R. Every read is checked: y rebuilt
from the streams must equal what the model computed (relative error below 1e-4), or the model is
refused.

Families and where their streams are read:

* depthscope's ``hc`` and ``mhc`` (``DepthModel``): each stream mixer's ``read`` is wrapped for the
  forward (an instance attribute, removed in the ``finally``): the state's streams, ``H_pre`` and
  ``H_res`` as the mixer computed them; the read-out sums the streams (A = 1);
* transformers ``deepseek_v4``, ``glm5_next``, ``hy_v4``: forward hooks on every ``attn_hc`` /
  ``ffn_hc`` (streams = the hook's input, pre recomputed as the adapter does, comb = its output) and
  on ``hc_head`` (pre_head);
* transformers ``qwen4_exp``: forward hooks on every gated residual and ``hyper_connection_mixer``
  (streams = the flat input split into n, per-channel A as the adapter computes it); no stream
  mixing, so R = I.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters import families, resolve
from depthscope.schemes import names

FROM, TO = "stream_from", "stream_to"
TOLERANCE = 1e-4  # relative error of the rebuilt read (float32 models)


class Sums:
    """Float64 sums per consumer over the tokens of every batch, and the per-token composite."""

    def __init__(self, n_streams: int, skip: int):
        self.n, self.skip = n_streams, skip
        self.sums: dict[str, dict[str, Tensor]] = {}
        self.order: list[str] = []
        self.errors: dict[str, float] = {}
        self.composite: Tensor | None = None
        self.composite_sum, self.uniform_sum, self.composite_tokens = 0.0, 0.0, 0.0
        self.d_model = 0

    def start(self) -> None:
        """A new batch: the composite restarts at the identity."""
        self.composite = None

    def record(self, label: str, h: Tensor, a: Tensor | None, res: Tensor | None, got: Tensor) -> None:
        """One read: streams ``h`` [batch, pos, stream, d_model], weights ``a`` [batch, pos, stream
        (, d_model)] (None: the plain sum), the matrix ``res`` [batch, pos, stream, stream] or None,
        and ``got``, the read the model computed [batch, pos, d_model].
        """
        s = self.skip
        h = h[:, s:].double()
        lead = h.shape[:2]
        a = torch.ones(*lead, self.n, dtype=h.dtype, device=h.device) if a is None else a[:, s:].double()
        c = h * (a if a.ndim == 4 else a.unsqueeze(-1))
        y = c.sum(2)
        err = float((y - got[:, s:].double()).norm() / y.norm().clamp_min(1e-300))
        if not err <= TOLERANCE:
            raise DepthscopeError(
                f"stream statistics: the read at {label} is not the weighted sum of its streams "
                f"(relative error {err:.2e} > {TOLERANCE:g}); the model does not match its family's equations"
            )
        norms = h.norm(dim=-1)
        dots = torch.einsum("bpsd,bpud->bpsu", h, h)
        denom = norms.unsqueeze(-1) * norms.unsqueeze(-2)
        cos = torch.where(denom > 0, dots / denom.clamp_min(1e-300), torch.zeros_like(dots))
        eye = torch.eye(self.n, dtype=h.dtype, device=h.device)
        if res is not None:
            res = res[:, s:].double().expand(*lead, self.n, self.n)
            dist = ((res - eye) ** 2).sum((-2, -1)).sqrt().sum()
            self.composite = res if self.composite is None else self.composite @ res
        else:
            # no stream mixing: R = I; the read-out writes nothing
            dist = torch.tensor(float("nan") if label == names.READOUT else 0.0)
        if label == names.READOUT:
            p = eye.expand(*lead, self.n, self.n) if self.composite is None else self.composite
            self.composite_sum += float(((p - eye) ** 2).sum((-2, -1)).sqrt().sum())
            self.uniform_sum += float(((p - 1.0 / self.n) ** 2).sum((-2, -1)).sqrt().sum())
            self.composite_tokens += lead.numel()
        add = {
            "read_dot": torch.einsum("bpsd,bpd->s", c, y),
            "read_abs": c.norm(dim=-1).sum((0, 1)),
            "input_sq": (y**2).sum(),
            "stream_sq": (h**2).sum((0, 1, 3)),
            "gram_sum": dots.sum((0, 1)),
            "cosine_sum": cos.sum((0, 1)),
            "res_distance_sum": dist.double().cpu(),
            "tokens": torch.tensor(float(lead.numel()), dtype=torch.float64),
        }
        if label not in self.sums:
            self.order.append(label)
            self.sums[label] = {k: v.detach().cpu() for k, v in add.items()}
        else:
            for k, v in add.items():
                self.sums[label][k] = self.sums[label][k] + v.detach().cpu()
        self.errors[label] = max(self.errors.get(label, 0.0), err)
        self.d_model = int(h.shape[-1])

    def dataset(self, attrs: dict[str, Any]) -> xr.Dataset:
        """The sums stacked along ``layer`` (in execution order)."""
        if not self.order:
            raise DepthscopeError("stream statistics: no read of the streams was seen in the forward")
        stack = {
            k: np.stack([self.sums[label][k].numpy() for label in self.order])
            for k in self.sums[self.order[0]]
        }
        dims = {
            "read_dot": ("layer", "stream"),
            "read_abs": ("layer", "stream"),
            "stream_sq": ("layer", "stream"),
        }
        dims["cosine_sum"] = dims["gram_sum"] = ("layer", FROM, TO)
        data = {k: (dims.get(k, ("layer",)), v) for k, v in stack.items()}
        data["read_error"] = ("layer", np.array([self.errors[label] for label in self.order]))
        ds = xr.Dataset(data, coords={"layer": self.order, "stream": np.arange(self.n)})
        ds["composite_distance_sum"] = self.composite_sum
        ds["composite_uniform_distance_sum"] = self.uniform_sum
        ds["composite_tokens"] = self.composite_tokens
        ds.attrs.update(attrs, d_model=self.d_model, streams=self.n)
        return ds


def stream_stats(model: Any, tokens: Tensor, batch_size: int = 8) -> xr.Dataset:
    """Per-stream sums of every read of a multi-stream model over ``tokens`` [batch, pos] (see the
    module docstring); ``depthscope.analysis.streams.stream_collapse`` turns them into shares,
    participation ratios, cosines and distances of H_res from the identity.
    """
    if not isinstance(tokens, Tensor) or tokens.dtype != torch.long or tokens.ndim != 2:
        raise DepthscopeError("stream statistics need token ids as a LongTensor [batch, pos]")
    adapter = resolve(model)
    family = families().get(adapter.family)
    if family is None or family.streams is None:
        multi = ", ".join(f.name for f in families().values() if f.streams is not None)
        raise DepthscopeError(
            f"stream statistics read multi-stream models ({multi}), not a {adapter.family} model"
        )
    n, reads = family.streams(model, adapter)
    sums = Sums(n, adapter.skip_positions)
    attrs = {k: adapter.attrs[k] for k in ("scheme", "label", "family") if k in adapter.attrs}
    if tokens.shape[1] <= adapter.skip_positions:
        raise DepthscopeError(f"stream statistics need more than {adapter.skip_positions} positions per row")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), reads(sums):
            for chunk in tokens.split(batch_size):
                sums.start()
                model(chunk.to(device))
    finally:
        model.train(was_training)
    return sums.dataset({**attrs, "tokens": int(tokens.numel())})
