"""Adapter for Gemma 3n in ``transformers`` (``gemma3n_text``, ``gemma3n``): AltUp streams and LAuReL.

Legend: batch, pos, d_model, stream (one of the n = ``altup_num_inputs`` AltUp streams, 4 by
default; a = ``altup_active_idx`` the one the layers compute on), source (see below, in execution
order).

What the model computes (``modeling_gemma3n.py``). The residual is n streams X_0..X_{n-1}: X_0
the scaled token embedding e, X_k (k >= 1) its projection ``altup_projections[k-1]`` rescaled to
e's RMS. Each decoder layer (``Gemma3nTextDecoderLayer``), with AltUp (``Gemma3nTextAltUp``,
Alternating Updates, NeurIPS 2023) around it:

* predict: from the router's modalities (tanh of ``modality_router`` on the normed X_a),
  ``prediction_coefs`` gives per token an n x n matrix W, and P_j = X_j + sum_i W[j, i] X_i;
* the attention reads P_a (through ``input_layernorm``); LAuReL (``Gemma3nTextLaurelBlock``, a
  low-rank ``linear_left``/``linear_right`` with ``post_laurel_norm``, plus its own skip of the
  normed input) reads the same normed input; the layer mixes Y = (P_a + attn + laurel) / sqrt(2)
  (attn after ``post_attention_layernorm``);
* the MLP reads Y (through ``pre_feedforward_layernorm``) and A = Y + mlp (after
  ``post_feedforward_layernorm``);
* correct: with c_k = ``correction_coefs``(modalities of A) + 1, every stream becomes
  X'_k = P_k + c_k (A - P_a);
* per-layer input: a gated projection of the corrected active stream and the layer's per-layer
  token embedding (``per_layer_input_gate``, ``per_layer_projection``,
  ``post_per_layer_input_norm``) is added to the streams X_1..X_{n-1} (not to X_0).

The read-out averages X_0 and, for k >= 1, ``altup_unembed_projections[k-1]``(X_k) rescaled to
X_0's RMS (r_k = rms(X_0) / max(rms(U_k X_k), sqrt(1e-5))), then the final norm.

How it maps to the delta basis (exact per token). Every step above is, per token, a linear
combination of vectors the model computes, with coefficients from its own modules: the streams'
coefficients C [stream, source] over the sources start at the identity and are updated by the
hooked W and c (float64). Sources, in order: ``embed`` (X_0 as layer 0 receives it) and
``embed.stream{k}`` (the rescaled projections X_k as layer 0 receives them, kind ``embed``);
then per layer ``{i}.laurel`` (LAuReL's whole output, its skip included: what enters the
stream, kind ``attn``), ``{i}.attn``, ``{i}.mlp`` and ``{i}.ple`` (the per-layer-input write,
kind ``embed`` as the per-layer embeddings of ``qwen4_exp``, depth of the layer's MLP); then
``readout.stream{k}`` (U_k X_k as the projection returns it, kind ``readout``, written just
before the read-out). The projections are d x d maps, not scalars, so the projected vectors are
sources of their own (a scalar coefficient of earlier sources cannot carry them); their
rescaling r_k (recomputed in float64 from the hooked X_0 and U_k X_k) is a coefficient. The
1/sqrt(2) of LAuReL's mix is a coefficient too. Consumers: ``{i}.attn`` (P_a, the input of
``input_layernorm``: attention and LAuReL read it), ``{i}.mlp`` (Y, the input of
``pre_feedforward_layernorm``) and ``readout`` (the final norm's input). AltUp's router and the
per-layer-input gate also read the streams; like a hyper-connection's own projection they are
part of the mixing, not consumer rows. Layers that share an earlier layer's keys and values
(``num_kv_shared_layers``) read them as that layer computed them; their rows describe their
query input.

Native quantities, token means per consumer: ``altup_prediction`` (layer, stream_from,
stream_to) = I + W^T in the source-row convention (P_t = sum_s M[s, t] X_s), on each layer's
attention row; ``altup_correction`` (layer, stream) = c, on each layer's MLP row.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from depthscope.probes.adapters import base as ab
from depthscope.probes.adapters.family import transformers_family
from depthscope.probes.adapters.hf import decoder_adapter, family_attrs, prefix_of, text_model
from depthscope.schemes import names

NAME = "gemma3n"
MODEL_TYPES = ("gemma3n", "gemma3n_text")  # the multimodal config and its text config
BASE_CLASS = "Gemma3nTextModel"
PER_LAYER = ("laurel", names.ATTN, names.MLP, "ple")  # the sources of a layer, in execution order
MIN_RMS = 1e-5  # the read-out clamps each projected stream's mean square to at least this


def layout(n_layers: int, streams: int) -> tuple[list[ab.SourceSpec], list[ab.ConsumerSpec]]:
    """Sources and consumers of a Gemma 3n decoder (see the module docstring)."""
    srcs = [ab.SourceSpec(names.EMBED, names.EMBED, names.EMBED, 0)]
    srcs += [ab.SourceSpec(f"embed.stream{k}", f"embed.stream{k}", names.EMBED, 0) for k in range(1, streams)]
    cons = []
    for i in range(n_layers):
        attn, mlp = names.label(i, names.ATTN), names.label(i, names.MLP)
        cons.append(ab.ConsumerSpec(attn, f"{attn}.in", names.ATTN, 2 * i + 1, len(srcs), f"{attn}.w"))
        srcs.append(ab.SourceSpec(f"{i}.laurel", f"{i}.laurel", names.ATTN, 2 * i + 1))
        srcs.append(ab.SourceSpec(attn, attn, names.ATTN, 2 * i + 1))
        cons.append(ab.ConsumerSpec(mlp, f"{mlp}.in", names.MLP, 2 * i + 2, len(srcs), f"{mlp}.w"))
        srcs.append(ab.SourceSpec(mlp, mlp, names.MLP, 2 * i + 2))
        srcs.append(ab.SourceSpec(f"{i}.ple", f"{i}.ple", names.EMBED, 2 * i + 2))
    srcs += [
        ab.SourceSpec(f"readout.stream{k}", f"readout.stream{k}", names.READOUT, 2 * n_layers)
        for k in range(1, streams)
    ]
    ro = names.READOUT
    cons.append(ab.ConsumerSpec(ro, f"{ro}.in", ro, 2 * n_layers + 1, len(srcs), f"{ro}.w"))
    return srcs, cons


def build(model: Any) -> ab.Adapter:
    """The adapter of a Gemma 3n model: AltUp's streams and LAuReL unrolled per token."""
    p = prefix_of(model, BASE_CLASS, NAME)
    cfg = text_model(model, p).config
    n, streams = cfg.num_hidden_layers, cfg.altup_num_inputs
    srcs, cons = layout(n, streams)
    native = []
    for i in range(n):
        attn, mlp = names.label(i, names.ATTN), names.label(i, names.MLP)
        native.append(
            ab.NativeSpec("altup_prediction", f"{attn}.prediction", attn, ("stream_from", "stream_to"))
        )
        native.append(ab.NativeSpec("altup_correction", f"{mlp}.correction", mlp, ("stream",)))
    keep = (
        "altup_num_inputs",
        "altup_active_idx",
        "laurel_rank",
        "hidden_size_per_layer_input",
        "num_kv_shared_layers",
        "layer_types",
    )
    attrs = family_attrs(model, cfg, keep, "altup", streams=int(streams))
    attach = partial(_attach, p=p, n_layers=n, streams=streams, active=int(cfg.altup_active_idx))
    return decoder_adapter(
        model, cfg, NAME, srcs, cons, attrs, "AltUp and LAuReL equations", native=native, attach=attach
    )


