"""Frac-Connections (Zhu et al., arXiv 2503.14125): hyper-connections over fractions of one stream.

Legend: batch, pos, d_model, frac (one of the m fractions of the hidden state, d_model / m
features each), source (embedding, then sublayer outputs in execution order).

Hyper-Connections (``hc.py``) widen the hidden state to n copies; Frac-Connections split it
instead: the state h [d_model] is read as m fractions H = reshape(h, (m, d_model / m)), and every
attention and every MLP has its own frac-connection, Gamma [frac, frac], A [frac, frac] and
beta [frac]. With f the sublayer (its input the m mixed fractions put back side by side, its output
cut into m fractions the same way):

    x_j   = sum_i Gamma[i, j] H_i                  fraction j of the sublayer's input
    H'_j  = sum_i A[i, j] H_i + beta_j f(x)_j      fraction j of the new state

(Gamma and A are source x target, as ``hc.py``'s A_m and A_r; the paper's connection matrix
FC = [[0, beta], [Gamma, A]] with H_k = B^T f(Gamma^T H) + A^T H.) Dynamic frac-connections
add input-dependent terms from the normalised fractions H_bar_i = RMSNorm(H_i), as dynamic HC
does from its streams:

    Gamma(H) = s_a tanh(H_bar W_g) + Gamma,  A(H) = s_a tanh(H_bar W_a) + A,
    beta(H)  = s_b tanh(H_bar w_b) + beta

with W_g, W_a [d_model / m, frac] and w_b [d_model / m] (the rows of one ``w_dyn``
[2 m + 1, d_model / m]) initialised to 0 and s_a = s_b = 0.01.

In the delta basis a source's term is no longer the source scaled: fraction j of a consumer's
input holds sum_g w[j, s, g] times fraction g of source s, so the weights are blocks
w [batch, pos, frac, source, frac] (fraction of the input, source, fraction of the source; the
engine's block weights, ``probes.terms.block_terms``). Tracked, the state carries coefficients
C [batch, pos, frac, source, frac] (fraction i holds sum_{s, g} C[i, s, g] v_s[g]), starting at
the identity on the embedding; a read weighs them with Gamma, a write makes C <- A^T C and appends
diag(beta) for the new source. The read-out reads the state itself (weights C).

Native hooks on every attention/MLP mixer: ``hook_h_pre`` [batch, pos, frac, frac] (Gamma),
``hook_h_res`` [batch, pos, frac, frac] (A, source x target fraction), ``hook_h_post``
[batch, pos, frac] (beta); their token means are the trace's ``frac_pre``, ``frac_res``,
``frac_post``.

Choices where the paper's text, as we could read it (its abstract, and a summary of its Sec. 3:
the reshape, the connection matrix, H_k = B^T T(Gamma^T H) + A^T H), is silent:

* beta is one weight per fraction, each output fraction written back into its own place (the
  connection matrix's first row); the ``hyper-connections`` package instead mixes output fractions
  into every place (a [frac, frac] beta), which the third-party reader reads as it is;
* initialisation equal to the pre-norm residual, as hyper-connections': Gamma = I, A = I,
  beta = 1, so every fraction is the standard residual stream's and the model at init is exactly
  the standard model (tested);
* m = 4 fractions by default (the zoo's HC widens to 4 streams: the same count, split instead of
  copied); d_model must be divisible by m;
* the dynamic terms as dynamic HC's (``hc.py``): RMSNorm per fraction (eps 1e-6) with one learned
  gain [d_model / m] shared by the fractions, W_g and W_a sharing s_a, w_b with s_b, the dynamic
  projections decayed and the static matrices not; static or dynamic is the option ``mode``
  ("dynamic" by default);
* no read-out weights: the read-out is the state itself, then the final norm.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from depthscope.errors import ConfigError
from depthscope.schemes import names
from depthscope.schemes._common import inv_rms, listening
from depthscope.schemes.base import Mixer, ModelConfig, NativeHook, Scheme, Site, register
from depthscope.schemes.hc import stream_native_hooks, thin_matmul

FRAC_NATIVE = (  # (trace name, the mixer's hook, dims) per sublayer
    ("frac_pre", "hook_h_pre", ("frac_from", "frac_to")),
    ("frac_res", "hook_h_res", ("frac_from", "frac_to")),
    ("frac_post", "hook_h_post", ("frac",)),
)


@dataclass(frozen=True)
class FracOptions:
    """The number of fractions m and static (SFC) or dynamic (DFC) frac-connections."""

    fracs: int = 4
    mode: Literal["dynamic", "static"] = "dynamic"


@dataclass
class FracState:
    """The hidden state, its delta-basis coefficients if tracked, and what ``read`` left for ``write``."""

    h: Tensor  # [batch, pos, d_model]
    coef: Tensor | None = None  # [batch, pos, frac, source, frac]
    carried: Tensor | None = None  # sum_i A[i, j] H_i: [batch, pos, frac, d_model / m]
    res: Tensor | None = None  # A [.., frac, frac]
    post: Tensor | None = None  # beta [.., frac]


def _coef(state: FracState) -> Tensor:
    if state.coef is None:
        raise RuntimeError("delta-basis weights need the forward to start with track=True")
    return state.coef


class FracConnection(Mixer):
    """One frac-connection: reads the fractions mixed by Gamma, writes A^T H + beta * f (arXiv 2503.14125)."""

    decayed = ("w_dyn",)

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        m = self.m = cfg.options.fracs
        self.gamma = nn.Parameter(torch.eye(m))  # Gamma [source frac, target frac], init I
        self.a = nn.Parameter(torch.eye(m))  # A [source frac, target frac], init I
        self.beta = nn.Parameter(torch.ones(m))  # beta, init 1
        self.dynamic = cfg.options.mode == "dynamic"
        if self.dynamic:
            k = cfg.d_model // m
            self.norm_gain = nn.Parameter(torch.ones(k))  # gain of the per-fraction RMSNorm
            self.w_dyn = nn.Parameter(torch.zeros(2 * m + 1, k))  # rows: W_g, W_a, then w_b
            self.s_alpha = nn.Parameter(torch.tensor(0.01))
            self.s_beta = nn.Parameter(torch.tensor(0.01))
        self.hook_h_pre = HookPoint()  # Gamma [batch, pos, frac, frac]
        self.hook_h_res = HookPoint()  # A [batch, pos, frac, frac]
        self.hook_h_post = HookPoint()  # beta [batch, pos, frac]

    def coefficients(self, u: Tensor) -> tuple[Tensor, Tensor]:
        """[Gamma | A] [.., frac, 2 frac] and beta [.., frac] for the fractions ``u`` [.., frac, d/m]
        (static ones without the batch and pos dims).
        """
        static = torch.cat([self.gamma, self.a], dim=-1)
        if not self.dynamic:
            return static, self.beta
        m = self.m
        proj = thin_matmul(self.w_dyn * self.norm_gain, u).t().unflatten(0, u.shape[:-1])
        t = torch.tanh(proj * inv_rms(u))  # [batch, pos, frac, 2 m + 1]
        return self.s_alpha * t[..., : 2 * m] + static, self.s_beta * t[..., 2 * m] + self.beta

    def read(self, state: FracState) -> tuple[Tensor, FracState]:
        """x_j = sum_i Gamma[i, j] H_i side by side; A and beta travel to ``write``."""
        h, m = state.h, self.m
        u = h.unflatten(-1, (m, h.shape[-1] // m))  # [batch, pos, frac, d/m]
        mix, post = self.coefficients(u)
        lead = h.shape[:-1]
        mix = mix.expand(*lead, m, 2 * m)
        if listening(self.hook_h_pre) or listening(self.hook_h_res):
            mix = torch.cat([self.hook_h_pre(mix[..., :m]), self.hook_h_res(mix[..., m:])], dim=-1)
        post = post.expand(*lead, m)
        if listening(self.hook_h_post):
            post = self.hook_h_post(post)
        product = mix.transpose(-1, -2).contiguous() @ u  # [batch, pos, 2 frac, d/m]
        x, carried = product.split([m, m], dim=-2)
        pre = mix[..., :m]
        self.emit(lambda: torch.einsum("...if,...isg->...fsg", pre.to(_coef(state).dtype), _coef(state)))
        return self.hook_in(x.flatten(-2)), replace(state, carried=carried, res=mix[..., m:], post=post)

    def write(self, state: FracState, out: Tensor) -> FracState:
        """H'_j = sum_i A[i, j] H_i + beta_j f_j; tracked, C <- A^T C with diag(beta) appended."""
        u = out.unflatten(-1, (self.m, out.shape[-1] // self.m))
        h = (state.carried + state.post.unsqueeze(-1) * u).flatten(-2)
        coef = state.coef
        if coef is not None:
            coef = torch.einsum("...it,...isg->...tsg", state.res.to(coef.dtype), coef)
            coef = torch.cat([coef, torch.diag_embed(state.post.to(coef.dtype)).unsqueeze(-2)], dim=-2)
        return FracState(h, coef)


class FracReadout(Mixer):
    """The read-out: the state itself (weights: the coefficients)."""

    def read(self, state: FracState) -> tuple[Tensor, FracState]:
        """The hidden state as it is; its weights are the coefficients C."""
        self.emit(lambda: _coef(state))
        return self.hook_in(state.h), state


@register
class Frac(Scheme):
    """Frac-Connections (arXiv 2503.14125): hyper-connections over m fractions of the hidden state."""

    name = "frac"
    paper = "arXiv 2503.14125: Frac-Connections: Fractional Extension of Hyper-Connections"
    Options = FracOptions
    static = {"mode": ("static",)}  # Gamma, A, beta constants; dynamic ones depend on the fractions

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Refuse fewer than 1 fraction or a d_model the fractions do not divide."""
        m = cfg.options.fracs
        if m < 1 or cfg.d_model % m:
            raise ConfigError(f"frac needs fracs >= 1 dividing d_model {cfg.d_model}, got {m}")

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> FracState:
        """The embedding; with ``track``, coefficients of the identity on it (fraction i holds its own)."""
        if not track:
            return FracState(x0)
        m = cfg.options.fracs
        eye = torch.eye(m, dtype=x0.dtype, device=x0.device)
        return FracState(x0, eye.unsqueeze(-2).expand(*x0.shape[:-1], m, 1, m).contiguous())

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer:
        """A frac-connection for each attention and MLP; the read-out reads the state."""
        return FracReadout(cfg, site) if site.kind == names.READOUT else FracConnection(cfg, site)

    @classmethod
    def native_hooks(cls, cfg: ModelConfig) -> list[NativeHook]:
        """Token means of Gamma, A and beta per sublayer: ``frac_pre``, ``frac_res``, ``frac_post``."""
        return stream_native_hooks(cfg, FRAC_NATIVE)
