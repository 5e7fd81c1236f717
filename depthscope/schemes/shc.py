"""Spectral-Sphere-Constrained Hyper-Connections, sHC (Liu, Zhang and Li, arXiv 2603.20896).

Legend: batch, pos, d_model, stream (one of the n parallel residual streams), source (embedding,
then sublayer outputs in execution order).

mHC (``mhc.py``) with the residual matrix moved from the Birkhoff polytope (doubly stochastic,
non-negative, by Sinkhorn-Knopp) onto the unit spectral-norm sphere, where negative entries, and so
subtractive mixing of streams, are allowed. Per attention and per MLP, from the flattened streams
x' = RMSNorm(vec(H)) [batch, pos, n*d_model]:

    H~_pre  = a_pre  (x' phi_pre)  + b_pre         H_pre  = sigmoid(H~_pre)             [stream]
    H~_post = a_post (x' phi_post) + b_post        H_post = 2 sigmoid(H~_post)          [stream]
    H~_res  = a_res mat(x' phi_res) + b_res        H_res  = H~_res / sigma_max(H~_res)  [stream, stream]

with sigma_max the largest singular value (the spectral norm), per token, so every H_res has
spectral norm exactly 1 (to rounding). The update, in the source-row convention of ``hc.py``
(H_res[s, t]: from stream s to t; the paper's H_res is its transpose, whose spectral norm is the
same):

    h_in = sum_s H_pre[s] h_s,    h'_t = sum_s H_res[s, t] h_s + H_post[t] f(h_in)

A product of spectral-norm-1 matrices has spectral norm at most 1, so the composite of H_res over
depth cannot amplify the streams; unlike mHC it conserves no stream mean (rows and columns need
not sum to 1). Read-out, delta-basis unrolling and the native hooks ``hook_h_pre``,
``hook_h_res`` (the normalised matrix, source x target) and ``hook_h_post`` are those of ``hc.py``.

From the paper (only its title, abstract and the opening of its introduction could be read): the
residual matrix is constrained to a spectral-norm sphere instead of the Birkhoff polytope, negative
entries are allowed, and there are no Sinkhorn iterations and no permutation-based parametrisation;
the method is a modification of mHC. Its equations, the sphere's radius, how it reaches the sphere
and its initialisation were not found, so everything below is our choice:

* the parametrisation is exactly mHC's (``mhc.py``): the same x', phi = 0, a_* = 0.01, b_post = 0,
  the same stream-symmetry-breaking b_pre (``mhc.pre_bias``), the same sigmoids for H_pre and
  H_post, the same plain-sum read-out, at least 2 streams; only the projection of H~_res differs;
* the sphere has radius 1 (the spectral norm of every doubly stochastic matrix, so the constraint
  is the mHC polytope's own norm, without its sign and sum constraints);
* H~_res reaches it by the radial map H~ / ||H~||_2 (not the Frobenius-nearest point of the
  sphere, which would clip singular values instead); sigma_max is computed exactly per token by
  ``torch.linalg.matrix_norm(ord=2)`` (an SVD, no power iteration), in at least float32, and
  clamped at the smallest positive float (no eps added): an all-zero H~_res gives H_res = 0, not
  NaN. The gradient of sigma_max is torch's (u_1 v_1^T; tied largest singular values share it);
* b_res = identity, so H_res = I at initialisation: with identical streams, H_pre summing to 1 and
  H_post = 1 the model is exactly the standard residual (up to the final norm's eps), as mHC is;
  mHC's initial H_res is the diagonal-dominant Sinkhorn(I), ours the identity itself;
* the normalisation keeps the sign: H~_res and -H~_res are different points of the sphere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from depthscope.schemes.base import register
from depthscope.schemes.hc import StreamScheme
from depthscope.schemes.mhc import ManifoldHyperConnection


@dataclass(frozen=True)
class SHCOptions:
    """Expansion rate n (the number of streams)."""

    streams: int = 4  # expansion rate n


def spectral_normalise(logits: Tensor, dim: tuple[int, int] = (-2, -1)) -> Tensor:
    """``logits`` divided by their spectral norm over ``dim`` (exact, by SVD): spectral norm 1.

    The norm is clamped at the smallest positive float of the dtype, so an all-zero matrix stays 0.
    """
    sigma = torch.linalg.matrix_norm(logits, ord=2, dim=dim, keepdim=True)
    return logits / sigma.clamp_min(torch.finfo(sigma.dtype).tiny)


class SpectralHyperConnection(ManifoldHyperConnection):
    """One sHC: mHC's connection with a residual matrix of spectral norm 1 (arXiv 2603.20896)."""

    def project(self, logits: Tensor) -> Tensor:
        """H_res = H~_res / sigma_max(H~_res), per token (``logits`` [stream, stream, token])."""
        return spectral_normalise(logits, dim=(0, 1))


@register
class SHC(StreamScheme):
    """Spectral-Sphere-Constrained Hyper-Connections (arXiv 2603.20896): stream mixing of spectral norm 1."""

    name = "shc"
    paper = "arXiv 2603.20896: Beyond the Birkhoff Polytope: Spectral-Sphere-Constrained Hyper-Connections"
    Options = SHCOptions
    connection = SpectralHyperConnection
    min_streams = 2  # the init, mHC's, breaks stream symmetry
