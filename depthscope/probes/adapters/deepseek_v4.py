"""Adapter for DeepSeek-V4 in ``transformers`` (``deepseek_v4``): mHC streams unrolled per token.

Legend: batch, pos, d_model, stream (one of the N = ``hc_mult`` parallel residual streams),
source (the embedding, then every sublayer output in execution order).

What the model computes (``modeling_deepseek_v4.py``; manifold-constrained hyper-connections,
mHC, arXiv 2512.24880). The residual is N streams h_1..h_N [batch, pos, stream, d_model], all
copies of the token embedding at the start. Before each attention and each MoE, a
``DeepseekV4HyperConnection`` (``layers.{i}.attn_hc`` / ``ffn_hc``) reads the streams; with
x = RMSNorm(vec(h)) (no gain) and m = fn x split into [N, N, N*N]:

    pre  = sigmoid(scale[0] m_pre  + base_pre) + eps                     [stream]
    post = 2 sigmoid(scale[1] m_post + base_post)                        [stream]
    comb = Sinkhorn(softmax(scale[2] m_comb + base_comb, -1) + eps)      [stream_from, stream_to]

(Sinkhorn: ``hc_sinkhorn_iters`` rounds of row then column normalisation, each sum + eps, the
last one a column normalisation). The sublayer f reads the collapsed input sum_s pre_s h_s
(through its own RMSNorm, inside the sublayer) and the streams become

    h'_k = sum_j comb[j, k] h_j + post_k f                 (source-row convention: comb^T h)

The read-out (``hc_head``, ``DeepseekV4HyperHead``) collapses the streams with its own
pre_head = sigmoid(hc_scale (hc_fn x) + hc_base) + eps before the final norm: sum_s pre_head_s h_s.

How it maps to the delta basis (``streams.StreamUnroll``, exact per token): sources are the token
embedding (the N copies) and each attention and MoE output exactly as the hyper-connection
receives it, before ``post`` is applied (``self_attn`` output, ``mlp`` output). Per token the
coefficients C [stream, source] of the streams start at ones on the embedding; a sublayer's row
of M is sum_s pre_s C[s, :], after which C <- comb^T C and the column ``post`` is appended; the
read-out's row is sum_s pre_head_s C[s, :]. Consumers are each sublayer's collapsed input (what
it reads, before its RMSNorm) and the collapsed read-out (the final norm's input). Rows are raw:
pre sums to about N/2 at initialisation, so rows are not normalised (see DESIGN.md, HC/mHC).

Reading the weights: ``post`` and ``comb`` are the hyper-connection's own outputs (forward hook);
``pre`` is consumed inside the module, so it is recomputed from the hook's input with the
module's parameters, the same float32 operations (the residual identity confirms it on every
batch); ``pre_head`` likewise from ``hc_head``'s input.

Native quantities under DeepSeek's names, token means per consumer: ``pre`` (layer, stream)
(the read-out row holds ``hc_head``'s pre), ``post`` (layer, stream) and ``comb`` (layer,
stream_from, stream_to). Attrs, over every token of the capture (skipped positions included):
``comb_row_error_max`` / ``comb_col_error_max``, the largest |row or column sum - 1| of any
``comb`` (how doubly stochastic the Sinkhorn projection left it), and ``composite_gain_max`` /
``composite_gain_min``, the largest and smallest row or column sum of the per-token product of
all the ``comb`` matrices over depth (1 for an exactly doubly stochastic composite: the stream
mixing neither amplifies nor attenuates).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from depthscope.probes.adapters.base import (
    Adapter,
    Callback,
    ConsumerSpec,
    Hook,
    NativeSpec,
    SourceSpec,
    find_module,
    forward_hooks,
    router,
)
from depthscope.probes.adapters.hf import encoder, label_of, model_name, prefix_of, pretrained
from depthscope.probes.adapters.streams import StreamUnroll
from depthscope.schemes import names

FAMILY = "deepseek_v4"
PACKAGE = "transformers"
VERSION = "5.24.0"
PRIORITY = 20
MODEL_TYPES = ("deepseek_v4",)  # config.model_type of the models this adapter reads
READS = (
    "transformers deepseek_v4 (mHC, hc_mult streams): attn_hc/ffn_hc post and comb hooked, pre and hc_head's "
    "pre recomputed from their inputs; streams unrolled per token, M = sum_s pre_s C[s]"
)
BASE_CLASS = "DeepseekV4Model"


def detect(model: Any) -> bool:
    """Whether ``model`` is a transformers DeepSeek-V4 model (with a ``DeepseekV4Model`` inside)."""
    return (
        pretrained(model)
        and getattr(model.config, "model_type", None) in MODEL_TYPES
        and find_module(model, BASE_CLASS) is not None
    )


def build(model: Any) -> Adapter:
    """The adapter of a DeepSeek-V4 model: weights unrolled per token from the mHC streams, ``pre``,
    ``post`` and ``comb`` kept as native quantities, the Sinkhorn and composite checks as attrs.
    """
    p = prefix_of(model, BASE_CLASS, FAMILY)
    cfg = model.get_submodule(p.rstrip(".")).config if p else model.config
    n = cfg.num_hidden_layers
    srcs = [SourceSpec(names.EMBED, names.EMBED, names.EMBED, 0)]
    cons, native = [], []
    for i in range(n):
        for kind in (names.ATTN, names.MLP):
            label, depth = names.label(i, kind), len(srcs)
            cons.append(ConsumerSpec(label, f"{label}.in", kind, depth, len(srcs), f"{label}.w"))
            native += [
                NativeSpec("pre", f"{label}.pre", label, ("stream",)),
                NativeSpec("post", f"{label}.post", label, ("stream",)),
                NativeSpec("comb", f"{label}.comb", label, ("stream_from", "stream_to")),
            ]
            srcs.append(SourceSpec(label, label, kind, depth))
    ro = names.READOUT
    cons.append(ConsumerSpec(ro, f"{ro}.in", ro, 2 * n + 1, len(srcs), f"{ro}.w"))
    native.append(NativeSpec("pre", f"{ro}.pre", ro, ("stream",)))
    keep = (
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "hc_mult",
        "hc_sinkhorn_iters",
        "hc_eps",
        "n_routed_experts",
        "num_experts_per_tok",
        "layer_types",
        "mlp_layer_types",
        "vocab_size",
        "max_position_embeddings",
    )
    config = {k: getattr(cfg, k) for k in keep if getattr(cfg, k, None) is not None}
    tokenizer = getattr(model, "tokenizer", None)
    attrs = {
        "scheme": "mhc",
        "variant": model_name(model),
        "label": label_of(model, cfg.model_type),
        "family": FAMILY,
        "config": json.dumps(config, sort_keys=True, default=str),
        "streams": int(cfg.hc_mult),
    }
    return Adapter(
        family=FAMILY,
        sources=srcs,
        consumers=cons,
        attrs=attrs,
        ctx=int(cfg.max_position_embeddings),
        vocab=int(cfg.vocab_size),
        encode=None if tokenizer is None else encoder(tokenizer),
        native=native,
        attach=lambda m, taps: _attach(m, taps, p, n, attrs),
        skip_positions=1,
        hint="; the deepseek_v4 forward no longer matches the mHC equations this adapter unrolls",
    )


def _unweighted_rms(x: Tensor, eps: float) -> Tensor:
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def mhc_pre(hc: Any, streams: Tensor) -> Tensor:
    """A ``DeepseekV4HyperConnection``'s pre weights [batch, pos, stream] from the streams it reads."""
    n = hc.hc_mult
    x = _unweighted_rms(streams.flatten(2), hc.input_norm.eps)
    logits = F.linear(x, hc.fn.float())[..., :n]
    return torch.sigmoid(logits * hc.scale[0].float() + hc.base[:n].float()) + hc.hc_eps


