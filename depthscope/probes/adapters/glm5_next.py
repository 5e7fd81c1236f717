"""Adapter for GLM-5-Next in ``transformers`` (``glm5_next``, ``glm5_next_text``): mHC streams unrolled.

Legend: batch, pos, d_model, stream (one of the N = ``hc_mult`` residual streams, 4 by default),
source (the embedding, then every sublayer output in execution order).

What the model computes (``modeling_glm5_next.py``). ``Glm5NextTextHyperConnection`` is
DeepSeek-V4's manifold-constrained hyper-connection (mHC, arXiv 2512.24880; see
``deepseek_v4``'s docstring for the equations): before each attention (linear KDA or indexed MLA)
and each MLP or MoE, ``layers.{i}.attn_hc`` / ``ffn_hc`` computes, from the RMS-normalised
flattened streams, pre = sigmoid(.) + eps, post = 2 sigmoid(.) and comb = Sinkhorn(softmax(.) +
eps) [stream_from, stream_to]; the sublayer reads sum_s pre_s h_s and the streams become
h'_k = sum_j comb[j, k] h_j + post_k f. The read-out differs from DeepSeek-V4's: ``hc_head``
(``Glm5NextTextHyperHead``) is the unweighted mean of the streams, (1/N) sum_s h_s, before the
final norm.

How it maps to the delta basis: ``streams.hyper_adapter``, the mechanism of ``deepseek_v4``
(the per-token coefficients C [stream, source] of the streams, a row of M = sum_s pre_s C[s]).
Sources: the token embedding (the N copies) and each attention and MLP output as the
hyper-connection receives it, before ``post``. Consumers: each sublayer's collapsed input (the
output of its hyper-connection, before the sublayer's RMSNorm) and the read-out's mean of the
streams (the final norm's input); the read-out's row is (1/N) sum_s C[s]. ``pre`` is recomputed
from the hyper-connection's input with its own parameters (the same function as DeepSeek-V4's,
float32 like the module); ``post`` and ``comb`` are its outputs. The residual identity checks all
of it on every batch.

Native quantities under DeepSeek's names, token means per consumer: ``pre`` (layer, stream) (the
read-out row holds the head's 1/N), ``post`` (layer, stream), ``comb`` (layer, stream_from,
stream_to); attrs ``comb_row_error_max`` / ``comb_col_error_max`` and ``composite_gain_max`` /
``composite_gain_min`` as for ``deepseek_v4``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from depthscope.probes.adapters import deepseek_v4
from depthscope.probes.adapters.base import Adapter
from depthscope.probes.adapters.deepseek_v4 import mhc_pre
from depthscope.probes.adapters.registry import transformers_detect
from depthscope.probes.adapters.streams import HyperForm, hyper_adapter

FAMILY = "glm5_next"
PACKAGE = "transformers"
VERSION = "5.24.0"
PRIORITY = 20
MODEL_TYPES = ("glm5_next", "glm5_next_text")  # the multimodal config and its text config
READS = (
    "transformers glm5_next (DeepSeek-V4's mHC, hc_mult streams): the shared stream unrolling, pre "
    "recomputed, post and comb hooked, the read-out the mean of the streams; M = sum_s pre_s C[s]"
)
BASE_CLASS = "Glm5NextTextModel"


detect = transformers_detect(MODEL_TYPES, BASE_CLASS)


def mean_head(head: Any, streams: Tensor) -> Tensor:
    """``Glm5NextTextHyperHead``'s read-out weights: 1/N on every stream (an unweighted mean)."""
    n = streams.shape[-2]
    return torch.full(streams.shape[:-2] + (n,), 1.0 / n, dtype=torch.float32, device=streams.device)


FORM = HyperForm(
    family=FAMILY,
    base_class=BASE_CLASS,
    scheme="mhc",
    pre=mhc_pre,
    head_pre=mean_head,
    unpack=lambda out: out,  # (post, comb, collapsed)
    keep=deepseek_v4.FORM.keep,  # the same config keys as DeepSeek-V4 (its subclass in transformers)
)


def build(model: Any) -> Adapter:
    """The adapter of a GLM-5-Next model: DeepSeek-V4's stream unrolling with a mean read-out."""
    return hyper_adapter(model, FORM)
