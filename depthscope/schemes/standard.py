"""The standard pre-norm residual: x_{l+1} = x_l + f_l(Norm(x_l)).

Every consumer's input is the unit-weight sum of everything written before it, so in the delta
basis its weights are exactly 1 on every available source (He et al., arXiv 1512.03385;
pre-norm placement as in Xiong et al., arXiv 2002.04745).

Legend: batch, pos, d_model, source.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from depthscope.schemes.base import Mixer, ModelConfig, Scheme, register


@dataclass
class SumState:
    """The running sum and how many sources it holds."""

    x: Tensor  # [batch, pos, d_model]
    n: int


class SumMixer(Mixer):
    """Reads the running sum; writes by adding the output."""

    def read(self, state: SumState) -> tuple[Tensor, SumState]:
        """The input is the running sum x_l itself; its weights are 1 on each of the n sources."""
        self.emit(lambda: ones_weights(state.x, state.n))
        return self.hook_in(state.x), state

    def write(self, state: SumState, out: Tensor) -> SumState:
        """x_{l+1} = x_l + f_l(Norm(x_l)): the output joins the sum as one more source."""
        return SumState(state.x + out, state.n + 1)


@register
class Standard(Scheme):
    """Standard pre-norm residual (the degenerate depth mixer: all ones)."""

    name = "standard"
    paper = "arXiv 1512.03385: Deep Residual Learning (pre-norm: arXiv 2002.04745)"
    static = True  # every weight is 1, for every token

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> SumState:
        """The running sum starts as the embedding, one source (no bookkeeping: every weight is 1)."""
        return SumState(x0, 1)

    @classmethod
    def mixer(cls, cfg, site) -> Mixer:
        """Every consumer, read-out included, reads the running sum (``SumMixer``)."""
        return SumMixer(cfg, site)


def ones_weights(x: Tensor, n: int) -> Tensor:
    """All-ones weights [batch, pos, n] (the standard residual in the delta basis)."""
    return torch.ones(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
