"""Hyper-Connections (Zhu et al., arXiv 2409.19606), static (SHC) and dynamic (DHC).

Legend: batch, pos, d_model, stream (one of the n parallel residual streams), source (embedding,
then sublayer outputs in execution order).

The depth state is n streams H [batch, pos, stream, d_model], started as n copies of the
embedding. Every attention and every MLP has its own hyper-connection HC = [[0, B], [A_m, A_r]]
(the paper's static hyper-connections); with f the sublayer, in matrix form
H' = A_r^T H + B^T f(A_m^T H):

    h_in = A_m^T H                              width connection: weights over streams
    h'_t = sum_s A_r[s, t] h_s + B_t f(h_in)    depth connection (A_r is source x target stream)

Static HC learns A_m [stream], A_r [stream, stream] and B [stream] per sublayer. Dynamic HC
adds input-dependent terms from H_bar = RMSNorm(H) (normalised per stream):

    A_m(H) = s_a tanh(H_bar W_m) + A_m,  A_r(H) = s_a tanh(H_bar W_r) + A_r,
    B(H)   = s_b tanh(H_bar W_b)^T + B

with W_m [d_model], W_r [d_model, stream], W_b [d_model] (stored as the rows of one ``w_dyn``
[2 + stream, d_model]) initialised to 0 and the scalars s_a = s_b = 0.01 (the paper's small
learnable factor). The paper's initialisation equals a pre-norm residual: B = 1,
A_m = e_{k mod n} (k counts attention and MLP layers together, in execution order), A_r = I;
every stream then holds the standard residual stream. Read-out: the streams are summed, then the
model's final norm (n times the standard stream at init, which the final RMSNorm undoes up to
its eps).

Delta basis (research/implementations.md Sec. 7): with ``track`` the state carries per-token
coefficients C [batch, pos, stream, source] (stream s holds sum_j C[s, j] v_j), starting at ones
on the embedding. Consumer l weighs sources with sum_s A_m[s] C[s, :]; after its write,
C <- A_r^T C and the column B is appended for the new source. The read-out weighs sum_s C[s, :].

Native hooks on every attention/MLP mixer (``blocks.{i}.{kind}_mix.``): ``hook_h_pre``
[batch, pos, stream] (= A_m), ``hook_h_res`` [batch, pos, stream, stream] (= A_r, source stream x
target stream), ``hook_h_post`` [batch, pos, stream] (= B). Static HC expands its matrices over
batch and pos only when a hook listens; values returned by a hook are the ones used.

Choices where the paper is silent or loose:
* the per-stream norm of DHC is an RMSNorm (eps 1e-6) with a learned gain (init 1, shared by the
  streams; the paper's |theta_norm|); the gain is folded into W and 1/rms scales the projected
  values, so the streams themselves are never rescaled;
* W_m and W_r share s_a, W_b has s_b (as the paper's Algorithm); all are per sublayer;
* no sqrt(n) rescaling of the sublayers' output projections (the paper's wording is ambiguous,
  and the model's global init owns sublayer weights); the final norm removes the n-fold scale;
* the read-out is a plain sum of the streams, with no weights of its own;
* static or dynamic is the option ``mode`` ("dynamic" by default, as the paper's main setting).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from depthscope.errors import ConfigError
from depthscope.schemes import names
from depthscope.schemes._common import inv_rms, listening
from depthscope.schemes.base import Mixer, ModelConfig, NativeHook, Scheme, Site, register, sublayer_sites


@dataclass(frozen=True)
class HCOptions:
    """Expansion rate n (the number of streams) and static (SHC) or dynamic (DHC) hyper-connections."""

    streams: int = 4  # expansion rate n
    mode: Literal["dynamic", "static"] = "dynamic"


@dataclass
class Pending:
    """What a sublayer's ``read`` leaves for its ``write``: the carried streams and the matrices."""

    carried: Tensor  # sum_s res[s, t] h_s: [batch, pos, stream, d_model]
    pre: Tensor  # [batch, pos, stream] or [stream]
    res: Tensor  # [batch, pos, stream, stream] or [stream, stream]
    post: Tensor  # [batch, pos, stream] or [stream]


@dataclass
class Streams:
    """The n residual streams, the delta-basis coefficients if tracked, and the pending write.

    The stream matrices depend on H before the write, so ``read`` mixes the streams for the
    sublayer's input and for the carried residual in one product and returns a state whose
    ``pending`` holds the carried part and the matrices for ``write``.
    """

    h: Tensor  # [batch, pos, stream, d_model]
    coef: Tensor | None = None  # [batch, pos, stream, source]
    pending: Pending | None = None


