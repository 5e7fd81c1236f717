"""Unrolling multi-stream residuals (HC, mHC, DeepSeek-V4, Qwen4-Exp ...) into the delta basis.

Every multi-stream scheme fits h'_t = sum_s R[s, t] h_s + P_t f(sum_s A_s h_s) (research note
``implementations.md`` Sec. 7; R in the source-row convention: R[s, t] carries stream s into
stream t), with streams started as copies of the embedding (plus constant stream embeddings, if
any, as sources of their own). Track per token the coefficients C [batch, pos, stream, source]:
stream s holds sum_j C[s, j] v_j. A sublayer reading with weights A has delta-basis weights
sum_s A_s C[s, :]; its write makes C <- R^T C and appends the column P for its output; a read-out
sums (or weighs) the streams. Per-channel read weights (Qwen4-Exp) A [.., stream, d_model] give
per-feature weights [.., source, d_model]. Exact per token, in float64 unless told otherwise.

``hyper_adapter`` is the one adapter of the transformers families built on DeepSeek-V4's
hyper-connections (``deepseek_v4``, ``glm5_next``, ``hy_v4``): each declares its ``HyperForm``
(how its modules compute pre, post and comb), the hooks and the unrolling are these.

Legend: batch, pos, stream, source, d_model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from depthscope.probes.adapters import base as ab
from depthscope.probes.adapters.hf import decoder_adapter, family_attrs, prefix_of, text_model
from depthscope.probes.terms import Factored
from depthscope.schemes import names


class StreamUnroll:
    """The coefficients C of n streams over the sources written so far."""

    def __init__(self, coef: Tensor):
        self.coef = coef  # [batch, pos, stream, source]

    @classmethod
    def start(
        cls,
        batch_pos: tuple[int, int],
        streams: int,
        init: Tensor | None = None,
        dtype=torch.float64,
        device: torch.device | str | None = None,
    ) -> StreamUnroll:
        """Streams that are copies of the embedding (source 0): ``init`` [stream, k] gives the
        coefficients of k initial sources instead (e.g. the embedding and a stream embedding).
        The coefficients live on ``device`` (the embedding's); every read and write is moved there.
        """
        if init is None:
            init = torch.ones(streams, 1, dtype=dtype)
        return cls(init.to(device=device, dtype=dtype).expand(*batch_pos, *init.shape).clone())

    @property
    def n_sources(self) -> int:
        """Sources written so far (the coefficients' last dimension)."""
        return self.coef.shape[-1]

    def read(self, pre: Tensor, dtype: torch.dtype | None = None) -> Tensor | Factored:
        """Delta-basis weights of a read with stream weights ``pre`` [batch, pos, stream] (scalar
        per stream: -> [batch, pos, source]) or [batch, pos, stream, d_model] (per channel:
        -> ``Factored`` weights [batch, pos, source, d_model], C^T A per token), in ``dtype``
        (default the coefficients'). Per-channel weights are d_model times the coefficients' size:
        they are handed as their two factors, in ``dtype`` (the model's float32: a float64 copy of
        them cost more than the capture's fold of them), and the engine forms them a chunk of tokens
        at a time (each weight then a sum over the streams rounded in float32, a few units of its
        last place, where the float64 one is rounded once).
        """
        if pre.ndim == self.coef.ndim - 1:
            w = torch.einsum("bps,bpsn->bpn", pre.to(self.coef.device, self.coef.dtype), self.coef)
            return w if dtype is None else w.to(dtype)
        dtype = dtype or self.coef.dtype
        return Factored(self.coef.to(dtype), pre.to(self.coef.device, dtype))

    def write(self, res: Tensor | None, post: Tensor) -> None:
        """A sublayer's write: C <- res^T C (``res`` [batch, pos, stream, stream], source x target;
        None = identity, no stream mixing), then the column ``post`` [batch, pos, stream].
        """
        coef = self.coef
        if res is not None:
            coef = torch.einsum("bpst,bpsn->bptn", res.to(coef.device, coef.dtype), coef)
        self.coef = torch.cat([coef, post.to(coef.device, coef.dtype).unsqueeze(-1)], dim=-1)

    def readout(self, head: Tensor | None = None) -> Tensor:
        """The read-out's weights: the streams summed (``head`` None) or weighed by ``head``."""
        return self.coef.sum(-2) if head is None else self.read(head)


# --- the DeepSeek-V4 form of hyper-connections in transformers (deepseek_v4, glm5_next, hy_v4) ---


@dataclass(frozen=True)
class HyperForm:
    """What differs between the transformers families whose decoder layers wrap each attention and
    MLP in a DeepSeek-V4-style hyper-connection (``layers.{i}.attn_hc`` / ``ffn_hc``, read-out
    ``hc_head``): the adapter, the hooks and the unrolling are shared (``hyper_adapter``).

    ``pre(hc, streams)`` and ``head_pre(head, streams)`` recompute the read weights [batch, pos,
    stream] that the module consumes internally, from the streams it receives and its own
    parameters; ``unpack(output)`` gives (post [batch, pos, stream], comb [batch, pos,
    stream_from, stream_to] or None when the family does not mix its streams, collapsed input).
    """

    family: str
    base_class: str  # the transformers class of the decoder stack (DeepseekV4Model ...)
    scheme: str  # the trace's ``scheme`` attr
    pre: Callable[[Any, Tensor], Tensor]
    head_pre: Callable[[Any, Tensor], Tensor]
    unpack: Callable[[Any], tuple[Tensor, Tensor | None, Tensor]]
    keep: tuple[str, ...]  # config keys recorded in the trace's ``config`` attr
    mixes_streams: bool = True  # a ``comb`` per sublayer (and its Sinkhorn checks)


def unweighted_rms(x: Tensor, eps: float) -> Tensor:
    """The input over sqrt(mean x^2 + eps), last axis, in float32 (the hyper-connections' input norm)."""
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def hyper_adapter(model: Any, form: HyperForm) -> ab.Adapter:
    """The adapter of a model of ``form``: per-token weights unrolled from its streams, ``pre``,
    ``post`` (and ``comb``) kept as native quantities, the Sinkhorn and composite checks as attrs
    when the streams are mixed.
    """
    p = prefix_of(model, form.base_class, form.family)
    cfg = text_model(model, p).config
    n = cfg.num_hidden_layers
    srcs = [ab.SourceSpec(names.EMBED, names.EMBED, names.EMBED, 0)]
    cons, native = [], []
    per_sublayer = (("pre", ("stream",)), ("post", ("stream",)))
    if form.mixes_streams:
        per_sublayer += (("comb", ("stream_from", "stream_to")),)
    for i in range(n):
        for kind in (names.ATTN, names.MLP):
            label, depth = names.label(i, kind), len(srcs)
            cons.append(ab.ConsumerSpec(label, f"{label}.in", kind, depth, len(srcs), f"{label}.w"))
            native += [ab.NativeSpec(q, f"{label}.{q}", label, dims) for q, dims in per_sublayer]
            srcs.append(ab.SourceSpec(label, label, kind, depth))
    ro = names.READOUT
    cons.append(ab.ConsumerSpec(ro, f"{ro}.in", ro, 2 * n + 1, len(srcs), f"{ro}.w"))
    native.append(ab.NativeSpec("pre", f"{ro}.pre", ro, ("stream",)))
    attrs = family_attrs(model, cfg, form.keep, form.scheme, family=form.family, streams=int(cfg.hc_mult))
    attach = partial(_attach_hyper, p=p, n_layers=n, attrs=attrs, form=form)
    # the collapsed inputs are sent from the hyper-connection's hook, which does not take a
    # replacement back: they are not views a source's term could be removed from (ablation)
    equations = "hyper-connection equations"
    return decoder_adapter(
        model, cfg, form.family, srcs, cons, attrs, equations, native=native, attach=attach, views=False
    )


class HyperStreams:
    """The per-token unrolling of one batch, fed by the model's hooks (a batch starts at the embedding)."""

    def __init__(
        self, send: Callable[[str, Any], None], attrs: dict[str, Any], n_streams: int, form: HyperForm
    ):
        self.send, self.attrs, self.n, self.form = send, attrs, n_streams, form
        self.unroll: StreamUnroll | None = None
        self.composite: Tensor | None = None  # [batch, pos, stream, stream]: product of the combs so far

    def embed(self, module, args, out: Tensor) -> None:
        """The token embedding: every stream starts as a copy of it."""
        self.unroll = StreamUnroll.start(out.shape[:2], self.n, device=out.device)
        eye = torch.eye(self.n, dtype=torch.float64, device=out.device)
        self.composite = eye.expand(*out.shape[:2], self.n, self.n).clone()
        self.send(names.EMBED, out)

    def source(self, label: str) -> ab.Hook:
        """A sublayer's output, as the hyper-connection receives it (before ``post``)."""
        return ab.output_hook(self.send, label)

    def hyper_connection(self, label: str) -> ab.Hook:
        """A sublayer's hyper-connection: its read (weights and collapsed input), then its write."""

        def hook(module, args, out) -> None:
            post, comb, collapsed = self.form.unpack(out)
            pre = self.form.pre(module, args[0])
            self.send(f"{label}.w", self.unroll.read(pre).to(collapsed.dtype))
            self.send(f"{label}.in", collapsed)
            self.send(f"{label}.pre", pre)
            self.send(f"{label}.post", post)
            if comb is not None:
                self.send(f"{label}.comb", comb)
                self._check(comb.double())
            self.unroll.write(comb, post)

        return hook

    def head(self, module, args, out: Tensor) -> None:
        """The read-out's collapse of the final streams."""
        pre = self.form.head_pre(module, args[0])
        ro = names.READOUT
        self.send(f"{ro}.w", self.unroll.read(pre).to(out.dtype))
        self.send(f"{ro}.in", out)
        self.send(f"{ro}.pre", pre)
        if self.form.mixes_streams:
            sums = torch.cat([self.composite.sum(-1), self.composite.sum(-2)], dim=-1)
            self._keep("composite_gain_max", float(sums.max()), max)
            self._keep("composite_gain_min", float(sums.min()), min)

    def _check(self, comb: Tensor) -> None:
        """How doubly stochastic this comb is; fold it into the composite over depth."""
        self._keep("comb_row_error_max", float((comb.sum(-1) - 1).abs().max()), max)
        self._keep("comb_col_error_max", float((comb.sum(-2) - 1).abs().max()), max)
        self.composite = self.composite @ comb.to(self.composite)  # source-row: stream s -> t through both

    def _keep(self, key: str, value: float, pick: Callable[[float, float], float]) -> None:
        self.attrs[key] = pick(self.attrs[key], value) if key in self.attrs else value


def _attach_hyper(
    model: Any,
    taps: list[tuple[str, ab.Callback]],
    p: str,
    n_layers: int,
    attrs: dict[str, Any],
    form: HyperForm,
):
    inner = text_model(model, p)
    state = HyperStreams(ab.router(taps), attrs, int(inner.config.hc_mult), form)
    hooks: list[tuple[str, ab.Hook]] = [(f"{p}embed_tokens", state.embed)]
    for i in range(n_layers):
        layer = f"{p}layers.{i}"
        hooks += [
            (f"{layer}.attn_hc", state.hyper_connection(names.label(i, names.ATTN))),
            (f"{layer}.self_attn", state.source(names.label(i, names.ATTN))),
            (f"{layer}.ffn_hc", state.hyper_connection(names.label(i, names.MLP))),
            (f"{layer}.mlp", state.source(names.label(i, names.MLP))),
        ]
    hooks.append((f"{p}hc_head", state.head))
    return ab.forward_hooks(model, hooks)


def hyper_stream_reads(form: HyperForm) -> Callable[[Any, ab.Adapter], tuple[int, Callable[[Any], Any]]]:
    """Where stream statistics read a model of ``form`` (``probes.stream_stats``): forward hooks on
    every hyper-connection (the streams its input, pre recomputed, comb its output) and on the head.
    """

    def reads(model: Any, adapter: ab.Adapter) -> tuple[int, Callable[[Any], Any]]:
        return int(adapter.attrs["streams"]), lambda sums: ab.forward_hooks(
            model, _hyper_hooks(model, form, sums)
        )

    return reads


def _hyper_hooks(model: Any, form: HyperForm, sums: Any) -> list:
    p = prefix_of(model, form.base_class, form.family)
    inner = text_model(model, p)

    def hc(label: str):
        def hook(module, args, out) -> None:
            post, comb, collapsed = form.unpack(out)
            sums.record(label, args[0], form.pre(module, args[0]), comb, collapsed)

        return hook

    def head(module, args, out) -> None:
        sums.record(names.READOUT, args[0], form.head_pre(module, args[0]), None, out)

    hooks = []
    for i in range(inner.config.num_hidden_layers):
        hooks += [
            (f"{p}layers.{i}.attn_hc", hc(names.label(i, names.ATTN))),
            (f"{p}layers.{i}.ffn_hc", hc(names.label(i, names.MLP))),
        ]
    return [*hooks, (f"{p}hc_head", head)]
