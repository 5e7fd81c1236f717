"""DenseFormer (Pagliardini, Mohtashami, Fleuret, Jaggi; arXiv 2402.02622), k x p Depth-Weighted Average.

Blocks are ordinary pre-norm blocks (attention then MLP, each with its own internal residual).
X_0 = token embedding, X_i = output of block i (a hidden state: it contains the stream). After
block i (1-based) a Depth-Weighted Average (Sec. 3)

    Y_i = DWA_i(X_0, ..., X_i) = sum_{j <= i, j = i (mod k)} alpha_{i,j} X_j

feeds block i + 1; Y_D (D = number of blocks) feeds the final norm. Dilation k keeps only the
X_j with j = i (mod k), floor(i/k) + 1 weights; period p puts a DWA only after the blocks with
p | i, elsewhere Y_i = X_i (Sec. 3.2). The weights are scalars, static and unconstrained,
initialised alpha_{i,i} = 1 and the rest 0, so the model starts as exactly a standard
transformer.

Where the weights live: DWA_i belongs to the consumer that reads Y_i, i.e. the parameter
``blocks.{i}.attn_mix.alpha`` (shape (floor(i/k) + 1,), ordered by increasing j) for i < D and
``readout_mix.alpha`` for i = D. Mixers without a DWA have no parameters.

Delta basis: every X_j is a sum of sources (embedding + sublayer outputs) with static
coefficients, so DWA weights unroll exactly into static per-source coefficients; the mixers
emit them expanded over batch and pos. The unrolling needs the coefficients of every earlier
X_j, kept on the state only when ``track`` is set. ``dwa_matrix`` returns the native weights of a
model (rows = DWA depth 1..D, cols = X_0..X_D, NaN where no weight exists: outside the dilation
pattern, and on whole rows without a DWA); ``unroll_dwa`` turns that matrix into the delta basis.
No native per-token hooks: the weights are static (read them with ``dwa_matrix``).

Legend: batch, pos, d_model, state (X_0..X_D, block outputs), source (embedding + sublayer outputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from depthscope.errors import ConfigError
from depthscope.schemes import names
from depthscope.schemes.base import Mixer, ModelConfig, Scheme, Site, register


@dataclass(frozen=True)
class DenseFormerOptions:
    """Dilation k and period p of a k x p DenseFormer (Sec. 3.2); 1 x 1 is the full DenseFormer."""

    dilation: int = 1  # k: DWA_i averages the X_j with j = i (mod k)
    period: int = 1  # p: a DWA only after blocks i (1-based) with p | i


def dwa_states(depth: int, dilation: int) -> list[int]:
    """Indices j of the block outputs X_j averaged by DWA_depth (1-based depth), increasing."""
    return list(range(depth % dilation, depth + 1, dilation))


def has_dwa(depth: int, period: int) -> bool:
    """Whether a DWA follows block ``depth`` (1-based); block 0 (the embedding) never has one."""
    return depth >= 1 and depth % period == 0


@dataclass
class DenseState:
    """Block outputs so far, the stream inside the current block, and (when tracking) coefficients.

    ``coef[j]`` / ``h_coef`` are the delta-basis coefficients (over the sources written so far) of
    X_j and of ``h``; they are static, so one vector each, built only when tracking.
    """

    xs: list[Tensor]  # X_0..X_b, each [batch, pos, d_model]
    h: Tensor | None = None  # Y_b (the block's input stream), then Y_b + attn_out
    coef: list[Tensor] | None = None  # [source] for each X_j
    h_coef: Tensor | None = None  # [source]


class DWAMixer(Mixer):
    """One consumer of a DenseFormer: the attention and read-out consumers apply DWA_b (if any)."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        opts = cfg.options
        self.depth = site.block  # the DWA read here follows block `depth` (1-based), i.e. X_depth
        self.states: list[int] = []
        if site.kind != names.MLP and has_dwa(self.depth, opts.period):
            self.states = dwa_states(self.depth, opts.dilation)
            alpha = torch.zeros(len(self.states))
            alpha[-1] = 1.0  # alpha_{i,i} = 1, the rest 0: a standard transformer at init
            self.alpha = nn.Parameter(alpha)

    def read(self, state: DenseState) -> tuple[Tensor, DenseState]:
        """Attention and read-out of block b read Y_b = DWA_b(X_0..X_b) (Sec. 3; X_b where no DWA follows
        block b), which becomes the block's stream; the MLP reads that stream plus attn_out.
        """
        if self.site.kind == names.MLP:
            h, coef = state.h, state.h_coef
        else:  # Y_b: the stream this block adds into, handed to write with the state
            h, coef = self._average(state)
            state = replace(state, h=h, h_coef=coef)
        self.emit(lambda: coef.expand(*h.shape[:-1], -1))
        return self.hook_in(h), state

    def _average(self, state: DenseState) -> tuple[Tensor, Tensor | None]:
        """Y_b and its delta-basis coefficients (None when not tracking)."""
        if not self.states:
            return state.xs[-1], None if state.coef is None else state.coef[-1]
        xs = torch.stack([state.xs[j] for j in self.states])  # [state, batch, pos, d_model]
        y = torch.einsum("n,nbpd->bpd", self.alpha, xs)
        coef = None
        if state.coef is not None:
            n = len(state.coef[-1])  # sources written so far; earlier X_j are zero-padded
            pad = nn.functional.pad
            cs = torch.stack([pad(state.coef[j], (0, n - len(state.coef[j]))) for j in self.states])
            coef = self.alpha @ cs
        return y, coef

    def write(self, state: DenseState, out: Tensor) -> DenseState:
        """Add the output to the block's stream; after the MLP it is X_{b+1} = Y_b + attn_out + mlp_out."""
        h = state.h + out
        h_coef = None if state.coef is None else torch.cat([state.h_coef, state.h_coef.new_ones(1)])
        if self.site.kind == names.ATTN:
            return DenseState(state.xs, h, state.coef, h_coef)
        coef = None if state.coef is None else state.coef + [h_coef]
        return DenseState(state.xs + [h], None, coef, None)  # X_{b+1} = Y_b + attn_out + mlp_out


