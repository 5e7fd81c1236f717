"""The transformers families built on DeepSeek-V4's hyper-connections, one row each: ``deepseek_v4``,
``glm5_next`` and ``hy_v4`` (``modeling_*.py`` of transformers 5.24).

Legend: batch, pos, d_model, stream (one of the N = ``hc_mult`` residual streams), source (the
embedding, then every sublayer output in execution order).

What the models compute. The residual is N streams h_1..h_N [batch, pos, stream, d_model], all
copies of the token embedding at the start. Before each attention and each MLP or MoE, a
hyper-connection (``layers.{i}.attn_hc`` / ``ffn_hc``) reads the streams; with x = vec(h) and
m = fn x / rms(x) (in float32) split into [N, N, N*N]:

    pre  = sigmoid(scale[0] m_pre  + base_pre) + eps                     [stream]
    post = 2 sigmoid(scale[1] m_post + base_post)                        [stream]
    comb = Sinkhorn(softmax(scale[2] m_comb + base_comb, -1) + eps)      [stream_from, stream_to]

(DeepSeek-V4's mHC, arXiv 2512.24880: Sinkhorn is ``hc_sinkhorn_iters`` rounds of row then column
normalisation, each sum + eps). The sublayer f reads the collapsed input sum_s pre_s h_s (through
its own RMSNorm, inside the sublayer) and the streams become h'_k = sum_j comb[j, k] h_j + post_k f
(source-row convention: comb^T h). The read-out (``hc_head``) collapses the streams with its own
weights before the final norm. The rows differ in:

* ``deepseek_v4``: the head's pre_head = sigmoid(hc_scale (hc_fn x) + hc_base) + eps;
* ``glm5_next``: DeepSeek-V4's hyper-connection (a subclass), its head the unweighted mean of the
  streams, (1/N) sum_s h_s;
* ``hy_v4`` (Hyper-Connections, arXiv 2409.19606, without ``comb``): the streams are never mixed
  (h'_k = h_k + post_k f), post = ``hc_magnitude`` sigmoid(.) + eps, the projection taken before
  the division by rms(x) (the same logits).

How it maps to the delta basis (``streams.hyper_adapter``; exact per token): sources are the token
embedding (the N copies) and each attention and MLP output exactly as the hyper-connection receives
it, before ``post``. Per token the coefficients C [stream, source] of the streams start at ones on
the embedding; a sublayer's row of M is sum_s pre_s C[s, :], after which C <- comb^T C and the
column ``post`` is appended; the read-out's row is sum_s pre_head_s C[s, :]. Consumers are each
sublayer's collapsed input (what it reads, before its RMSNorm) and the collapsed read-out (the final
norm's input). Rows are raw: pre sums to about N/2 at initialisation, so rows are not normalised.
``post`` and ``comb`` are the hyper-connection's own outputs (forward hook); ``pre`` is consumed
inside the module, so it is recomputed from the hook's input with the module's parameters, the
same float32 operations (the residual identity confirms it on every batch).

Native quantities under DeepSeek's names, token means per consumer: ``pre`` (layer, stream) (the
read-out row holds the head's weights), ``post`` (layer, stream) and, where streams are mixed,
``comb`` (layer, stream_from, stream_to). Attrs, over every token of the capture:
``comb_row_error_max`` / ``comb_col_error_max``, the largest |row or column sum - 1| of any
``comb``, and ``composite_gain_max`` / ``composite_gain_min``, the largest and smallest row or
column sum of the per-token product of all the ``comb`` matrices over depth (1 for an exactly
doubly stochastic composite).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from depthscope.probes.adapters.family import Family, transformers_family
from depthscope.probes.adapters.streams import HyperForm, hyper_adapter, hyper_stream_reads, unweighted_rms


def mhc_pre(hc: Any, streams: Tensor) -> Tensor:
    """A DeepSeek-V4 (or GLM-5-Next) hyper-connection's pre weights [batch, pos, stream]."""
    n = hc.hc_mult
    x = unweighted_rms(streams.flatten(2), hc.input_norm.eps)
    logits = F.linear(x, hc.fn.float())[..., :n]
    return torch.sigmoid(logits * hc.scale[0].float() + hc.base[:n].float()) + hc.hc_eps


