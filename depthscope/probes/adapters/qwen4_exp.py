"""Adapter for Qwen4-Exp in ``transformers`` (``qwen4_exp_text``, ``qwen4_exp``): gated multi-stream residual.

Legend: batch, pos, d_model, stream (one of the n = ``hc_count`` residual streams), source (the
embedding, then the n-gram embeddings and sublayer outputs in execution order), channel (one
feature of d_model).

What the model computes (``modeling_qwen4_exp.py``, ``Qwen4ExpTextGatedResidual``). The residual
is n streams h_1..h_n, kept flat as [batch, pos, n * d_model], all copies of the token embedding
at the start. Before each attention (full or linear) and each MoE, a gated residual
(``layers.{i}.attn_hyper_connection`` / ``mlp_hyper_connection``) normalises every stream by its
own RMS, with a gain per stream and channel (``hc_norm``, weight w stored as 1 + w):

    g_s      = (1 + w_s) h_s / rms(h_s),      rms(h_s) = sqrt(mean_c h_s,c^2 + eps)
    gate     = sigmoid(up(silu(down(g) / n)))                           [stream, channel]
    input    = mean_s gate_s (*) g_s                                    (per channel)
    h'_s     = h_s + inject_s f(input),   inject = 2 sigmoid(block_inject_weight(g) / n)

so there is no stream mixing (H_res = I). The read-out (``hyper_connection_mixer``, the same
module without ``block_inject_weight``) is the same read of the final streams, and it goes
straight to the LM head. At the 1-based layers ``ple_layer_ids`` a per-layer embedding (PLE,
``layers.{i}.ple``) is added to the streams first: from hashed n-gram embeddings e, a value
v = value_proj(e) [d_model] is gated per stream by sigma_s = sigmoid(ssqrt(<norm_key(key_proj
e)_s, norm_query(h)_s> / sqrt(d_model))) (ssqrt: signed square root), and a dilated depthwise
short convolution of the gated values adds a per-stream term: ple_s = sigma_s v + conv_s.

How it maps to the delta basis (``streams.StreamUnroll``, exact per token and channel). The read
is not linear in the streams (each is divided by its own RMS), but for each token it is a fixed
per-channel weighting of them: input_c = sum_s A_s,c h_s,c with

    A_s,c = gate_s,c (1 + w_s,c) / (n rms(h_s))

so the weights over sources are A unrolled through the stream coefficients C [stream, source]:
per-feature weights [batch, pos, source, d_model]; the trace's ``mixing`` is their mean over
channels (and tokens). Each write appends the column ``inject`` (identity stream map). Sources:
the token embedding (the n copies), each attention and MoE output (what is injected, before
``inject``), and per PLE layer: ``"{i}.ple"``, the value v, written into stream s with weight
sigma_s, and ``"{i}.ple_conv.{s}"``, the rest of stream s's PLE write (ple_s - sigma_s v, the
short-convolution term), written into stream s alone (kind ``embed``, depth that of the last
sublayer before them). The PLE writes different vectors into each stream, so one source per PLE
cannot be exact; this split keeps the n-gram value as one source with its gate as its weight and
leaves the convolution (zero at initialisation) to per-stream sources. Consumers: each
sublayer's input (the gated residual's output) and the read-out (the mixer's output).

Native quantities, token means per consumer: ``read_gate`` (layer, stream), the channel mean of
gate; ``inject_gate`` (layer, stream) (NaN at the read-out); ``read_scale`` (layer, stream), the
channel mean of A times n (the effective per-stream weight, RMS and gain included, that the mean
over streams applies); ``ple_gate`` (layer, stream), sigma on the row of the attention that
follows each PLE.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from depthscope.probes.adapters import base as ab
from depthscope.probes.adapters.family import transformers_family
from depthscope.probes.adapters.hf import decoder_adapter, family_attrs, prefix_of, text_model
from depthscope.probes.adapters.streams import StreamUnroll
from depthscope.schemes import names

NAME = "qwen4_exp"
MODEL_TYPES = ("qwen4_exp", "qwen4_exp_text")  # the multimodal config and its text config
BASE_CLASS = "Qwen4ExpTextModel"
SUBLAYER_NATIVE = ("read_gate", "read_scale", "inject_gate")  # per stream; the read-out has no inject


def ple_layers(cfg: Any) -> list[int]:
    """0-based indices of the layers that add a PLE (``ple_layer_ids`` is 1-based)."""
    return [i - 1 for i in sorted(cfg.ple_layer_ids or [])]


def build(model: Any) -> ab.Adapter:
    """The adapter of a Qwen4-Exp model: per-feature weights unrolled per token from the gated reads, and
    each PLE layer's n-gram value and per-stream convolution terms as sources.
    """
    p = prefix_of(model, BASE_CLASS, NAME)
    inner = text_model(model, p)
    cfg = inner.config
    n, streams = cfg.num_hidden_layers, cfg.hc_count
    with_ple = set(ple_layers(cfg))
    srcs = [ab.SourceSpec(names.EMBED, names.EMBED, names.EMBED, 0)]
    cons, native = [], []
    for i in range(n):
        if i in with_ple:
            srcs.append(ab.SourceSpec(f"{i}.ple", f"{i}.ple", names.EMBED, 2 * i))
            srcs += [
                ab.SourceSpec(f"{i}.ple_conv.{s}", f"{i}.ple_conv.{s}", names.EMBED, 2 * i)
                for s in range(streams)
            ]
        for kind, depth in ((names.ATTN, 2 * i + 1), (names.MLP, 2 * i + 2)):
            label = names.label(i, kind)
            cons.append(ab.ConsumerSpec(label, f"{label}.in", kind, depth, len(srcs), f"{label}.w"))
            native += [ab.NativeSpec(q, f"{label}.{q}", label, ("stream",)) for q in SUBLAYER_NATIVE]
            srcs.append(ab.SourceSpec(label, label, kind, depth))
        if i in with_ple:
            label = names.label(i, names.ATTN)
            native.append(ab.NativeSpec("ple_gate", f"{i}.ple_gate", label, ("stream",)))
    ro = names.READOUT
    cons.append(ab.ConsumerSpec(ro, f"{ro}.in", ro, 2 * n + 1, len(srcs), f"{ro}.w"))
    native += [ab.NativeSpec(q, f"{ro}.{q}", ro, ("stream",)) for q in SUBLAYER_NATIVE[:2]]
    keep = ("hc_count", "hc_lowrank", "layer_types", "ple_layer_ids", "num_experts", "num_experts_per_tok")
    attrs = family_attrs(
        model,
        cfg,
        keep,
        "gated-streams",
        streams=int(streams),
        mixing_meaning="per-channel weights: mixing is their mean over channels and tokens",
    )
    attach = partial(_attach, p=p, n_layers=n, with_ple=with_ple, n_streams=streams)
    return decoder_adapter(
        model, cfg, NAME, srcs, cons, attrs, "gated-residual equations", native=native, attach=attach
    )


def read_weights(module: Any, hyper_input: Tensor, gate_logits: Tensor) -> tuple[Tensor, Tensor]:
    """A gated residual's per-channel stream weights A [batch, pos, stream, d_model] (input =
    sum_s A_s (*) h_s) and its gate [batch, pos, stream, d_model], from the flat streams it reads
    and the logits of ``input_mix_weight_up``.
    """
    n, d = module.hc_count, module.hidden_size
    h = hyper_input.float().unflatten(-1, (n, d))
    inv_rms = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.hc_norm.eps)  # each stream's own
    gain = 1.0 + module.hc_norm.weight.float().view(n, d)
    gate = torch.sigmoid(gate_logits.float()).unflatten(-1, (n, d))
    return gate * gain * inv_rms / n, gate


def ple_gate(key_normed: Tensor, query_normed: Tensor, d_model: int) -> Tensor:
    """The PLE's per-stream gate sigma [batch, pos, stream] from its normalised keys and queries."""
    n = key_normed.shape[-1] // d_model
    score = (key_normed.unflatten(-1, (n, d_model)) * query_normed.unflatten(-1, (n, d_model))).sum(-1)
    score = score / math.sqrt(d_model)
    return torch.sigmoid(score.abs().clamp_min(1e-6).sqrt() * score.sign())


