"""DCA's per-feature weights in two parts, for the engine's fast path (arXiv 2502.06785, Sec. 3).

A GRN's coefficient of stack entry i is c_i = b_i + gate_i: a static per-feature part b_i [d_model]
(GRN-v2, v3 and DCA) plus, for v3 and DCA, a per-token scalar gate_i = relu(w . N(g_i)). In the
delta basis a source s has its entry's coefficient (``index``), and the MLP of a block reads its
own attention output with weight 1 on top. So a consumer's weights [T, n, d] are ``Split``: static
b[index] [n, d] and gate[index] [T, n], which the engine folds without ever forming the [T, n, d]
weights (``probes.folds.PerFeature``), and the forward does not build them either: the mixers'
``hook_weights`` stay unheard, and the gates come from ``hook_gate``, which every v3 GRN calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from depthscope.probes.adapters.base import Callback, tl_attach
from depthscope.probes.terms import Split
from depthscope.schemes import DepthModel
from depthscope.schemes.dca import GRN, DCAAttentionMixer, SkipMixer

SUFFIX = ":split"  # a consumer's weights tap that delivers ``Split`` weights: its hook_weights + this


def split_weights(model: DepthModel) -> dict[str, tuple[str, Callable[[Tensor], Split]]]:
    """For each per-feature consumer of a GRN-v2/v3 or DCA model, by its ``hook_weights``: the hook
    that fires with its per-token part (the gate; v2 has none: the consumer's ``hook_in``) and how
    that hook's value [batch, pos, entry] (or its input) becomes its ``Split`` weights. A block's MLP
    reads its query GRN's weights plus 1 on its own attention: the two share a ``Split.base`` (the
    GRN's path) where their source -> entry indices agree.
    """
    if model.cfg.scheme != "dca" or model.cfg.options.grn == "v1":
        return {}
    extended = set()  # paths of the GRNs a SkipMixer reads with the GRN's own index
    for path, module in model.named_modules():
        if isinstance(module, SkipMixer):
            grn_path = _path_of(model, _query(model, path))
            if torch.equal(module.index, _index(model, grn_path)):
                extended.add(grn_path)
    out = {}
    for path, module in model.named_modules():
        if isinstance(module, GRN) and hasattr(module, "hook_weights"):
            grn, index, extra = module, _index(model, path), 0
        elif isinstance(module, SkipMixer):  # its block's (query) GRN, plus 1 on its own attention
            grn, index, extra = _query(model, path), module.index, 1
        else:
            continue
        grn_path = _path_of(model, grn)
        gated = grn.variant == "v3"
        fire = f"{grn_path}.hook_gate" if gated else f"{path}.hook_in"
        base = grn_path if grn_path in extended else None
        out[f"{path}.hook_weights"] = (fire, _splitter(grn, index, extra, gated, base))
    return out


def _query(model: Any, skip_path: str) -> GRN:
    """The GRN whose output a block's MLP reads (its skip): the block's attention's query view, or the
    attention mixer itself where it is one GRN (v2, v3).
    """
    attn = model.get_submodule(skip_path.rsplit(".", 1)[0] + ".attn_mix")
    return attn.q if isinstance(attn, DCAAttentionMixer) else attn


def _index(model: Any, path: str) -> Tensor:
    """A GRN's source -> entry index: its own, or its attention mixer's (a DCA view)."""
    module = model.get_submodule(path)
    return module.index if hasattr(module, "index") else model.get_submodule(path.rsplit(".", 1)[0]).index


def _path_of(model: Any, module: Any) -> str:
    return next(p for p, m in model.named_modules() if m is module)


def _splitter(
    grn: GRN, index: Tensor, extra: int, gated: bool, base: str | None
) -> Callable[[Tensor], Split]:
    def split(t: Tensor) -> Split:
        static = grn.b.detach().index_select(0, index)  # [n, d]
        if gated:  # t: the gates [batch, pos, entry]
            gate = t.index_select(-1, index)
        else:  # t: the consumer's input [batch, pos, d]; no per-token part
            gate = t.new_zeros(*t.shape[:2], len(index))
        if extra:
            static = torch.cat([static, static.new_ones(extra, static.shape[1])])
            gate = torch.cat([gate, gate.new_zeros(*gate.shape[:2], extra)], -1)
        return Split(static.to(gate.dtype), gate, base, extra)

    return split


def split_attach(splits: dict[str, tuple[str, Callable[[Tensor], Split]]]):
    """``attach`` for a model with split weights: each tap ``hook_weights + SUFFIX`` is fed from the hook
    that fires with its per-token part; every other tap is a TransformerLens hook as usual.
    """

    def attach(model: Any, taps: list[tuple[str, Callback]]):
        plain = []
        for tap, fn in taps:
            if tap.endswith(SUFFIX):
                fire, split = splits[tap.removesuffix(SUFFIX)]
                plain.append((fire, _fed(fn, split)))
            else:
                plain.append((tap, fn))
        return tl_attach(model, plain)

    return attach


def _fed(fn: Callback, split: Callable[[Tensor], Split]) -> Callback:
    def hook(t: Tensor) -> None:
        fn(split(t))  # weights are read, never replaced

    return hook
