"""Adapter for lucidrains' ``x-transformers`` depth-mixing options: hyper-connections, attention
residuals and LIMe, on ``TransformerWrapper(attn_layers=Decoder/Encoder(...))``.

Which option a model uses is read from its modules (``attn_layers.layers.{i}`` = [norms,
branch, residual], ``attn_layers.layer_integrators.{i}``); one option per model. Sublayer i
(``layers.{i}``, attention ``a`` or feed-forward ``f``) reads its input x_i through the option,
then its pre-norm; the residual module adds its output o_i back. Sources: ``embed`` (the input of
``attn_layers``: token + position embedding), for hyper-connections the stream embeddings
``stream_emb.{s}``, then ``{block}.attn`` / ``{block}.mlp`` = o_i (the first input of the
residual module). Consumers: x_i (the input of the pre-branch norm; one row per view ``.q``,
``.k``, ``.v`` when the attention reads three inputs), then ``readout`` (the input of
``final_norm``).

(a) ``num_residual_streams = S > 1``: ``HyperConnection`` (HC, arXiv 2409.19606, with the mHC
constraints of arXiv 2512.24880 intended). Per token, with n = LayerNorm(h) of each stream
(``norm``, no bias) and V input views:

    alpha = n @ dynamic_alpha_fn * dynamic_alpha_scale + static_alpha        [stream, V + S]
    H_pre = sigmoid(alpha[:, :V]),  x_v = sum_s H_pre[s, v] h_s
    beta  = 2 sigmoid(static_beta + dynamic_beta_scale * 2 sigmoid(n @ dynamic_beta_fn))
    h'_t  = sum_s H_res[s, t] h_s + beta_t o                               (source-row H_res)

The DEFECT of 2.31.10 (``implementations.md`` Sec. 6.4): ``prepare`` reshapes the residual logits
[stream, S] into [stream, 1, S] before Sinkhorn, so H_res comes out all ONES whatever is stored:
every stream becomes the sum of all streams and the stream norm grows about S-fold per sublayer.
The adapter checks this on every HyperConnection at build time (``prepare`` on random streams
returns each stream as the sum of all), then uses H_res = ones(S, S), records ``defect`` in the
trace attrs and warns; an HC whose H_res is not all ones (a fixed package) is refused. Streams
start as embed + stream_emb[s]; the read-out sums the streams. Delta basis: the shared exact
unrolling ``StreamUnroll`` (``implementations.md`` Sec. 7). Native (per consumer row): ``hc_pre``
(layer, stream), ``hc_post`` (layer, stream), ``hc_res`` (layer, stream_from, stream_to) = the
effective H_res (ones); post and res on the first view's row.

(b) ``attn_aggregated_residuals = True``: ``AttentionResidual`` (AttnRes-like, arXiv 2603.15031,
with an input-dependent query). The stream stays a standard residual, h_{i+1} = h_i + o_i; the
branch input mixes the states h_0..h_i:

    q_v = RMSNorm(h_i + LoRA_v(RMSNorm(h_i)))     (``norm``; ``to_query``)
    k_j = RMSNorm(h_j)                            (``to_keys``)
    x_v = sum_j w_vj h_j,   w_vj = softmax_j(q_v . k_j / sqrt(d))

read from the outputs of ``norm`` and ``to_keys`` and recomputed in float64. Native:
``attnres_alpha`` (layer, state).

(c) ``integrate_layers = True``: ``DynamicLIMe`` (LIMe, arXiv 2502.09245): x_v = sum_j w_vj h_j with
w_v = softmax(Linear(RMSNorm(h_i)))_v over the states h_0..h_i, read directly from the output of
``to_weights`` [view, batch, pos, state]. V = 3 (q, k, v) for every attention after the first,
else 1. Native: ``lime_weight`` (layer, state).

Delta basis for (b) and (c): state h_j = embed + o_0 + ... + o_{j-1}, so a weight on state j adds
to every source written before it: M[embed] = sum_j w_j, M[o_k] = sum_{j > k} w_j; the
read-out is h_L (all weights 1).

Refused, one line each: hyper-connections together with (b) or (c) (their ``layer_hiddens`` then
hold branch inputs), gated multi-residual, GRU/orthogonal/MV-split/scaled residuals, post-norm or
a missing pre-norm, cross-attention, custom execution orders, U-Net skips, input reinjection,
output soft-clamping, memory/cls tokens, recycling and looping.

Legend: batch, pos, d_model, stream, state (a residual state h_j), view (q, k, v), source
(embedding(s) + sublayer outputs).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import warnings
from typing import Any

import torch
from torch import Tensor

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters.base import (
    Adapter,
    Callback,
    ConsumerSpec,
    NativeSpec,
    SourceSpec,
    installed_version,
    module_attach,
    router,
)
from depthscope.probes.adapters.family import package_family
from depthscope.probes.adapters.streams import StreamUnroll
from depthscope.schemes import names

NAME = "x-transformers"
PACKAGE = "x-transformers"
VERSION = "2.31.10"
DEFECT = "x-transformers HyperConnection: H_res all ones (implementations.md 6.4)"
VIEWS = ("q", "k", "v")
HC, ATTNRES, LIME = "hc", "attnres", "lime"
KINDS = {"a": names.ATTN, "f": names.MLP}


def _xt() -> Any:
    """The package's module, if imported (an x-transformers model exists only once it is)."""
    return sys.modules.get("x_transformers.x_transformers")


