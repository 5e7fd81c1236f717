"""MUDDFormer (Xiao et al., arXiv 2502.12170, ICML 2025): multiway dynamic dense connections.

The unit of depth is a block. X_0 is the token embedding and X_{i+1} the output of block i, a
hidden state (the whole stream, not an increment). After block i a depth-wise aggregate DA_i
builds, for each way c of the next block (Q, K, V and the residual R), one mix of every state so
far, with weights generated per token from the latest state (Sec. 2, Eq. 4-6):

    A_i(X_i)  = GELU(RMSNorm(X_i) W1) W2 + a_i          [way, state], per token
    Xbar_i^c  = sum_{j=0..i} A_i[c, j] X_j              c in {q, k, v, r}

Block i+1 attends with query, key and value read from Xbar^Q, Xbar^K, Xbar^V (each through the
attention's pre-norm) and adds its output to Xbar^R; the MLP reads that sum:

    X_A       = Xbar^R + attn(Norm(Xbar^Q), Norm(Xbar^K), Norm(Xbar^V))
    X_{i+1}   = X_A + MLP(Norm(X_A))

Block 0 reads X_0 in all four ways (there is nothing to aggregate yet). The last aggregate, over
X_0..X_D, has a single way (C = 1): its output goes to the final norm and the head.

Parameters: ``blocks.{b}.attn_mix.a`` [way, state] (a_{b-1}, the paper's ``dense_bs``),
``.w1`` [d_model, hidden] and ``.w2`` [hidden, way * state] (its ``dynamic_dense`` W1, W2), for
blocks b >= 1; ``readout_mix.a`` [1, D + 1], ``.w1``, ``.w2`` for the last aggregate. Block 0's
attention mixer has none. W2's columns are way-major (way c, state j at c * states + j).

Choices where the paper is silent, or where we could not check it:
* Initialisation: a_i one-hot on the latest state X_i for every way, W2 = 0, so that every way
  reads X_i and the model is exactly the standard pre-norm residual at initialisation (tested).
  W1 ~ N(0, 1/d_model), so that the hidden layer of the weight MLP starts at unit scale; it is
  drawn without advancing the global generator, so a muddformer and a standard model built after
  the same seed share every other initial weight.
* Hidden width of the weight MLP: C * (states) (times 4 for the last aggregate), rounded up past
  the next multiple of 64, as the public PyTorch release sizes it; option ``hidden`` overrides it.
* The RMSNorm inside the weight MLP has no gain (as the public release); eps as every norm here.
* Q, K and V share the attention's one pre-norm (as DCA here; the public MUDDFormer-2.8B gives
  each its own RMSNorm from block 1 on). At initialisation, where the gains are 1, the two agree.
* Weight decay on W1 and W2 (the dynamic part); none on a_i, whose one-hot initialisation is what
  makes the model a standard residual.
* No pre/post-norm variants, no QK-norm, GELU MLPs: the sublayers are this package's.

Delta basis: every state is an exact per-token combination of the sources (the embedding and
the sublayer outputs): X_0 = embed, X_{i+1} = Xbar_i^R + attn_i + mlp_i, so with C_j the
coefficients of X_j, the coefficients of Xbar^c are sum_j A[c, j] C_j, computed per token when a
``hook_weights`` listens. The attention consumer is a ``ViewsMixer`` with four views
``{b}.attn.q``, ``.k``, ``.v`` and ``.r``: the r row is the residual way Xbar^R, which the attention
does not read (the trace attr ``consumer_input`` says so); it makes the read depth of the
residual comparable with q, k and v (``analysis.views``). The MLP consumer's weights are the
r weights plus 1 on its block's attention output; the read-out's are the last aggregate's.

Legend: batch, pos, d_model, way (q, k, v, r), state (X_0..X_b, block outputs),
source (embedding + sublayer outputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from depthscope.errors import ConfigError
from depthscope.schemes import names
from depthscope.schemes._common import inv_rms
from depthscope.schemes.base import Mixer, ModelConfig, Port, Scheme, Site, ViewsMixer, register

WAYS = ("q", "k", "v", "r")  # the ways of a block's input: query, key, value, residual


@dataclass(frozen=True)
class MUDDOptions:
    """Width of every weight MLP (0: the public release's rule, see ``hidden_size``)."""

    hidden: int = 0


def hidden_size(cfg: ModelConfig, ways: int, states: int, last: bool) -> int:
    """The weight MLP's hidden width: ways * states (x 4 for the last aggregate), rounded up past
    the next multiple of 64; ``cfg.options.hidden`` when set.
    """
    if cfg.options.hidden:
        return cfg.options.hidden
    width = ways * states * (4 if last else 1)
    return (width // 64 + 1) * 64


@dataclass
class MUDDState:
    """The block outputs so far, the current block's residual, and (when tracking) coefficients.

    ``coef[j]`` [batch, pos, 2j + 1] are the delta-basis coefficients of X_j over the sources
    written before it; ``h_coef`` those of ``h``. Built only when a weights hook listens.
    """

    xs: list[Tensor]  # X_0..X_b, each [batch, pos, d_model]
    coef: list[Tensor] | None
    h: Tensor | None = None  # Xbar^R, then Xbar^R + attn_out (the MLP's input)
    h_coef: Tensor | None = None  # [batch, pos, source]


class DenseAggregate:
    """One depth-wise aggregate DA over the states X_0..X_b (a mixin of an nn.Module).

    With a single state (block 0) there is nothing to aggregate: every way is X_0, no parameters.
    """

    decayed = ("w1", "w2")  # the dynamic part; the static a keeps its one-hot initialisation

    def init_aggregate(self, cfg: ModelConfig, ways: int, states: int, last: bool) -> None:
        """A one-hot on the latest state, W1 ~ N(0, 1/d) (drawn on a forked generator), W2 = 0."""
        self.ways, self.states = ways, states
        if states == 1:
            return
        a = torch.zeros(ways, states)
        a[:, -1] = 1.0  # every way reads the latest state: the standard residual
        self.a = nn.Parameter(a)
        hidden = hidden_size(cfg, ways, states, last)
        with torch.random.fork_rng(devices=[]):  # leave the global generator where it was
            self.w1 = nn.Parameter(torch.randn(cfg.d_model, hidden) / math.sqrt(cfg.d_model))
        self.w2 = nn.Parameter(torch.zeros(hidden, ways * states))

    def dense_weights(self, x: Tensor) -> Tensor:
        """A(x) = GELU(RMSNorm(x) W1) W2 + a: [batch, pos, way, state] from the latest state x."""
        z = (x @ self.w1) * inv_rms(x)  # RMSNorm(x) W1 without a gain, scaling the small product
        return (F.gelu(z) @ self.w2).unflatten(-1, (self.ways, self.states)) + self.a

    def aggregate(self, state: MUDDState) -> tuple[list[Tensor], Tensor | None]:
        """(Xbar^c for each way, [batch, pos, d_model] each; their delta-basis coefficients
        [batch, pos, way, source], or None when not tracking).
        """
        if self.states == 1:
            x = state.xs[0]
            coef = None if state.coef is None else state.coef[0].unsqueeze(-2).expand(-1, -1, self.ways, -1)
            return [x] * self.ways, coef
        a = self.dense_weights(state.xs[-1])
        mixed = a @ torch.stack(state.xs, dim=-2)  # [batch, pos, way, d_model]
        coef = None
        if state.coef is not None:
            n = state.coef[-1].shape[-1]  # sources written so far; earlier states are zero-padded
            cs = torch.stack([F.pad(c, (0, n - c.shape[-1])) for c in state.coef], dim=-2)
            coef = a @ cs  # [batch, pos, way, source]
        return list(mixed.unbind(-2)), coef


def with_one(coef: Tensor | None) -> Tensor | None:
    """Coefficients extended by one source of weight 1 (the output just written)."""
    return None if coef is None else torch.cat([coef, coef.new_ones(*coef.shape[:-1], 1)], dim=-1)


class MUDDAttentionMixer(DenseAggregate, ViewsMixer):
    """Block b's attention consumer: DA_{b-1} gives the query, key, value and residual ways."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        self.init_aggregate(cfg, len(WAYS), site.block + 1, last=False)
        self.q, self.k, self.v, self.r = (Port() for _ in WAYS)

    def read(self, state: MUDDState) -> tuple[tuple[Tensor, Tensor, Tensor], MUDDState]:
        """(Xbar^Q, Xbar^K, Xbar^V) for the attention; Xbar^R goes on in the state as the residual."""
        mixed, coef = self.aggregate(state)
        out = []
        for i, port in enumerate((self.q, self.k, self.v, self.r)):
            port.emit(lambda i=i: coef[..., i, :])
            out.append(port.hook_in(mixed[i]))
        h_coef = None if coef is None else coef[..., -1, :]
        return (out[0], out[1], out[2]), replace(state, h=out[3], h_coef=h_coef)

    def write(self, state: MUDDState, out: Tensor) -> MUDDState:
        """X_A = Xbar^R + attn_out, the MLP's input."""
        return replace(state, h=state.h + out, h_coef=with_one(state.h_coef))


class MUDDMLPMixer(Mixer):
    """Block b's MLP consumer: reads X_A = Xbar^R + attn_out; its output completes X_{b+1}."""

    def read(self, state: MUDDState) -> tuple[Tensor, MUDDState]:
        """X_A; its weights are the r way's plus 1 on this block's attention output."""
        self.emit(lambda: state.h_coef)
        return self.hook_in(state.h), state

    def write(self, state: MUDDState, out: Tensor) -> MUDDState:
        """X_{b+1} = X_A + mlp_out joins the states."""
        coef = None if state.coef is None else state.coef + [with_one(state.h_coef)]
        return MUDDState(state.xs + [state.h + out], coef)


class MUDDReadout(DenseAggregate, Mixer):
    """The last aggregate, one way over X_0..X_D: the input of the final norm."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        self.init_aggregate(cfg, 1, cfg.n_layers + 1, last=True)

    def read(self, state: MUDDState) -> tuple[Tensor, MUDDState]:
        """Xbar_D = sum_j A_D[j] X_j (per token)."""
        mixed, coef = self.aggregate(state)
        self.emit(lambda: coef[..., 0, :])
        return self.hook_in(mixed[0]), state


@register
class MUDDFormer(Scheme):
    """MUDDFormer: multiway dynamic dense connections (arXiv 2502.12170, Sec. 2, Eq. 4-6)."""

    name = "muddformer"
    paper = (
        "arXiv 2502.12170: MUDDFormer: Breaking Residual Bottlenecks in Transformers via "
        "Multiway Dynamic Dense Connections"
    )
    Options = MUDDOptions

    @classmethod
    def views(cls, options: MUDDOptions, kind: str) -> tuple[str, ...]:
        """The attention consumer has four rows, q, k, v and the residual way r."""
        return WAYS if kind == names.ATTN else ()

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Refuse a hidden width that is not a non-negative integer."""
        h = cfg.options.hidden
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise ConfigError(f"muddformer hidden must be a non-negative integer (0: the default), got {h!r}")

    @classmethod
    def trace_attrs(cls, cfg: ModelConfig) -> dict[str, str]:
        """``consumer_input``: the r rows are the residual way, which the attention does not read."""
        return {
            "consumer_input": "{b}.attn.q/k/v rows are the attention's three inputs; {b}.attn.r is the "
            "residual way Xbar^R (not read by the attention): the MLP reads it plus the attention output"
        }

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> MUDDState:
        """The states start as [X_0], the embedding; with ``track``, its coefficients [1]."""
        return MUDDState([x0], [x0.new_ones(*x0.shape[:-1], 1)] if track else None)

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer | ViewsMixer:
        """The four-way ``MUDDAttentionMixer`` for each attention, ``MUDDMLPMixer`` for each MLP, and
        ``MUDDReadout`` for the read-out.
        """
        if site.kind == names.ATTN:
            return MUDDAttentionMixer(cfg, site)
        if site.kind == names.MLP:
            return MUDDMLPMixer(cfg, site)
        return MUDDReadout(cfg, site)

    @classmethod
    def static_native(cls, model: nn.Module) -> dict:
        """The static weights a_i as ``mudd_static`` (aggregate = 1..D, way, state = X_0..X_D), NaN
        where an aggregate has no such weight; the last aggregate's single way is the r way.
        """
        d = model.cfg.n_layers
        out = torch.full((d, len(WAYS), d + 1), math.nan, dtype=torch.float64)
        mixers = [model.blocks[b].attn_mix for b in range(1, d)] + [model.readout_mix]
        for row, mixer in enumerate(mixers):
            a = mixer.a.detach().double().cpu()
            if a.shape[0] == 1:
                out[row, -1, : a.shape[1]] = a[0]
            else:
                out[row, :, : a.shape[1]] = a
        coords = {
            "aggregate": list(range(1, d + 1)),
            "way": list(WAYS),
            "state": [f"X_{j}" for j in range(d + 1)],
        }
        return {"mudd_static": (("aggregate", "way", "state"), out.numpy(), coords)}