class AltUpStreams:
    """The per-token coefficients C [batch, pos, stream, source] of one batch, fed by the hooks."""

    def __init__(self, send: Callable[[str, Any], Any], n_layers: int, streams: int, active: int):
        self.send, self.n, self.active = send, streams, active
        self.n_sources = streams + len(PER_LAYER) * n_layers + streams - 1
        self.coef: Tensor | None = None
        self.final: Tensor | None = None  # X_0 after the last layer
        self.scales: list[Tensor] = []  # r_k of the read-out's projected streams

    def column(self, i: int, what: str) -> int:
        """Index of layer i's source ``what`` (``laurel``, ``attn``, ``mlp``, ``ple``)."""
        return self.n + len(PER_LAYER) * i + PER_LAYER.index(what)

    def start(self, module, args, kwargs) -> None:
        """Layer 0's input streams [stream, batch, pos, d]: the first n sources, C the identity."""
        x = args[0] if args else kwargs["hidden_states"]
        self.coef = x.new_zeros((*x.shape[1:3], self.n, self.n_sources), dtype=torch.float64)
        self.coef[..., range(self.n), range(self.n)] = 1.0
        self.scales = []
        self.send(names.EMBED, x[0])
        for k in range(1, self.n):
            self.send(f"embed.stream{k}", x[k])

    def predict(self, i: int) -> ab.Hook:
        """``prediction_coefs``' output W (per token, row-major n x n): P_j = X_j + sum_i W[j, i] X_i."""

        def hook(module, args, out: Tensor) -> None:
            w = out.double().unflatten(-1, (self.n, self.n))
            res = torch.eye(self.n, dtype=torch.float64, device=w.device) + w.transpose(-1, -2)
            self.coef = torch.einsum("bpst,bpsn->bptn", res, self.coef)
            attn, mlp = names.label(i, names.ATTN), names.label(i, names.MLP)
            read = self.coef[..., self.active, :]
            self.send(f"{attn}.prediction", res)
            self.send(f"{attn}.w", read[..., : self.column(i, "laurel")])
            mixed = read.clone()
            mixed[..., [self.column(i, "laurel"), self.column(i, names.ATTN)]] = 1.0
            self.send(f"{mlp}.w", mixed[..., : self.column(i, names.MLP)] / math.sqrt(2.0))

        return hook

    def correct(self, i: int) -> ab.Hook:
        """``correction_coefs``' output: c = output + 1, X'_k = P_k + c_k (A - P_a)."""

        def hook(module, args, out: Tensor) -> None:
            c = out.double() + 1.0
            pred_a = self.coef[..., self.active, :]
            activated = pred_a / math.sqrt(2.0)
            activated[..., [self.column(i, "laurel"), self.column(i, names.ATTN)]] = 1.0 / math.sqrt(2.0)
            activated[..., self.column(i, names.MLP)] = 1.0
            self.coef = self.coef + c.unsqueeze(-1) * (activated - pred_a).unsqueeze(-2)
            self.send(f"{names.label(i, names.MLP)}.correction", c)

        return hook

    def per_layer(self, i: int) -> ab.Hook:
        """The per-layer-input write: a source added to the streams 1..n-1."""

        def hook(module, args, out: Tensor) -> None:
            self.coef[..., 1:, self.column(i, "ple")] = 1.0
            self.send(f"{i}.ple", out)

        return hook

    def last_layer(self, module, args, out: Tensor) -> None:
        """The streams after the last layer: X_0 is what the read-out's projections are scaled to."""
        self.final = out[0]

    def unembed(self, k: int) -> ab.Hook:
        """``altup_unembed_projections[k-1]``'s output U_k X_k: a source, weight r_k / n."""

        def hook(module, args, out: Tensor) -> None:
            target = self.final.double().square().mean(-1).sqrt()
            self.scales.append(target / out.double().square().mean(-1).clamp_min(MIN_RMS).sqrt())
            self.send(f"readout.stream{k}", out)
            if k == self.n - 1:
                w = self.coef[..., 0, :].clone()
                w[..., self.n_sources - self.n + 1 :] = torch.stack(self.scales, dim=-1)
                self.send(f"{names.READOUT}.w", w / self.n)

        return hook

    def source(self, label: str) -> ab.Hook:
        """A module whose output is the source ``label``."""
        return ab.output_hook(self.send, label)


