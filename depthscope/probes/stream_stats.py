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

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters import resolve
from depthscope.probes.adapters.base import forward_hooks
from depthscope.probes.adapters.hf import prefix_of
from depthscope.schemes import names

FROM, TO = "stream_from", "stream_to"
TOLERANCE = 1e-4  # relative error of the rebuilt read (float32 models)
HYPER_FAMILIES = ("deepseek_v4", "glm5_next", "hy_v4")


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


@contextlib.contextmanager
def _wrapped_reads(model: Any, sums: Sums) -> Iterator[None]:
    """Our HC/mHC models: each stream mixer's ``read`` wrapped for the forward (instance attributes)."""
    from depthscope.schemes.hc import StreamMixer, StreamReadout

    mixers = [
        (names.label(b, kind), getattr(block, f"{kind}_mix"))
        for b, block in enumerate(model.blocks)
        for kind in block.kinds
    ]
    mixers.append((names.READOUT, model.readout_mix))
    wrapped = []
    try:
        for label, mixer in mixers:
            if not isinstance(mixer, (StreamMixer, StreamReadout)):
                raise DepthscopeError(
                    f"stream statistics: {label} of a {model.cfg.scheme} model has no streams"
                )
            mixer.read = _reading(label, mixer.read, sums)
            wrapped.append(mixer)
        yield
    finally:
        for mixer in wrapped:
            del mixer.read


def _reading(label: str, read: Callable, sums: Sums) -> Callable:
    def wrapper(state):
        x, after = read(state)
        p = after.pending
        if label == names.READOUT:
            sums.record(label, state.h, None, None, state.h.sum(-2))
        else:
            lead, n = state.h.shape[:-2], state.h.shape[-2]
            pre = p.pre.expand(*lead, n)
            sums.record(label, state.h, pre, p.res, x)
        return x, after

    return wrapper


def _hyper_hooks(model: Any, family: str, sums: Sums) -> list:
    form = importlib.import_module(f"depthscope.probes.adapters.{family}").FORM
    p = prefix_of(model, form.base_class, form.family)
    base = model.get_submodule(p.rstrip(".")) if p else model

    def hc(label: str):
        def hook(module, args, out) -> None:
            post, comb, collapsed = form.unpack(out)
            sums.record(label, args[0], form.pre(module, args[0]), comb, collapsed)

        return hook

    def head(module, args, out) -> None:
        sums.record(names.READOUT, args[0], form.head_pre(module, args[0]), None, out)

    hooks = []
    for i in range(base.config.num_hidden_layers):
        hooks += [
            (f"{p}layers.{i}.attn_hc", hc(names.label(i, names.ATTN))),
            (f"{p}layers.{i}.ffn_hc", hc(names.label(i, names.MLP))),
        ]
    return [*hooks, (f"{p}hc_head", head)]


def _qwen4_hooks(model: Any, sums: Sums) -> list:
    from depthscope.probes.adapters import qwen4_exp

    p = prefix_of(model, qwen4_exp.BASE_CLASS, qwen4_exp.FAMILY)
    base = model.get_submodule(p.rstrip(".")) if p else model
    held: dict[str, Tensor] = {}

    def hold(key: str):
        def hook(module, args, out) -> None:
            held[key] = out

        return hook

    def gated(label: str):
        def hook(module, args, out) -> None:
            mixed = out[0] if isinstance(out, tuple) else out
            a, _ = qwen4_exp.read_weights(module, args[0], held.pop(label))
            h = args[0].unflatten(-1, a.shape[-2:])
            sums.record(label, h, a, None, mixed)

        return hook

    hooks = []
    for i in range(base.config.num_hidden_layers):
        for kind, hc in ((names.ATTN, "attn_hyper_connection"), (names.MLP, "mlp_hyper_connection")):
            label = names.label(i, kind)
            hooks += [
                (f"{p}layers.{i}.{hc}.input_mix_weight_up", hold(label)),
                (f"{p}layers.{i}.{hc}", gated(label)),
            ]
    ro = names.READOUT
    return [
        *hooks,
        (f"{p}hyper_connection_mixer.input_mix_weight_up", hold(ro)),
        (f"{p}hyper_connection_mixer", gated(ro)),
    ]


def stream_stats(model: Any, tokens: Tensor, batch_size: int = 8) -> xr.Dataset:
    """Per-stream sums of every read of a multi-stream model over ``tokens`` [batch, pos] (see the
    module docstring); ``depthscope.analysis.streams.stream_collapse`` turns them into shares,
    participation ratios, cosines and distances of H_res from the identity.
    """
    if not isinstance(tokens, Tensor) or tokens.dtype != torch.long or tokens.ndim != 2:
        raise DepthscopeError("stream statistics need token ids as a LongTensor [batch, pos]")
    adapter = resolve(model)
    family = adapter.family
    n = adapter.attrs.get("streams")
    attrs = {k: adapter.attrs[k] for k in ("scheme", "label", "family") if k in adapter.attrs}
    if family == "depthscope":
        options = model.cfg.options
        if model.cfg.scheme not in ("hc", "mhc"):
            raise DepthscopeError(f"stream statistics: a {model.cfg.scheme} model has one residual stream")
        sums = Sums(options.streams, adapter.skip_positions)
        attach = lambda: _wrapped_reads(model, sums)  # noqa: E731
    elif family in HYPER_FAMILIES:
        sums = Sums(int(n), adapter.skip_positions)
        attach = lambda: forward_hooks(model, _hyper_hooks(model, family, sums))  # noqa: E731
    elif family == "qwen4_exp":
        sums = Sums(int(n), adapter.skip_positions)
        attach = lambda: forward_hooks(model, _qwen4_hooks(model, sums))  # noqa: E731
    else:
        raise DepthscopeError(
            f"stream statistics read multi-stream models (depthscope hc/mhc, {', '.join(HYPER_FAMILIES)}, "
            f"qwen4_exp), not a {family} model"
        )
    if tokens.shape[1] <= adapter.skip_positions:
        raise DepthscopeError(f"stream statistics need more than {adapter.skip_positions} positions per row")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), attach():
            for chunk in tokens.split(batch_size):
                sums.start()
                model(chunk.to(device))
    finally:
        model.train(was_training)
    return sums.dataset({**attrs, "tokens": int(tokens.numel())})
