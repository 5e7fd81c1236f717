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

How it maps to the delta basis (``streams.hyper_adapter``, shared with ``glm5_next`` and
``hy_v4``; exact per token): sources are the token
embedding (the N copies) and each attention and MoE output exactly as the hyper-connection
receives it, before ``post`` is applied (``self_attn`` output, ``mlp`` output). Per token the
coefficients C [stream, source] of the streams start at ones on the embedding; a sublayer's row
of M is sum_s pre_s C[s, :], after which C <- comb^T C and the column ``post`` is appended; the
read-out's row is sum_s pre_head_s C[s, :]. Consumers are each sublayer's collapsed input (what
it reads, before its RMSNorm) and the collapsed read-out (the final norm's input). Rows are raw:
pre sums to about N/2 at initialisation, so rows are not normalised (see docs/design.md, "The trace").

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

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from depthscope.probes.adapters.base import Adapter
from depthscope.probes.adapters.registry import transformers_detect
from depthscope.probes.adapters.streams import HyperForm, hyper_adapter, unweighted_rms

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


detect = transformers_detect(MODEL_TYPES, BASE_CLASS)


def mhc_pre(hc: Any, streams: Tensor) -> Tensor:
    """A ``DeepseekV4HyperConnection``'s pre weights [batch, pos, stream] from the streams it reads
    (``glm5_next``'s subclass computes them alike).
    """
    n = hc.hc_mult
    x = unweighted_rms(streams.flatten(2), hc.input_norm.eps)
    logits = F.linear(x, hc.fn.float())[..., :n]
    return torch.sigmoid(logits * hc.scale[0].float() + hc.base[:n].float()) + hc.hc_eps


def head_pre(head: Any, streams: Tensor) -> Tensor:
    """``DeepseekV4HyperHead``'s read-out weights [batch, pos, stream] from the final streams."""
    x = unweighted_rms(streams.flatten(2), head.input_norm.eps)
    logits = F.linear(x, head.hc_fn.float())
    return torch.sigmoid(logits * head.hc_scale.float() + head.hc_base.float()) + head.eps


FORM = HyperForm(
    family=FAMILY,
    base_class=BASE_CLASS,
    scheme="mhc",
    pre=mhc_pre,
    head_pre=head_pre,
    unpack=lambda out: out,  # (post, comb, collapsed)
    keep=(
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
    ),
)


def build(model: Any) -> Adapter:
    """The adapter of a DeepSeek-V4 model: weights unrolled per token from the mHC streams, ``pre``,
    ``post`` and ``comb`` kept as native quantities, the Sinkhorn and composite checks as attrs.
    """
    return hyper_adapter(model, FORM)