@contextlib.contextmanager
def _attach(
    model: Any, taps: list[tuple[str, ab.Callback]], p: str, n_layers: int, streams: int, active: int
):
    send = ab.router(taps)
    state = AltUpStreams(send, n_layers, streams, active)
    hooks: list[tuple[str, ab.Hook]] = []
    inputs: list[tuple[str, ab.Callback]] = []
    for i in range(n_layers):
        layer = f"{p}layers.{i}"
        hooks += [
            (f"{layer}.altup.prediction_coefs", state.predict(i)),
            (f"{layer}.laurel", state.source(f"{i}.laurel")),
            (f"{layer}.post_attention_layernorm", state.source(names.label(i, names.ATTN))),
            (f"{layer}.post_feedforward_layernorm", state.source(names.label(i, names.MLP))),
            (f"{layer}.altup.correction_coefs", state.correct(i)),
            (f"{layer}.post_per_layer_input_norm", state.per_layer(i)),
        ]
        for kind, norm in ((names.ATTN, "input_layernorm"), (names.MLP, "pre_feedforward_layernorm")):
            label = names.label(i, kind)
            inputs.append((f"{layer}.{norm}:in", ab.relay(send, f"{label}.in")))
    hooks.append((f"{p}layers.{n_layers - 1}", state.last_layer))
    hooks += [(f"{p}altup_unembed_projections.{k - 1}", state.unembed(k)) for k in range(1, streams)]
    inputs.append((f"{p}norm:in", ab.relay(send, f"{names.READOUT}.in")))
    first = model.get_submodule(f"{p}layers.0").register_forward_pre_hook(state.start, with_kwargs=True)
    try:
        with ab.forward_hooks(model, hooks), ab.module_attach(model, inputs):
            yield
    finally:
        first.remove()


FAMILY = transformers_family(
    NAME,
    (
        "transformers gemma3n (AltUp streams, LAuReL): predict and correct coefficients hooked and "
        "unrolled per "
        "token; LAuReL, per-layer inputs and the read-out's stream projections as sources, 1/sqrt(2) a weight"
    ),
    MODEL_TYPES,
    BASE_CLASS,
    build,
)