class _Streams:
    """The per-token unrolling of one batch, fed by the model's hooks (a batch starts at the embedding)."""

    def __init__(self, send: Callable[[str, Any], None], n_streams: int):
        self.send, self.n = send, n_streams
        self.unroll: StreamUnroll | None = None
        self.held: dict[str, Tensor] = {}  # tensors of submodules, used by their parent's hook

    def embed(self, module, args, out: Tensor) -> None:
        self.unroll = StreamUnroll.start(out.shape[:2], self.n, device=out.device)
        self.send(names.EMBED, out)

    def hold(self, key: str) -> ab.Hook:
        def hook(module, args, out) -> None:
            self.held[key] = out

        return hook

    def source(self, label: str) -> ab.Hook:
        """A module whose output is the source ``label``."""
        return ab.output_hook(self.send, label)

    def gated_residual(self, label: str) -> ab.Hook:
        def hook(module, args, out) -> None:
            mixed = ab.output(out)
            a, gate = read_weights(module, args[0], self.held.pop(f"{label}.up"))
            self.send(f"{label}.w", self.unroll.read(a, mixed.dtype))
            self.send(f"{label}.in", mixed)
            self.send(f"{label}.read_gate", gate.mean(-1))
            self.send(f"{label}.read_scale", a.mean(-1) * self.n)
            if isinstance(out, tuple):  # a sublayer's gated residual; the read-out's has no write
                self.send(f"{label}.inject_gate", out[2])
                self.unroll.write(None, out[2])

        return hook

    def ple(self, i: int) -> ab.Hook:
        def hook(module, args, out: Tensor) -> None:
            value = self.held.pop(f"{i}.value")
            sigma = ple_gate(self.held.pop(f"{i}.key"), self.held.pop(f"{i}.query"), value.shape[-1])
            gated = sigma.unsqueeze(-1).to(value.dtype) * value.unsqueeze(-2)  # [batch, pos, stream, d]
            rest = out.unflatten(-1, gated.shape[-2:]) - gated
            self.send(f"{i}.ple", value)
            self.send(f"{i}.ple_gate", sigma)
            self.unroll.write(None, sigma)
            one_hot = torch.eye(self.n, dtype=torch.float64, device=value.device)
            for s in range(self.n):
                self.send(f"{i}.ple_conv.{s}", rest[:, :, s])
                self.unroll.write(None, one_hot[s].expand(*value.shape[:2], self.n))

        return hook


