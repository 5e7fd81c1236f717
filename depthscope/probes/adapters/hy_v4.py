"""Adapter for Hunyuan-V4 in ``transformers`` (``hy_v4``): independent hyper-connection streams unrolled.

Legend: batch, pos, d_model, stream (one of the N = ``hc_mult`` residual streams), source (the
embedding, then every sublayer output in execution order).

What the model computes (``modeling_hy_v4.py``). ``HYV4HyperConnection`` is DeepSeek-V4's
hyper-connection (Hyper-Connections, arXiv 2409.19606; mHC, arXiv 2512.24880) without ``comb``:
the streams are never mixed with one another. Before each attention and each MLP or MoE,
``layers.{i}.attn_hc`` / ``ffn_hc`` computes from the flattened streams x = vec(h), in float32,
m = (fn x) / rms(x) (the projection first, then divided by x's RMS: the same logits as
DeepSeek-V4's norm-then-project) split into [N, N], and

    pre  = sigmoid(scale[0] m_pre  + base_pre)  + eps                          [stream]
    post = hc_magnitude sigmoid(scale[1] m_post + base_post) + eps             [stream]

(``hc_magnitude`` from the config, 2 by default, where DeepSeek-V4 has a fixed 2). The sublayer
reads sum_s pre_s h_s and each stream gets its share of the output: h'_k = h_k + post_k f. The
read-out (``hc_head``, ``HYV4HyperHead``) collapses the streams with its own pre_head =
sigmoid(hc_scale (hc_fn x) / rms(x) + hc_base) + eps before the final norm.

How it maps to the delta basis: ``streams.hyper_adapter``, the mechanism of ``deepseek_v4``, with
the identity for the stream map (C <- C, then the column ``post`` appended). Sources: the token
embedding (the N copies) and each attention and MLP output as the hyper-connection receives it,
before ``post``. Consumers: each sublayer's collapsed input (the hyper-connection's output, before
the sublayer's RMSNorm) and the collapsed read-out (the final norm's input). ``pre`` and the
head's weights are recomputed from the modules' inputs with their own parameters, in float32 as
the modules compute them; ``post`` is the hyper-connection's output. The residual identity checks
all of it on every batch.

Native quantities, token means per consumer: ``pre`` (layer, stream) (the read-out row holds the
head's weights) and ``post`` (layer, stream). No ``comb``: there is nothing doubly stochastic to
check.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from depthscope.probes.adapters.base import Adapter
from depthscope.probes.adapters.registry import transformers_detect
from depthscope.probes.adapters.streams import HyperForm, hyper_adapter

FAMILY = "hy_v4"
PACKAGE = "transformers"
VERSION = "5.24.0"
PRIORITY = 20
MODEL_TYPES = ("hy_v4",)
READS = (
    "transformers hy_v4 (DeepSeek-V4's hyper-connection without comb, hc_mult streams never mixed): the "
    "shared stream unrolling, pre and hc_head's pre recomputed, post hooked; M = sum_s pre_s C[s]"
)
BASE_CLASS = "HYV4Model"


detect = transformers_detect(MODEL_TYPES, BASE_CLASS)


def _logits(fn: Tensor, streams: Tensor, eps: float) -> Tensor:
    """(fn x) / rms(x) for the flattened streams x, in float32 (the projection, then the norm)."""
    flat = streams.flatten(2).float()
    return F.linear(flat, fn.float()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)


def hy_pre(hc: Any, streams: Tensor) -> Tensor:
    """An ``HYV4HyperConnection``'s pre weights [batch, pos, stream] from the streams it reads."""
    n = hc.hc_mult
    logits = _logits(hc.fn, streams, hc.input_norm.eps)[..., :n]
    return torch.sigmoid(logits * hc.scale[0].float() + hc.base[:n].float()) + hc.hc_eps


def hy_head_pre(head: Any, streams: Tensor) -> Tensor:
    """``HYV4HyperHead``'s read-out weights [batch, pos, stream] from the final streams."""
    logits = _logits(head.hc_fn, streams, head.input_norm.eps)
    return torch.sigmoid(logits * head.hc_scale.float() + head.hc_base.float()) + head.eps


FORM = HyperForm(
    family=FAMILY,
    base_class=BASE_CLASS,
    scheme="hc",
    pre=hy_pre,
    head_pre=hy_head_pre,
    unpack=lambda out: (out[0], None, out[1]),  # (post, collapsed): no comb
    keep=(
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "hc_mult",
        "hc_magnitude",
        "hc_eps",
        "n_routed_experts",
        "num_experts_per_tok",
        "mlp_layer_types",
        "vocab_size",
        "max_position_embeddings",
    ),
    mixes_streams=False,
)


def build(model: Any) -> Adapter:
    """The adapter of a Hunyuan-V4 model: the shared stream unrolling with no stream mixing."""
    return hyper_adapter(model, FORM)
