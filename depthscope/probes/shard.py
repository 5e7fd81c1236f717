"""Data-parallel capture on torch.distributed: which batches a rank takes, and the merge.

Rank r of a world of W takes the batches b with b % W == r (the same windows, cut into the same
batches, as a single-process capture), folds them into its own float64 sums, and every rank then
gathers every rank's state and adds them in rank order. Float64 addition is not associative, so the
order is fixed: the merged sums are reproducible for a given world size, and differ from the
single-process sums only by float64 rounding (relative 1e-15 or so; the merge of the means and of
the covariances uses Chan et al.'s parallel update, exact in exact arithmetic).

The states travel as pickled NumPy arrays through a gloo group on the CPU, whatever the main
backend (NCCL on GPUs): the sums live on the CPU anyway.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

_GROUP: dict[str, Any] = {}


def shard() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) unless a process group is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _group() -> Any:
    """A gloo group over every rank, for objects on the CPU (the default group if it is gloo)."""
    if dist.get_backend() == "gloo":
        return None
    if "gloo" not in _GROUP:
        _GROUP["gloo"] = dist.new_group(backend="gloo")
    return _GROUP["gloo"]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_group())
    return out