def from_saved(args: dict) -> Any:
    """The model a saved file describes (``probes.load``): ``TransformerWrapper(**args["wrapper"],
    attn_layers=Decoder(**args["layers"]))`` (``Encoder`` if ``args["encoder"]`` is true).
    """
    from x_transformers import Decoder, Encoder, TransformerWrapper

    stack = Encoder if args.get("encoder") else Decoder
    return TransformerWrapper(**args["wrapper"], attn_layers=stack(**args["layers"]))


def detect(model: Any) -> bool:
    """Whether ``model`` is a TransformerWrapper whose layers use layer integrators or HyperConnections."""
    xt = _xt()
    if xt is None:
        return False
    if not isinstance(model, xt.TransformerWrapper) or not isinstance(model.attn_layers, xt.AttentionLayers):
        return False
    layers = model.attn_layers
    return any(m is not None for m in layers.layer_integrators) or any(
        isinstance(layer[2], xt.HyperConnection) for layer in layers.layers
    )


def option(layers: Any) -> str:
    """Which depth-mixing option ``layers`` uses (refusing mixtures and other residuals)."""
    xt = _xt()
    residuals = {type(layer[2]) for layer in layers.layers}
    integrators = {type(m) for m in layers.layer_integrators}
    if residuals == {xt.HyperConnection}:
        if integrators != {type(None)}:
            raise DepthscopeError(
                "x-transformers: hyper-connections combined with integrate_layers or "
                "attn_aggregated_residuals cannot be decomposed by this adapter"
            )
        return HC
    if residuals != {xt.Residual}:
        kinds = ", ".join(sorted(t.__name__ for t in residuals))
        raise DepthscopeError(f"x-transformers: residual modules {kinds} are not supported by this adapter")
    for found, name in ((xt.DynamicLIMe, LIME), (xt.AttentionResidual, ATTNRES)):
        if integrators == {found}:
            return name
    kinds = ", ".join(sorted(t.__name__ for t in integrators))
    raise DepthscopeError(f"x-transformers: layer integrators {kinds} are not one supported option")


def _refuse_wrapper(model: Any) -> None:
    if (model.num_memory_tokens or 0) > 0 or model.cls_token is not None:
        raise DepthscopeError("x-transformers: memory or cls tokens are not supported by this adapter")
    if model.recycling or model.looped:
        raise DepthscopeError("x-transformers: recycling and looped models are not supported by this adapter")


def _refuse_layers(layers: Any, opt: str) -> None:
    n = len(layers.layers)
    if tuple(layers.layers_execute_order) != tuple(range(n)):
        raise DepthscopeError(
            "x-transformers: a custom layers_execute_order is not supported by this adapter"
        )
    if not set(layers.layer_types) <= set(KINDS):
        raise DepthscopeError("x-transformers: only self-attention and feed-forward layers are supported")
    if any(m is not None for m in layers.skip_combines) or layers.reinject_input or layers.softclamp_output:
        raise DepthscopeError(
            "x-transformers: U-Net skips, input reinjection and output soft-clamping are not additive"
        )
    for i, (norms, _, residual) in enumerate(layers.layers):
        if norms[0] is None or norms[2] is not None:
            raise DepthscopeError(f"x-transformers: layer {i} is not pre-norm, so its stream is not additive")
        if opt != HC and (residual.residual_scale is not None or residual.scale_residual_constant != 1):
            raise DepthscopeError(f"x-transformers: layer {i} scales its residual: not a sum of sources")


def views_of(layers: Any, opt: str, i: int) -> int:
    """How many inputs (1, or 3: q, k, v) sublayer ``i`` reads."""
    if opt == HC:
        return int(layers.layers[i][2].num_input_views)
    integrator = layers.layer_integrators[i]
    if opt == ATTNRES:
        return int(integrator.num_views)
    linear = next(m for m in integrator.to_weights if isinstance(m, torch.nn.Linear))
    return linear.out_features // integrator.num_layers


