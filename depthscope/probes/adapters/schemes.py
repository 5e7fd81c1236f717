"""Adapter for depthscope's own models (``DepthModel``, every scheme of ``depthscope.schemes``).

Sources and consumers come from the scheme's layout (``schemes.sources`` / ``schemes.consumers``):
each consumer's mixer reports its input through ``hook_in`` and its per-token weights over the
sources written so far through ``hook_weights``, in the delta basis, whatever the scheme's own
parametrisation; native per-token quantities are the scheme's ``native_hooks``, static ones its
``static_native``.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from depthscope.errors import DepthscopeError
from depthscope.probes.adapters.base import Adapter, ConsumerSpec, NativeSpec, SourceSpec, head_of, tl_attach
from depthscope.probes.adapters.family import Family
from depthscope.probes.adapters.grn import SUFFIX, split_attach, split_weights
from depthscope.schemes import DepthModel, consumers, names, sources
from depthscope.schemes.base import VOCAB, variant_label

NAME = "depthscope"
TRAINING_ATTRS = ("step", "train_tokens", "val_loss")  # from the checkpoint's metadata, when it has them


def detect(model: Any) -> bool:
    """Whether ``model`` is one of depthscope's own ``DepthModel``s."""
    return isinstance(model, DepthModel)


# the last static weights read of each model, with the state of its tensors they were read from
_STATIC: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _state(model: DepthModel) -> tuple:
    """Which tensors ``model`` holds and their contents' versions: any change of a parameter or buffer
    (an optimiser step or ``load_state_dict`` in place, new data, another dtype or device) changes it.
    """
    tensors = itertools.chain(model.parameters(), model.buffers())
    return tuple((id(t), t._version, t.data_ptr(), t.dtype, t.device) for t in tensors)


def static_weights(model: DepthModel) -> dict[str, tuple[float, ...]]:
    """Each consumer's weights of a static scheme (``Scheme.is_static``: the same for every token),
    read from one forward of two tokens; scalar weights only (per-feature ones stay per token).
    The engine's rebuild check on every batch holds them to being the same for every token. Read
    again only when a tensor of the model changed (``_state``): a capture of many small chunks
    would otherwise pay a forward for each.
    """
    state = _state(model)
    held = _STATIC.get(model)
    if held is not None and held[0] == state:
        return dict(held[1])
    got: dict[str, tuple[float, ...]] = {}

    def keep(label: str):
        def hook(t: Tensor, hook) -> None:
            if t.ndim == 3:  # [batch, pos, source]: scalars
                got[label] = tuple(float(x) for x in t[0, 0].double())

        return hook

    hooks = [(c.hook_weights, keep(c.label)) for c in consumers(model.cfg)]
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            model(torch.zeros(1, 2, dtype=torch.long, device=next(model.parameters()).device))
    finally:
        model.train(was)
    _STATIC[model] = (state, dict(got))
    return got