def _attach(
    model: Any, taps: list[tuple[str, ab.Callback]], p: str, n_layers: int, with_ple: set[int], n_streams: int
):
    state = _Streams(ab.router(taps), n_streams)
    hooks: list[tuple[str, ab.Hook]] = [(f"{p}embed_tokens", state.embed)]
    inner = text_model(model, p)
    for i in range(n_layers):
        layer = f"{p}layers.{i}"
        if i in with_ple:
            for key, sub in (("value", "value_proj"), ("key", "norm_key"), ("query", "norm_query")):
                hooks.append((f"{layer}.ple.{sub}", state.hold(f"{i}.{key}")))
            hooks.append((f"{layer}.ple", state.ple(i)))
        mixer = "linear_attn" if inner.layers[i].layer_type == "linear_attention" else "self_attn"
        for kind, hc, sublayer in (
            (names.ATTN, "attn_hyper_connection", mixer),
            (names.MLP, "mlp_hyper_connection", "mlp"),
        ):
            label = names.label(i, kind)
            hooks += [
                (f"{layer}.{hc}.input_mix_weight_up", state.hold(f"{label}.up")),
                (f"{layer}.{hc}", state.gated_residual(label)),
                (f"{layer}.{sublayer}", state.source(label)),
            ]
    ro = names.READOUT
    hooks += [
        (f"{p}hyper_connection_mixer.input_mix_weight_up", state.hold(f"{ro}.up")),
        (f"{p}hyper_connection_mixer", state.gated_residual(ro)),
    ]
    return ab.forward_hooks(model, hooks)


def stream_reads(model: Any, adapter: ab.Adapter) -> tuple[int, Callable[[Any], Any]]:
    """Where stream statistics read a Qwen4-Exp model (``probes.stream_stats``): forward hooks on every
    gated residual and on ``hyper_connection_mixer`` (per-channel read weights; no stream mixing).
    """
    return int(adapter.attrs["streams"]), lambda sums: ab.forward_hooks(model, _stream_hooks(model, sums))


def _stream_hooks(model: Any, sums: Any) -> list:
    p = prefix_of(model, BASE_CLASS, NAME)
    inner = text_model(model, p)
    held: dict[str, Tensor] = {}

    def hold(key: str):
        def hook(module, args, out) -> None:
            held[key] = out

        return hook

    def gated(label: str):
        def hook(module, args, out) -> None:
            mixed = ab.output(out)
            a, _ = read_weights(module, args[0], held.pop(label))
            h = args[0].unflatten(-1, a.shape[-2:])
            sums.record(label, h, a, None, mixed)

        return hook

    hooks = []
    for i in range(inner.config.num_hidden_layers):
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


FAMILY = transformers_family(
    NAME,
    (
        "transformers qwen4_exp (gated residual, hc_count streams, no stream mixing): per-channel read "
        "gate_s,c (1 + w_s,c) / (n rms_s) from hooks, inject gates, PLE n-gram value + per-stream conv as "
        "sources; per-feature M unrolled per token"
    ),
    MODEL_TYPES,
    BASE_CLASS,
    build,
    streams=stream_reads,
)