def expand_streams(x0: Tensor, n: int, track: bool) -> Streams:
    """N copies of the embedding; with ``track``, coefficients of ones on the embedding column."""
    # a real copy: batched products over a stride-0 stream dim fall back to loops over tokens
    h = x0.unsqueeze(-2).expand(*x0.shape[:-1], n, x0.shape[-1]).contiguous()
    coef = x0.new_ones(*x0.shape[:-1], n, 1) if track else None
    return Streams(h, coef)


def thin_matmul(w: Tensor, x: Tensor) -> Tensor:
    """W x^T for a thin w [k, feature] and x [..., feature]: [k, token] (tokens = x's leading dims).

    With k a handful of rows, this orientation (and its backward) runs several times faster on
    CPU than x @ w^T.
    """
    return w @ x.reshape(-1, x.shape[-1]).t()


def tracked(state: Streams) -> Tensor:
    """The delta-basis coefficients C of ``state``; RuntimeError if the forward started without ``track``."""
    if state.coef is None:
        raise RuntimeError("delta-basis weights need the forward to start with track=True")
    return state.coef


def update_coef(coef: Tensor | None, res: Tensor, post: Tensor) -> Tensor | None:
    """Delta-basis bookkeeping of one write: C <- res^T C, then the column ``post`` for the new source."""
    if coef is None:
        return None
    coef = res.transpose(-1, -2).to(coef.dtype) @ coef
    return torch.cat([coef, post.expand(coef.shape[:-1]).unsqueeze(-1).to(coef.dtype)], dim=-1)