def labels(layers: Any) -> list[str]:
    """Trace labels of the sublayers, ``{block}.{kind}`` with block = index // len(default block)."""
    out = [names.label(i // layers.len_default_block, KINDS[t]) for i, t in enumerate(layers.layer_types)]
    if len(set(out)) != len(out):
        raise DepthscopeError("x-transformers: this layer layout gives two sublayers the same label")
    return out


def h_res_all_ones(hc: Any) -> bool:
    """Whether ``hc.prepare`` makes every stream the sum of all streams (H_res = ones, the defect)."""
    streams, dim = hc.num_residual_streams, hc.dynamic_beta_fn.shape[0]
    gen = torch.Generator().manual_seed(0)
    residuals = torch.randn(streams, 3, dim, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        _, mixed, _ = hc.prepare(residuals.to(hc.static_beta))  # [1, pos, stream, d_model]
    total = residuals.sum(0).unsqueeze(1).expand(-1, streams, -1)
    return torch.allclose(mixed[0].double(), total, rtol=1e-4, atol=1e-4)


def build(model: Any) -> Adapter:
    """The adapter of a TransformerWrapper with one depth-mixing option (HC, AttentionResidual, LIMe);
    DepthscopeError for what it cannot decompose, a warning for HC's H_res defect.
    """
    if not detect(model):
        raise DepthscopeError(
            f"x-transformers: expected a TransformerWrapper with hyper-connections, attention residuals or "
            f"LIMe, got a {type(model).__name__}"
        )
    _refuse_wrapper(model)
    layers = model.attn_layers
    opt = option(layers)
    _refuse_layers(layers, opt)
    streams = int(layers.num_residual_streams) if opt == HC else 1
    attrs: dict[str, Any] = {}
    if opt == HC:
        if not all(h_res_all_ones(layer[2]) for layer in layers.layers):
            raise DepthscopeError(
                f"x-transformers: this HyperConnection's H_res is not all ones; the adapter was written for "
                f"the H_res defect of {VERSION} and does not decompose other versions"
            )
        attrs["defect"] = DEFECT
        warnings.warn(f"{DEFECT}: the trace uses H_res = ones(S, S), as the model computes", stacklevel=2)
    srcs = [SourceSpec(names.EMBED, names.EMBED, names.EMBED, 0)]
    srcs += [
        SourceSpec(f"stream_emb.{s}", f"stream_emb.{s}", names.EMBED, 0)
        for s in range(streams if opt == HC else 0)
    ]
    cons, native, views = [], [], []
    for i, label in enumerate(labels(layers)):
        kind, v = KINDS[layers.layer_types[i]], views_of(layers, opt, i)
        views.append(v)
        for row in _rows(label, v):
            cons.append(ConsumerSpec(row, f"{row}.in", kind, i + 1, len(srcs), f"{row}.w"))
            native += _native(opt, row, first=row == _rows(label, v)[0])
        srcs.append(SourceSpec(label, label, kind, i + 1))
    readout_weights = "readout.w" if opt == HC else None
    cons.append(
        ConsumerSpec(
            names.READOUT, "readout.in", names.READOUT, len(layers.layers) + 1, len(srcs), readout_weights
        )
    )
    version = installed_version(PACKAGE) or VERSION
    variant = {HC: f"hc-{streams}", ATTNRES: "attnres", LIME: "lime"}[opt]
    title = {HC: f"hyper-connections, {streams} streams", ATTNRES: "attention residuals", LIME: "LIMe"}[opt]
    config = {
        "option": opt,
        "num_tokens": model.num_tokens,
        "max_seq_len": model.max_seq_len,
        "dim": layers.dim,
        "layer_types": "".join(layers.layer_types),
        "heads": layers.attn_heads,
        "num_residual_streams": streams,
        "views": views,
    }
    if opt == ATTNRES:
        lora = layers.layer_integrators[0].to_query[1]
        config["lora_rank"] = lora.down.out_features if hasattr(lora, "down") else None
    return Adapter(
        family=NAME,
        sources=srcs,
        consumers=cons,
        attrs={
            "scheme": opt,
            "variant": variant,
            "label": f"{NAME} {version}: {title}",
            "config": json.dumps(config, sort_keys=True),
            **attrs,
        },
        ctx=int(model.max_seq_len),
        vocab=int(model.num_tokens),
        native=native,
        attach=lambda m, taps: _attach(m, taps, opt, views),
    )


def _rows(label: str, n_views: int) -> list[str]:
    return [label] if n_views == 1 else [f"{label}.{v}" for v in VIEWS]


def _native(opt: str, row: str, first: bool) -> list[NativeSpec]:
    if opt == HC:
        out = [NativeSpec("hc_pre", f"{row}.hc_pre", row, ("stream",))]
        if first:
            out += [
                NativeSpec("hc_post", f"{row}.hc_post", row, ("stream",)),
                NativeSpec("hc_res", f"{row}.hc_res", row, ("stream_from", "stream_to")),
            ]
        return out
    name = "attnres_alpha" if opt == ATTNRES else "lime_weight"
    return [NativeSpec(name, f"{row}.{name}", row, ("state",))]


def states_to_sources(w: Tensor) -> Tensor:
    """Weights over the states h_0..h_i [..., state] -> delta-basis weights over embed, o_0..o_{i-1}:
    source m collects the weights of every state from h_m on (a reversed cumulative sum).
    """
    return w.flip(-1).cumsum(-1).flip(-1)


def hc_weights(hc: Any, normed: Tensor) -> tuple[Tensor, Tensor]:
    """(H_pre [batch, pos, stream, view], beta [batch, pos, stream]) of one HyperConnection, in float64,
    from its normalised streams [batch, pos, stream, d_model].
    """
    views = hc.num_input_views
    # both projections in one product: the streams' float64 copy, which costs more than the
    # arithmetic, read once
    fns = torch.cat([hc.dynamic_alpha_fn, hc.dynamic_beta_fn.unsqueeze(-1)], -1).double()
    both = normed.double() @ fns
    alpha = both[..., :-1] * hc.dynamic_alpha_scale.double() + hc.static_alpha.double()
    pre = alpha[..., :views].sigmoid()
    dynamic = both[..., -1].sigmoid() * 2 * hc.dynamic_beta_scale.double()
    beta = (dynamic + hc.static_beta.double()).sigmoid() * 2
    return pre, beta


def depth_softmax(query: Tensor, keys: Tensor, scale: float) -> Tensor:
    """AttentionResidual's weights [view, batch, pos, state] from query [view, batch, pos, d_model]
    and keys [state, batch, pos, d_model], in float64.
    """
    logits = torch.einsum("vbpd,lbpd->vbpl", query.double(), keys.double()) * scale
    return logits.softmax(-1)


class _State:
    """Routes values to the engine's callbacks and carries the per-batch bookkeeping."""

    def __init__(self, taps: list[tuple[str, Callback]], n_states: int):
        self.send = router(taps)
        self.n_states = n_states
        self.unroll: StreamUnroll | None = None
        self.query: Tensor | None = None
        self.dtype = torch.float32

    def stash_query(self, q: Tensor) -> None:
        """Keep an AttentionResidual's query (its ``norm`` output) for the keys that follow."""
        self.query = q

    def state_weights(self, rows: list[str], w: Tensor, name: str) -> None:
        """Weights over states [view, batch, pos, state] -> each view's delta-basis weights and native."""
        for row, wv in zip(rows, w):
            self.send(f"{row}.w", states_to_sources(wv).to(self.dtype))
            pad = self.n_states - wv.shape[-1]
            self.send(f"{row}.{name}", torch.nn.functional.pad(wv, (0, pad), value=math.nan))


ROOT = "attn_layers"  # the module path of the AttentionLayers inside a TransformerWrapper


@contextlib.contextmanager
def _attach(model: Any, taps: list[tuple[str, Callback]], opt: str, views: list[int]):
    """The engine's taps as hooks on the model's modules (``_hooks``), removed when the block ends."""
    layers = model.attn_layers
    state = _State(taps, len(layers.layers))
    sublayers = labels(layers)
    rows = [_rows(label, v) for label, v in zip(sublayers, views)]
    with module_attach(model, _hooks(layers, state, opt, sublayers, rows)):
        yield


def _hooks(
    layers: Any, state: _State, opt: str, sublayers: list[str], rows: list[list[str]]
) -> list[tuple[str, Callback]]:
    """Module taps in execution order: the embedding, per sublayer its option's weights, its input
    and its output, then the read-out.
    """
    hooks = [(f"{ROOT}:in", _embed_hook(state, layers, opt))]
    for i in range(len(layers.layers)):
        p = f"{ROOT}.layers.{i}"
        hooks += _weight_hooks(layers, state, opt, i, rows[i])
        hooks += [
            (f"{p}.0.0:in", _input_hook(state, rows[i])),
            (f"{p}.2:in", _forward_to(state, sublayers[i])),
        ]
    hooks.append((f"{ROOT}.final_norm:in", _readout_hook(state, opt)))
    return hooks


def _weight_hooks(
    layers: Any, state: _State, opt: str, i: int, rows: list[str]
) -> list[tuple[str, Callback]]:
    """The taps that give sublayer ``i``'s weights: its HC's norm output, its LIMe weights, or its
    AttentionResidual's query and keys.
    """
    if opt == HC:
        return [(f"{ROOT}.layers.{i}.2.norm:out", _hyper_hook(state, layers.layers[i][2], rows))]
    integrator = f"{ROOT}.layer_integrators.{i}"
    if opt == LIME:
        return [(f"{integrator}.to_weights:out", _lime_hook(state, rows))]
    return [
        (f"{integrator}.norm:out", state.stash_query),
        (f"{integrator}.to_keys:out", _attnres_hook(state, layers.layer_integrators[i], rows)),
    ]


def _forward_to(state: _State, key: str) -> Callback:
    """A tap handing its tensor to the engine's callbacks under ``key`` (and back any replacement)."""
    return lambda t: state.send(key, t)


def _embed_hook(state: _State, layers: Any, opt: str) -> Callback:
    """The embedding starts a batch: sent as a source, and for HC the stream embeddings and the unrolling."""

    def embed(x: Tensor) -> None:
        state.dtype = x.dtype
        state.send(names.EMBED, x)
        if opt == HC:
            streams = layers.num_residual_streams
            for s in range(streams):
                state.send(f"stream_emb.{s}", layers.stream_emb[s].expand_as(x))
            init = torch.cat([torch.ones(streams, 1), torch.eye(streams)], dim=1)  # embed + own stream_emb
            state.unroll = StreamUnroll.start(tuple(x.shape[:2]), streams, init, device=x.device)

    return embed


def _input_hook(state: _State, rows: list[str]) -> Callback:
    """A sublayer's input, one tensor or [view, batch, pos, d_model], sent per row; replaced if a
    callback returns a replacement (ablation).
    """

    def hook(x: Tensor) -> Tensor | None:
        parts = [x] if x.ndim == 3 else list(x)  # [view, batch, pos, d_model] when several
        new = [state.send(f"{row}.in", part) for row, part in zip(rows, parts)]
        if all(n is None for n in new):
            return None
        new = [p if n is None else n for p, n in zip(parts, new)]  # a replacement (ablation)
        return new[0] if x.ndim == 3 else torch.stack(new)

    return hook


def _hyper_hook(state: _State, hc: Any, rows: list[str]) -> Callback:
    """From an HC's normalised streams: H_pre per view unrolled into weights, beta, H_res = ones (the
    defect), then the write.
    """

    def hook(normed: Tensor) -> None:
        pre, beta = hc_weights(hc, normed)
        streams = pre.shape[-2]
        res = pre.new_ones(*pre.shape[:2], streams, streams)  # the defect: H_res = ones
        for v, row in enumerate(rows):
            state.send(f"{row}.w", state.unroll.read(pre[..., v]).to(state.dtype))
            state.send(f"{row}.hc_pre", pre[..., v])
        state.send(f"{rows[0]}.hc_post", beta)
        state.send(f"{rows[0]}.hc_res", res)
        state.unroll.write(res, beta)

    return hook


def _readout_hook(state: _State, opt: str) -> Callback:
    """The final norm's input; for HC also the unrolled read-out weights (the streams summed)."""

    def readout(x: Tensor) -> Tensor | None:
        if opt == HC:
            state.send("readout.w", state.unroll.readout().to(state.dtype))
        return state.send("readout.in", x)

    return readout


def _lime_hook(state: _State, rows: list[str]) -> Callback:
    """DynamicLIMe's ``to_weights`` output [view, batch, pos, state], as weights over states."""
    return lambda w: state.state_weights(rows, w.double(), "lime_weight")


def _attnres_hook(state: _State, integrator: Any, rows: list[str]) -> Callback:
    """AttentionResidual's keys, with the query stashed before them, as softmax weights over states."""
    scale = float(integrator.scale)
    return lambda keys: state.state_weights(rows, depth_softmax(state.query, keys, scale), "attnres_alpha")


FAMILY = package_family(
    NAME,
    (
        "x-transformers TransformerWrapper: HyperConnection (unrolled, H_res = ones: the 2.31.10 defect), "
        "AttentionResidual and DynamicLIMe (weights over states, summed onto every earlier source)"
    ),
    PACKAGE,
    VERSION,
    detect,
    build,
    from_saved,
)
