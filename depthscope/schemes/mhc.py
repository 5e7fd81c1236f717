"""Manifold-Constrained Hyper-Connections, mHC (DeepSeek-AI, arXiv 2512.24880).

Legend: batch, pos, d_model, stream (one of the n parallel residual streams), source (embedding,
then sublayer outputs in execution order).

Hyper-connections (``hc.py``) whose stream-mixing matrices are constrained (the paper's
parameterisation and manifold projection).
Per attention and per MLP, from the flattened streams x' = RMSNorm(vec(H)) [batch, pos, n*d_model]:

    H~_pre  = a_pre  (x' phi_pre)  + b_pre         H_pre  = sigmoid(H~_pre)           [stream]
    H~_post = a_post (x' phi_post) + b_post        H_post = 2 sigmoid(H~_post)        [stream]
    H~_res  = a_res mat(x' phi_res) + b_res        H_res  = Sinkhorn-Knopp(H~_res)    [stream, stream]

with phi_pre, phi_post [n*d_model, stream], phi_res [n*d_model, stream*stream] (stored as the
rows of one ``phi`` [2n + n*n, n*d_model]) and the scalars ``alpha`` = (a_pre, a_post, a_res),
init 0.01. Sinkhorn-Knopp: M = exp(H~_res - max), then ``sinkhorn_iters`` (20) rounds of
normalising rows, then columns; H_res is (approximately) doubly stochastic, so every stream
update is a convex mix of streams and products over depth stay doubly stochastic.
The update, in the same source-row convention as ``hc.py`` (H_res[s, t]: from stream s to t):

    h_in = sum_s H_pre[s] h_s,    h'_t = sum_s H_res[s, t] h_s + H_post[t] f(h_in)

(the paper writes x_{l+1} = H_res x_l + H_post^T f(H_pre x_l), i.e. our H_res transposed). Each
round ends with the column normalisation, so every target stream's weights sum to 1 exactly.
Read-out: the streams summed, then the model's final norm. The delta-basis unrolling and the
native hooks ``hook_h_pre`` [batch, pos, stream], ``hook_h_res`` [batch, pos, stream, stream]
(the Sinkhorn-projected matrix, source x target) and ``hook_h_post`` [batch, pos, stream] are
those of ``hc.py``.

Choices (the paper gives neither the static-bias init nor the read-out):
* x' is a weightless RMSNorm over all n*d_model features (as DeepSeek-V4; a gain would be
  redundant with phi);
* phi = 0 and a_* = 0.01: at init every matrix is static (phi moves first, its gradient being
  proportional to a);
* b_post = 0, so H_post = 1; b_res = identity (diagonal 1, off-diagonal 0, as the lucidrains
  port), so H_res = (e I + (1 - I)) / (e + n - 1), diagonal-dominant and doubly stochastic;
* b_pre puts (n+1)/(2n) on stream k mod n (k counts sublayers in execution order) and 1/(2n) on
  the others: H_pre sums to 1, so with identical streams the model is exactly the standard
  residual at init (up to the final norm's eps), and, unlike a uniform 1/n, it breaks the
  symmetry between streams (with uniform biases every stream stays identical under gradient
  descent, and the streams never differentiate). Hence at least 2 streams;
* the constraints (sigmoids, Sinkhorn) run in at least float32; Sinkhorn's sums are clamped at
  the smallest positive float (no eps added), and its backward is hand-written but exact (the
  gradient of the 20 unrolled rounds, not an implicit fixed-point gradient);
* the read-out is a plain sum of the streams (DeepSeek-V4 learns read-out weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from depthscope.errors import ConfigError
from depthscope.schemes._common import inv_rms
from depthscope.schemes.base import ModelConfig, Site, register
from depthscope.schemes.hc import StreamMixer, StreamScheme, thin_matmul


@dataclass(frozen=True)
class MHCOptions:
    """Expansion rate n (the number of streams) and the rounds of Sinkhorn-Knopp (20, as the paper)."""

    streams: int = 4  # expansion rate n
    sinkhorn_iters: int = 20


def sinkhorn(logits: Tensor, iters: int) -> Tensor:
    """Sinkhorn-Knopp over the last two dims: M = exp(logits - max), then ``iters`` rounds of
    normalising rows, then columns, to sum 1.
    """
    n = logits.shape[-1]
    token_last = rearrange(logits.reshape(-1, n, n), "token source target -> source target token")
    out = _Sinkhorn.apply(token_last, iters)
    return rearrange(out, "source target token -> token source target").reshape(logits.shape)


class _Sinkhorn(torch.autograd.Function):
    """Sinkhorn-Knopp of [source, target, token] matrices, with a hand-written exact backward.

    Tokens last and contiguous: sums over a 4-long dim are an order of magnitude faster that way
    than over the last dims, and one Function avoids an autograd node per small op.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, iters: int) -> Tensor:
        if iters < 1:
            raise ValueError(f"sinkhorn needs at least one iteration, got {iters}")
        x = logits.contiguous()
        m = torch.exp(x - x.amax(dim=(0, 1), keepdim=True))
        tiny = torch.finfo(m.dtype).tiny
        saved = [m]
        for _ in range(iters):
            for dim in (1, 0):  # rows (over targets), then columns (over sources)
                total = m.sum(dim, keepdim=True).clamp_min(tiny)
                m = m / total
                saved += [total, m]
        ctx.save_for_backward(*saved)
        return m

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        m0, *steps = ctx.saved_tensors
        g = grad.contiguous()
        for k in reversed(range(len(steps) // 2)):
            total, y = steps[2 * k], steps[2 * k + 1]
            # y = x / sum(x): dx = (dy - sum(dy * y)) / sum(x)
            g = (g - (g * y).sum(1 if k % 2 == 0 else 0, keepdim=True)) / total
        # exp(x - max): the max shifts every logit alike, which no normalised output sees
        return g * m0, None


def pre_bias(n: int, index: int) -> Tensor:
    """Logits whose sigmoids are (n+1)/(2n) on stream ``index % n`` and 1/(2n) elsewhere (sum 1)."""
    b = torch.full((n,), -math.log(2 * n - 1))
    b[index % n] = math.log((n + 1) / (n - 1))
    return b


class ManifoldHyperConnection(StreamMixer):
    """One mHC: sigmoid pre/post weights and a Sinkhorn-projected residual matrix (arXiv 2512.24880)."""

    decayed = ("phi",)  # dynamic projections decayed, static biases and scales not (as HC's paper)

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        n = self.n
        self.iters = getattr(cfg.options, "sinkhorn_iters", 0)  # sHC (a subclass) has no Sinkhorn rounds
        # rows: phi_pre (n), phi_post (n), phi_res (n*n, row-major source x target); stored
        # transposed ([out, in], as nn.Linear) for the fast orientation of the product
        self.phi = nn.Parameter(torch.zeros(2 * n + n * n, n * cfg.d_model))
        self.alpha = nn.Parameter(torch.full((3,), 0.01))  # a_pre, a_post, a_res
        self.b_pre = nn.Parameter(pre_bias(n, site.index))
        self.b_post = nn.Parameter(torch.zeros(n))
        self.b_res = nn.Parameter(torch.eye(n))

    def project(self, logits: Tensor) -> Tensor:
        """H_res from its logits H~_res [stream, stream, token]: Sinkhorn-Knopp (doubly stochastic)."""
        return _Sinkhorn.apply(logits, self.iters)

    def coefficients(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """H_pre = sigmoid(H~_pre), H_res = ``project``(H~_res) and H_post = 2 sigmoid(H~_post), from
        x' = RMSNorm(vec(H)), each H~ = a (x' phi) + b; the constraints in at least float32.
        """
        n, lead = self.n, h.shape[:-2]
        flat = h.flatten(-2)  # [batch, pos, stream * d_model]
        # RMSNorm(x) phi = (x phi) / rms(x): scale the small product, not the streams
        m = thin_matmul(self.phi, flat) * inv_rms(flat).flatten()  # [2n + n*n, token]
        dtype = torch.promote_types(m.dtype, torch.float32)  # constraints in at least float32
        m, alpha = m.to(dtype), self.alpha.to(dtype)
        pre = torch.sigmoid(alpha[0] * m[:n] + self.b_pre.unsqueeze(-1))  # [stream, token]
        post = 2 * torch.sigmoid(alpha[1] * m[n : 2 * n] + self.b_post.unsqueeze(-1))  # [stream, token]
        res = self.project(alpha[2] * m[2 * n :].unflatten(0, (n, n)) + self.b_res.unsqueeze(-1))
        mix = torch.cat([pre.unsqueeze(1), res], dim=1).to(h.dtype)  # [stream, 1 + stream, token]
        mix = rearrange(mix, "stream column token -> token stream column").unflatten(0, lead)
        return mix, post.to(h.dtype).t().unflatten(0, lead)


@register
class MHC(StreamScheme):
    """Manifold-Constrained Hyper-Connections (arXiv 2512.24880): doubly stochastic stream mixing."""

    name = "mhc"
    paper = "arXiv 2512.24880: mHC: Manifold-Constrained Hyper-Connections"
    Options = MHCOptions
    connection = ManifoldHyperConnection
    min_streams = 2

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Refuse fewer than 2 streams (the init breaks stream symmetry) or fewer than 1 Sinkhorn round."""
        super().validate(cfg)
        if cfg.options.sinkhorn_iters < 1:
            raise ConfigError(f"mhc sinkhorn_iters must be at least 1, got {cfg.options.sinkhorn_iters}")