class StreamMixer(Mixer):
    """Reads sum_s pre_s h_s, writes h'_t = sum_s res[s, t] h_s + post_t f; subclasses give the matrices."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        self.n = cfg.options.streams
        self.hook_h_pre = HookPoint()  # [batch, pos, stream]
        self.hook_h_res = HookPoint()  # [batch, pos, stream (source), stream (target)]
        self.hook_h_post = HookPoint()  # [batch, pos, stream]

    @abc.abstractmethod
    def coefficients(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """(mix, post) for the streams ``h``: mix = [pre | res] [.., stream, 1 + stream], post [.., stream].

        Static matrices may omit the batch and pos dims (they broadcast).
        """

    def _mix(self, state: Streams) -> tuple[Tensor, Pending]:
        h = state.h
        mix, post = self.coefficients(h)
        lead, n = h.shape[:-2], self.n
        # static matrices broadcast; expand them only when someone looks (a hook may also patch)
        if listening(self.hook_h_pre) or listening(self.hook_h_res):
            pre = self.hook_h_pre(mix[..., 0].expand(*lead, n))
            res = self.hook_h_res(mix[..., 1:].expand(*lead, n, n))
            mix = torch.cat([pre.unsqueeze(-1), res], dim=-1)
        if listening(self.hook_h_post):
            post = self.hook_h_post(post.expand(*lead, n))
        # one product gives the sublayer input (row 0) and the carried streams (rows 1..n)
        # a static mix is expanded over tokens: one batched product is much faster than
        # torch.matmul's broadcasting of a 2-d matrix (and split, not two slices: its backward is
        # one concatenation, not two zero-filled copies)
        product = mix.expand(*lead, n, n + 1).transpose(-1, -2).contiguous() @ h
        x, carried = product.split([1, n], dim=-2)  # [batch, pos, 1 | stream, d_model]
        return x.squeeze(-2), Pending(carried, mix[..., 0], mix[..., 1:], post)

    def read(self, state: Streams) -> tuple[Tensor, Streams]:
        """The width connection h_in = sum_s pre_s h_s (HC: pre = A_m), weights sum_s pre_s C[s, :].

        The carried streams sum_s res[s, t] h_s and the matrices travel to ``write`` as ``pending``.
        """
        x, p = self._mix(state)
        self.emit(lambda: (p.pre.unsqueeze(-2).to(tracked(state).dtype) @ tracked(state)).squeeze(-2))
        return self.hook_in(x), replace(state, pending=p)

    def write(self, state: Streams, out: Tensor) -> Streams:
        """The depth connection h'_t = sum_s res[s, t] h_s + post_t out (HC: res = A_r, post = B).

        Tracked, the coefficients become res^T C with the column ``post`` appended for the new source.
        """
        p = state.pending
        lead, n, d = out.shape[:-1], self.n, out.shape[-1]
        # carried + post (x) out as one batched outer product: much faster to differentiate than
        # addcmul (contiguous factors, or the batched product falls back to a loop over tokens)
        post = p.post.expand(*lead, n).reshape(-1, n, 1).contiguous()
        h = torch.baddbmm(p.carried.reshape(-1, n, d), post, out.reshape(-1, 1, d).contiguous())
        h = h.unflatten(0, lead)
        return Streams(h, update_coef(state.coef, p.res, p.post))


class StreamReadout(Mixer):
    """The read-out: the streams summed (weights: the coefficients summed over streams)."""

    def read(self, state: Streams) -> tuple[Tensor, Streams]:
        """The streams summed, sum_s h_s (weights: C summed over the streams); the read-out never writes."""
        self.emit(lambda: tracked(state).sum(-2))
        return self.hook_in(state.h.sum(-2)), state


class HyperConnection(StreamMixer):
    """One static or dynamic hyper-connection (arXiv 2409.19606)."""

    decayed = ("w_dyn",)  # the paper: "static parts get no weight decay; dynamic parts do"

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        n = self.n
        self.a_m = nn.Parameter(torch.zeros(n))  # A_m, init e_{k mod n}
        with torch.no_grad():
            self.a_m[site.index % n] = 1.0
        self.a_r = nn.Parameter(torch.eye(n))  # A_r [source stream, target stream], init I
        self.b = nn.Parameter(torch.ones(n))  # B, init 1
        self.dynamic = cfg.options.mode == "dynamic"
        if self.dynamic:
            self.norm_gain = nn.Parameter(torch.ones(cfg.d_model))  # gain of the per-stream RMSNorm
            # rows: W_m, then W_r (one per target stream), then W_b
            self.w_dyn = nn.Parameter(torch.zeros(n + 2, cfg.d_model))
            self.s_alpha = nn.Parameter(torch.tensor(0.01))
            self.s_beta = nn.Parameter(torch.tensor(0.01))

    def coefficients(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """[A_m | A_r] and B; dynamic HC adds s_a tanh(H_bar [W_m | W_r]) and s_b tanh(H_bar W_b)."""
        static = torch.cat([self.a_m.unsqueeze(-1), self.a_r], dim=-1)  # [stream, 1 + stream]
        if not self.dynamic:
            return static, self.b
        n = self.n
        # RMSNorm(h) W = (h (g W)) / rms(h): scale the small product, not the streams
        proj = thin_matmul(self.w_dyn * self.norm_gain, h).t().unflatten(0, h.shape[:-1])
        t = torch.tanh(proj * inv_rms(h))  # [batch, pos, stream, 2 + stream]
        return self.s_alpha * t[..., : n + 1] + static, self.s_beta * t[..., n + 1] + self.b


STREAM_NATIVE = (
    ("hc_pre", "hook_h_pre", ("stream",)),
    ("hc_res", "hook_h_res", ("stream_from", "stream_to")),
    ("hc_post", "hook_h_post", ("stream",)),
)


def stream_native_hooks(cfg: ModelConfig, kept=STREAM_NATIVE) -> list[NativeHook]:
    """Token means of the connection matrices kept in a trace, per sublayer: ``kept`` rows of (trace
    name, the mixer's hook, dims); HC's hc_pre, hc_res, hc_post by default.
    """
    return [
        NativeHook(name, names.mixer_hook(site.block, site.kind, hook), site.label, dims)
        for site in sublayer_sites(cfg)
        for name, hook, dims in kept
    ]


class StreamScheme(Scheme):
    """What hc and mhc share: n streams from the embedding, one connection module per sublayer
    (``connection``), the summed read-out, and the stream matrices kept in traces.
    """

    connection: type[Mixer]
    # mHC's and sHC's init (``pre_bias``) breaks the symmetry between streams: they need 2
    min_streams: ClassVar[int] = 1

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Refuse fewer streams than ``min_streams``."""
        if cfg.options.streams < cls.min_streams:
            why = " (its init breaks stream symmetry)" if cls.min_streams > 1 else ""
            raise ConfigError(
                f"{cls.name} needs at least {cls.min_streams} streams{why}, got {cfg.options.streams}"
            )

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> Streams:
        """H^0 = n copies of the embedding; with ``track``, coefficients of ones on the embedding."""
        return expand_streams(x0, cfg.options.streams, track)

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer:
        """The scheme's ``connection`` module for each attention and MLP; the read-out sums the streams."""
        return StreamReadout(cfg, site) if site.kind == names.READOUT else cls.connection(cfg, site)

    @classmethod
    def native_hooks(cls, cfg: ModelConfig) -> list[NativeHook]:
        """Token means of the stream matrices of every sublayer: ``hc_pre``, ``hc_res``, ``hc_post``."""
        return stream_native_hooks(cfg)


@register
class HC(StreamScheme):
    """Hyper-Connections (arXiv 2409.19606): n streams, static or dynamic HC matrices per sublayer."""

    name = "hc"
    paper = "arXiv 2409.19606: Hyper-Connections"
    Options = HCOptions
    variants = {"hc": {}, "hc-static": {"mode": "static"}}
    static = {"mode": ("static",)}  # A_m, A_r, B constants; dynamic HC's depend on the streams

    connection = HyperConnection