@register
class DenseFormer(Scheme):
    """DenseFormer: Depth-Weighted Average after blocks (arXiv 2402.02622, Sec. 3; k x p, Sec. 3.2)."""

    name = "denseformer"
    paper = (
        "arXiv 2402.02622: DenseFormer: Enhancing Information Flow in Transformers via "
        "Depth Weighted Averaging"
    )
    Options = DenseFormerOptions
    # 2 x 2 rather than the paper's recommended 4 x 5: at the zoo's 8 blocks a 4 x 5 model has a
    # single DWA (after block 5, over X_1 and X_5) and none at the read-out
    variants = {"denseformer": {}, "denseformer-2x2": {"dilation": 2, "period": 2}}
    static = True  # the DWA weights are learned scalars, the same for every token

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Refuse a dilation or period that is not a positive integer."""
        for key in ("dilation", "period"):
            value = getattr(cfg.options, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"denseformer {key} must be a positive integer, got {value!r}")

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> DenseState:
        """The block outputs start as [X_0], the embedding; with ``track``, X_0's coefficients [1]."""
        coef = [x0.new_ones(1)] if track else None
        return DenseState([x0], None, coef, None)

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer:
        """A ``DWAMixer`` for every consumer: DWA_b before block b's attention and at the read-out (b = D)
        where the period puts one, a pass-through elsewhere.
        """
        return DWAMixer(cfg, site)

    @classmethod
    def static_native(cls, model: nn.Module) -> dict:
        """The native DWA matrix as ``dwa_alpha`` (dwa = 1..D, state = X_0..X_D)."""
        d = model.cfg.n_layers
        coords = {"dwa": list(range(1, d + 1)), "state": [f"X_{j}" for j in range(d + 1)]}
        return {"dwa_alpha": (("dwa", "state"), dwa_matrix(model).numpy(), coords)}


def dwa_matrix(model: nn.Module) -> Tensor:
    """Native DWA weights of a DenseFormer model: [DWA depth 1..D, X_0..X_D], NaN where no weight.

    A row without a DWA (period) is all NaN: there Y_i = X_i.
    """
    cfg = model.cfg
    if cfg.scheme != DenseFormer.name:
        raise ConfigError(f"dwa_matrix needs a denseformer model, got {cfg.scheme!r}")
    d = cfg.n_layers
    mixers = [model.blocks[i].attn_mix for i in range(1, d)] + [model.readout_mix]
    out = torch.full((d, d + 1), math.nan, dtype=torch.float64)
    for row, mixer in enumerate(mixers):
        if mixer.states:
            out[row, mixer.states] = mixer.alpha.detach().double().cpu()
    return out


def unroll_dwa(alpha: Tensor) -> Tensor:
    """Delta-basis matrix of a DWA matrix: [consumer, source], NaN where a source is not yet written.

    Rows: 0.attn, 0.mlp, 1.attn, ..., readout (2D + 1); cols: embed, 0.attn, 0.mlp, ... (2D + 1).
    ``alpha`` is ``dwa_matrix``'s [D, D + 1]; NaN entries are no weight, an all-NaN row a pass-through.
    """
    d = alpha.shape[0]
    n = 2 * d + 1
    alpha = alpha.double()
    eye = torch.eye(n, dtype=torch.float64)
    xs = [eye[0]]  # delta-basis coefficients of X_j
    rows = []

    def dwa(depth: int) -> Tensor:
        row = alpha[depth - 1]
        if depth == 0 or torch.isnan(row).all():
            return xs[depth]
        return torch.nan_to_num(row[: depth + 1], nan=0.0) @ torch.stack(xs)

    for b in range(d):
        y = dwa(b)
        h = y + eye[2 * b + 1]
        rows += [y, h]
        xs.append(h + eye[2 * b + 2])
    rows.append(dwa(d))
    out = torch.stack(rows)
    return out.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), math.nan)