def build(model: DepthModel, split_grn: bool = True) -> Adapter:
    """The adapter of a ``DepthModel``: its scheme's sources, consumers (weights from each mixer's
    ``hook_weights``) and native hooks; its checkpoint's step, tokens and loss as attrs when it has them.
    ``split_grn``: GRN weights handed to the engine as ``Split`` (else whole [T, n, d]).
    """
    cfg = model.cfg
    srcs = [SourceSpec(s.label, s.hook, s.kind, s.depth) for s in sources(cfg)]
    fixed = static_weights(model) if model.scheme.is_static(cfg.options) else {}
    # GRN-v2/v3 and DCA: per-feature weights in two parts (static + gate), never formed whole by the
    # engine (what needs them whole, the read-out's attribution, ablations and ``inspect``, calls
    # ``probes.terms.whole``).
    splits = split_weights(model) if split_grn else {}
    cons = []
    for c in consumers(cfg):
        w = fixed.get(c.label)
        if w is None:  # per-token weights, from the mixer's hook (or split, from the gate's)
            tap = c.hook_weights + SUFFIX if c.hook_weights in splits else c.hook_weights
            spec = ConsumerSpec(c.label, c.hook_in, c.site.kind, c.site.depth, c.site.n_sources, tap)
        else:  # unit (None) or static scalars: the engine's one Gram product per batch
            unit = all(x == 1.0 for x in w)
            spec = ConsumerSpec(
                c.label, c.hook_in, c.site.kind, c.site.depth, c.site.n_sources, static=None if unit else w
            )
        cons.append(spec)
    native = [
        NativeSpec(
            n.name, n.hook, n.layer, n.dims, n.parts_of, n.project and model.get_submodule(n.project).weight
        )
        for n in model.scheme.native_hooks(cfg)
    ]
    label = variant_label(cfg)
    training = {
        k: model.training_summary[k] for k in TRAINING_ATTRS if model.training_summary.get(k) is not None
    }
    if "step" not in training and "steps" in model.training_summary:  # checkpoints from before snapshots
        training["step"] = model.training_summary["steps"]
    return Adapter(
        family=NAME,
        sources=srcs,
        consumers=cons,
        attrs={
            "scheme": cfg.scheme,
            "variant": label,
            "label": label,
            "config": cfg.to_json(),
            **training,
            **model.scheme.trace_attrs(cfg),
        },
        ctx=cfg.ctx,
        vocab=VOCAB,
        native=native,
        static_native=lambda: model.scheme.static_native(model),
        head=head_of(model.ln_final, model.unembed),
        attach=split_attach(splits) if splits else tl_attach,
    )


def stream_reads(model: DepthModel, adapter: Adapter) -> tuple[int, Callable[[Any], Any]]:
    """Where stream statistics read a multi-stream model's streams (HC, mHC, sHC: ``probes.stream_stats``):
    the number of streams, and the context that wraps each stream mixer's ``read`` to report to the sums.
    """
    from depthscope.schemes.hc import StreamScheme

    if not issubclass(model.scheme, StreamScheme):
        raise DepthscopeError(f"stream statistics: a {model.cfg.scheme} model has one residual stream")
    return model.cfg.options.streams, lambda sums: _wrapped_reads(model, sums)


@contextlib.contextmanager
def _wrapped_reads(model: Any, sums: Any) -> Iterator[None]:
    """Our HC/mHC models: each stream mixer's ``read`` wrapped for the forward (instance attributes)."""
    from depthscope.schemes.hc import StreamMixer, StreamReadout

    mixers = [
        (names.label(b, kind), getattr(block, f"{kind}_mix"))
        for b, block in enumerate(model.blocks)
        for kind in block.kinds
    ]
    mixers.append((names.READOUT, model.readout_mix))
    wrapped = []
    try:
        for label, mixer in mixers:
            if not isinstance(mixer, (StreamMixer, StreamReadout)):
                raise DepthscopeError(
                    f"stream statistics: {label} of a {model.cfg.scheme} model has no streams"
                )
            mixer.read = _reading(label, mixer.read, sums)
            wrapped.append(mixer)
        yield
    finally:
        for mixer in wrapped:
            del mixer.read


def _reading(label: str, read: Callable, sums: Any) -> Callable:
    def wrapper(state):
        x, after = read(state)
        p = after.pending
        if label == names.READOUT:
            sums.record(label, state.h, None, None, state.h.sum(-2))
        else:
            lead, n = state.h.shape[:-2], state.h.shape[-2]
            pre = p.pre.expand(*lead, n)
            sums.record(label, state.h, pre, p.res, x)
        return x, after

    return wrapper


FAMILY = Family(
    name=NAME,
    reads="depthscope's own models (every scheme): each mixer's hook_weights, already in the delta basis",
    detect=detect,
    build=build,
    priority=0,
    streams=stream_reads,
)