def head_pre(head: Any, streams: Tensor) -> Tensor:
    """``DeepseekV4HyperHead``'s read-out weights [batch, pos, stream] from the final streams."""
    x = _unweighted_rms(streams.flatten(2), head.input_norm.eps)
    logits = F.linear(x, head.hc_fn.float())
    return torch.sigmoid(logits * head.hc_scale.float() + head.hc_base.float()) + head.eps


class _Streams:
    """The per-token unrolling of one batch, fed by the model's hooks (a batch starts at the embedding)."""

    def __init__(self, send: Callable[[str, Any], None], attrs: dict[str, Any], n_streams: int):
        self.send, self.attrs, self.n = send, attrs, n_streams
        self.unroll: StreamUnroll | None = None
        self.composite: Tensor | None = None  # [batch, pos, stream, stream]: product of the combs so far

    def embed(self, module, args, out: Tensor) -> None:
        self.unroll = StreamUnroll.start(out.shape[:2], self.n, device=out.device)
        eye = torch.eye(self.n, dtype=torch.float64, device=out.device)
        self.composite = eye.expand(*out.shape[:2], self.n, self.n).clone()
        self.send(names.EMBED, out)

    def source(self, label: str) -> Hook:
        def hook(module, args, out) -> None:
            self.send(label, out[0] if isinstance(out, tuple) else out)

        return hook

    def hyper_connection(self, label: str) -> Hook:
        def hook(module, args, out) -> None:
            post, comb, collapsed = out
            pre = mhc_pre(module, args[0])
            self.send(f"{label}.w", self.unroll.read(pre).to(collapsed.dtype))
            self.send(f"{label}.in", collapsed)
            for key, value in (("pre", pre), ("post", post), ("comb", comb)):
                self.send(f"{label}.{key}", value)
            self.unroll.write(comb, post)
            self._check(comb.double())

        return hook

    def head(self, module, args, out: Tensor) -> None:
        pre = head_pre(module, args[0])
        ro = names.READOUT
        self.send(f"{ro}.w", self.unroll.read(pre).to(out.dtype))
        self.send(f"{ro}.in", out)
        self.send(f"{ro}.pre", pre)
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


def _attach(model: Any, taps: list[tuple[str, Callback]], p: str, n_layers: int, attrs: dict[str, Any]):
    base = model.get_submodule(p.rstrip(".")) if p else model
    state = _Streams(router(taps), attrs, int(base.config.hc_mult))
    hooks: list[tuple[str, Hook]] = [(f"{p}embed_tokens", state.embed)]
    for i in range(n_layers):
        layer = f"{p}layers.{i}"
        hooks += [
            (f"{layer}.attn_hc", state.hyper_connection(names.label(i, names.ATTN))),
            (f"{layer}.self_attn", state.source(names.label(i, names.ATTN))),
            (f"{layer}.ffn_hc", state.hyper_connection(names.label(i, names.MLP))),
            (f"{layer}.mlp", state.source(names.label(i, names.MLP))),
        ]
    hooks.append((f"{p}hc_head", state.head))
    return forward_hooks(model, hooks)
