"""The engine's workspace: the buffers it lends, kept from batch to batch.

A capture's big tensors (the source buffer, the post-LN terms, the deferred per-token mixing) have
the same shapes in every batch, so they are allocated once and reused. The engine owns them in one
``Workspace`` and lends it to the accumulator and to an adapter that asks (``Adapter.workspace``):
no adapter keeps buffers of its own between batches, and a capture's memory is in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import Tensor


class Workspace:
    """Buffers by key, reused while their shape, dtype and device stay; constants made once."""

    def __init__(self) -> None:
        self._buffers: dict[Hashable, Tensor] = {}
        self._constants: dict[Hashable, Tensor] = {}

    def buffer(
        self, key: Hashable, shape: tuple[int, ...], like: Tensor, dtype: torch.dtype | None = None
    ) -> Tensor:
        """The buffer ``key`` of ``shape`` on ``like``'s device, in ``dtype`` (default: ``like``'s):
        the kept one where it fits (its old contents left as they are), else a new one (the old one
        freed first).
        """
        dtype = like.dtype if dtype is None else dtype
        have = self._buffers.get(key)
        if have is not None and have.shape == shape and have.dtype == dtype and have.device == like.device:
            return have
        self._buffers.pop(key, None)
        have = self._buffers[key] = like.new_empty(shape, dtype=dtype)
        return have

    def free(self, key: Hashable) -> None:
        """Let buffer ``key`` go (before a larger one of another shape is asked for)."""
        self._buffers.pop(key, None)

    def constant(self, key: Hashable, make: Callable[[], Tensor]) -> Tensor:
        """The tensor ``make()`` gives, made once per key (an index or a vector the same every batch)."""
        have = self._constants.get(key)
        if have is None:
            have = self._constants[key] = make()
        return have
