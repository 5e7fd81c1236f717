"""Unrolling multi-stream residuals (HC, mHC, DeepSeek-V4, Qwen4-Exp ...) into the delta basis.

Every multi-stream scheme fits h'_t = sum_s R[s, t] h_s + P_t f(sum_s A_s h_s) (research note
``implementations.md`` Sec. 7; R in the source-row convention: R[s, t] carries stream s into
stream t), with streams started as copies of the embedding (plus constant stream embeddings, if
any, as sources of their own). Track per token the coefficients C [batch, pos, stream, source]:
stream s holds sum_j C[s, j] v_j. A sublayer reading with weights A has delta-basis weights
sum_s A_s C[s, :]; its write makes C <- R^T C and appends the column P for its output; a read-out
sums (or weighs) the streams. Per-channel read weights (Qwen4-Exp) A [.., stream, d_model] give
per-feature weights [.., source, d_model]. Exact per token, in float64 unless told otherwise.

Legend: batch, pos, stream, source, d_model.
"""

from __future__ import annotations

import torch
from torch import Tensor


class StreamUnroll:
    """The coefficients C of n streams over the sources written so far."""

    def __init__(self, coef: Tensor):
        self.coef = coef  # [batch, pos, stream, source]

    @classmethod
    def start(
        cls,
        batch_pos: tuple[int, int],
        streams: int,
        init: Tensor | None = None,
        dtype=torch.float64,
        device: torch.device | str | None = None,
    ) -> StreamUnroll:
        """Streams that are copies of the embedding (source 0): ``init`` [stream, k] gives the
        coefficients of k initial sources instead (e.g. the embedding and a stream embedding).
        The coefficients live on ``device`` (the embedding's); every read and write is moved there.
        """
        if init is None:
            init = torch.ones(streams, 1, dtype=dtype)
        return cls(init.to(device=device, dtype=dtype).expand(*batch_pos, *init.shape).clone())

    @property
    def n_sources(self) -> int:
        """Sources written so far (the coefficients' last dimension)."""
        return self.coef.shape[-1]

    def read(self, pre: Tensor) -> Tensor:
        """Delta-basis weights of a read with stream weights ``pre`` [batch, pos, stream] (scalar
        per stream: -> [batch, pos, source]) or [batch, pos, stream, d_model] (per channel:
        -> [batch, pos, source, d_model]).
        """
        pre = pre.to(self.coef.device, self.coef.dtype)
        if pre.ndim == self.coef.ndim - 1:
            return torch.einsum("bps,bpsn->bpn", pre, self.coef)
        return torch.einsum("bpsd,bpsn->bpnd", pre, self.coef)

    def write(self, res: Tensor | None, post: Tensor) -> None:
        """A sublayer's write: C <- res^T C (``res`` [batch, pos, stream, stream], source x target;
        None = identity, no stream mixing), then the column ``post`` [batch, pos, stream].
        """
        coef = self.coef
        if res is not None:
            coef = torch.einsum("bpst,bpsn->bptn", res.to(coef.device, coef.dtype), coef)
        self.coef = torch.cat([coef, post.to(coef.device, coef.dtype).unsqueeze(-1)], dim=-1)

    def readout(self, head: Tensor | None = None) -> Tensor:
        """The read-out's weights: the streams summed (``head`` None) or weighed by ``head``."""
        return self.coef.sum(-2) if head is None else self.read(head)