def mhc_head_pre(head: Any, streams: Tensor) -> Tensor:
    """``DeepseekV4HyperHead``'s read-out weights [batch, pos, stream] from the final streams."""
    x = unweighted_rms(streams.flatten(2), head.input_norm.eps)
    logits = F.linear(x, head.hc_fn.float())
    return torch.sigmoid(logits * head.hc_scale.float() + head.hc_base.float()) + head.eps


def mean_head(head: Any, streams: Tensor) -> Tensor:
    """``Glm5NextTextHyperHead``'s read-out weights: 1/N on every stream (an unweighted mean)."""
    n = streams.shape[-2]
    return torch.full(streams.shape[:-2] + (n,), 1.0 / n, dtype=torch.float32, device=streams.device)


def _hy_logits(fn: Tensor, streams: Tensor, eps: float) -> Tensor:
    """(fn x) / rms(x) for the flattened streams x, in float32 (the projection, then the norm)."""
    flat = streams.flatten(2).float()
    return F.linear(flat, fn.float()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)


def hy_pre(hc: Any, streams: Tensor) -> Tensor:
    """An ``HYV4HyperConnection``'s pre weights [batch, pos, stream] from the streams it reads."""
    n = hc.hc_mult
    logits = _hy_logits(hc.fn, streams, hc.input_norm.eps)[..., :n]
    return torch.sigmoid(logits * hc.scale[0].float() + hc.base[:n].float()) + hc.hc_eps


def hy_head_pre(head: Any, streams: Tensor) -> Tensor:
    """``HYV4HyperHead``'s read-out weights [batch, pos, stream] from the final streams."""
    logits = _hy_logits(head.hc_fn, streams, head.input_norm.eps)
    return torch.sigmoid(logits * head.hc_scale.float() + head.hc_base.float()) + head.eps


MHC_KEEP = (  # config keys recorded in the trace's ``config`` attr (with hf.SHAPE_KEYS)
    "hc_mult",
    "hc_sinkhorn_iters",
    "hc_eps",
    "n_routed_experts",
    "num_experts_per_tok",
    "layer_types",
    "mlp_layer_types",
)
DEEPSEEK_V4 = HyperForm(
    "deepseek_v4", "DeepseekV4Model", "mhc", mhc_pre, mhc_head_pre, lambda out: out, MHC_KEEP
)
GLM5_NEXT = HyperForm("glm5_next", "Glm5NextTextModel", "mhc", mhc_pre, mean_head, lambda out: out, MHC_KEEP)
HY_V4 = HyperForm(
    "hy_v4",
    "HYV4Model",
    "hc",
    hy_pre,
    hy_head_pre,
    lambda out: (out[0], None, out[1]),  # (post, collapsed): no comb
    tuple(k for k in MHC_KEEP if k not in ("hc_sinkhorn_iters", "layer_types")) + ("hc_magnitude",),
    mixes_streams=False,
)


def _family(form: HyperForm, model_types: tuple[str, ...], reads: str) -> Family:
    build = lambda model: hyper_adapter(model, form)  # noqa: E731
    return transformers_family(
        form.family, reads, model_types, form.base_class, build, streams=hyper_stream_reads(form)
    )


FAMILIES = (
    _family(
        DEEPSEEK_V4,
        ("deepseek_v4",),
        "transformers deepseek_v4 (mHC, hc_mult streams): attn_hc/ffn_hc post and comb hooked, pre and "
        "hc_head's pre recomputed from their inputs; streams unrolled per token, M = sum_s pre_s C[s]",
    ),
    _family(
        GLM5_NEXT,
        ("glm5_next", "glm5_next_text"),  # the multimodal config and its text config
        "transformers glm5_next (DeepSeek-V4's mHC, hc_mult streams): the shared stream unrolling, pre "
        "recomputed, post and comb hooked, the read-out the mean of the streams; M = sum_s pre_s C[s]",
    ),
    _family(
        HY_V4,
        ("hy_v4",),
        "transformers hy_v4 (DeepSeek-V4's hyper-connection without comb, hc_mult streams never mixed): "
        "the shared stream unrolling, pre and hc_head's pre recomputed, post hooked; M = sum_s pre_s C[s]",
    ),
)
