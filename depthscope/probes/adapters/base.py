"""What an adapter is: how one model family is captured, as declarative data plus a few functions.

An ``Adapter`` names, in execution order,

* the sources (the embedding(s), then every sublayer output): label, tap, kind, depth;
* the consumers (every distinct sublayer input, then the read-out): label, the tap of the input,
  kind, depth, how many sources are available to it, and the tap of its per-token weights over
  those sources (``None`` = unit weights: a standard residual);
* the native per-token quantities worth keeping (token means per consumer) and, through
  ``static_native``, the input-independent ones;
* the trace attrs (scheme, variant, label, config), the context length, the vocabulary and the
  tokenizer (``encode``: text -> ids; ``None`` for byte-level models).

A tap is a name the adapter's ``attach`` understands: for TransformerLens models (ours,
TransformerBridge) a hook name. ``attach(model, taps)`` installs one callback per tap for the
duration of a ``with`` block and removes every handle in its ``finally``; the engine
(``probes/capture.py``) does the rest for every family alike.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from depthscope.corpus import Encode
from depthscope.trace import Layout
from depthscope.trace.labels import Kind

Callback = Callable[[Tensor], Tensor | None]  # a tap's callback: may return a replacement
Hook = Callable[[Any, tuple, Any], None]  # a plain forward hook: (module, args, output)


@dataclass(frozen=True)
class SourceSpec:
    """One column of the trace: a tensor written to the residual stream."""

    label: str
    tap: str
    kind: Kind
    depth: int


@dataclass(frozen=True)
class ConsumerSpec:
    """One row of the trace: a tensor read from the residual stream (a sublayer input or the read-out)."""

    label: str
    tap: str  # the input the sublayer receives
    kind: Kind
    depth: int
    n_sources: int  # sources written before it (the first n of the adapter's sources)
    weights: str | None = None  # tap of per-token weights [batch, pos, n(, d_model)]; None = static
    # static weights over the n sources when there is no weights tap (None: all ones); a scaled
    # write (granite's residual_multiplier, minicpm's scale_depth / sqrt(L)) is a static weight
    static: tuple[float, ...] | None = None
    # the ``weights`` tap delivers carried terms, source-major: (terms [n, batch, pos, d_model],
    # mixing [n, batch, pos]) with the input the sum of the terms (post-LN encoders)
    terms: bool = False


@dataclass(frozen=True)
class NativeSpec:
    """A per-token native quantity [batch, pos, *dims] whose token mean a trace keeps as ``name``
    (dims (layer, *dims)), on the row of consumer ``layer``.
    """

    name: str
    tap: str
    layer: str
    dims: tuple[str, ...] = ()
    # a source label: the tap carries the parts of that source's write [batch, pos, part, d_model],
    # checked on every batch to add up to it; the trace keeps the token means of <part, write>
    # (``name``, dims (layer, *dims)) and of |write|^2 (``name``_total)
    parts_of: str | None = None
    # with ``parts_of``: the weight [d_model, d_part] of a linear map (no bias) the parts come before,
    # the write being its image of their sum; None: the parts are in the write's own space
    project: Any = None


def tl_attach(model: Any, taps: list[tuple[str, Callback]]) -> contextlib.AbstractContextManager:
    """Callbacks on TransformerLens hook points (HookedRootModule, TransformerBridge): the
    ``hooks()`` context manager removes every handle in its ``finally``.
    """

    def wrap(fn: Callback):
        return lambda tensor, hook: fn(tensor)

    return model.hooks(fwd_hooks=[(name, wrap(fn)) for name, fn in taps])


# How a module's tensor lays out the tokens of a forward on ids [batch, pos], found once on the probe:
# [batch, pos, d] (or [1, pos, d], shared over the batch); [pos, d] shared over the batch (a position
# embedding of arange(pos)); [batch * pos, d] (a MoE block or OPT's MLP flattens the tokens); or
# [pos, batch, d] (a time-first stream, fairseq's layout).
LAYOUTS = ("bpd", "pd", "flat", "pbd")


def stream_layout(shape: tuple[int, ...], batch: int, pos: int) -> str | None:
    """The layout (``LAYOUTS``) of a tensor of ``shape`` in a forward on ids [batch, pos], or None."""
    if len(shape) == 3 and shape[1] == pos and shape[0] in (1, batch):
        return "bpd"
    if len(shape) == 3 and shape[:2] == (pos, batch) and batch != pos:
        return "pbd"
    if len(shape) == 2 and shape[0] == batch * pos and batch > 1:
        return "flat"
    if len(shape) == 2 and shape[0] == pos:
        return "pd"
    return None


def to_stream(t: Tensor, layout: str, tokens: tuple[int, int] | None) -> Tensor:
    """A tensor of ``layout`` as [batch or 1, pos, d] (a view) in a forward on ids of shape ``tokens``."""
    if layout == "pbd":
        return t.transpose(0, 1)
    if layout == "pd" or (layout == "flat" and t.shape[0] != math.prod(tokens or (0,))):
        return t.unsqueeze(0)  # (a batch of one window: [pos, d] whichever the layout)
    if layout == "flat":
        return t.view(*tokens, t.shape[-1]) if t.is_contiguous() else t.reshape(*tokens, t.shape[-1])
    return t


def from_stream(new: Tensor, layout: str, original: Tensor) -> Tensor:
    """A replacement [batch or 1, pos, d] put back in the layout of the ``original`` it replaces."""
    if layout == "pbd":
        return new.transpose(0, 1)
    return new.reshape(original.shape) if new.shape != original.shape else new


@contextlib.contextmanager
def module_attach(
    model: Any,
    taps: list[tuple[str, Callback]],
    *,
    layouts: dict[str, str] | None = None,
    tokens: Callable[[], tuple[int, int] | None] | None = None,
):
    """Callbacks on plain ``nn.Module``s. A tap is ``"path:out"`` (the module's output, its first
    element if it returns a tuple) or ``"path:in"`` (its first input: positional, else the
    ``hidden_states`` keyword, else its first floating-point tensor keyword); either seen as
    [batch, pos, d] of the forward in flight: by the tap's layout in ``layouts`` (``stream_layout``),
    else flattened tokens [batch x pos, d] are unflattened (``token_view``). ``tokens`` gives the
    (batch, pos) of the forward in flight (default: the shape of the model's first argument). A
    callback may return a replacement tensor, put back in the module's own layout. Every handle is
    removed in the ``finally``.
    """
    noted: list[tuple[int, int]] = []  # (batch, pos) of the model's forward in flight

    def note(module, args, kwargs):
        ids = args[0] if args else kwargs.get("input_ids")
        noted[:] = [tuple(ids.shape)] if isinstance(ids, Tensor) and ids.ndim == 2 else []

    shape = tokens or (lambda: noted[0] if noted else None)
    handles = [] if tokens else [model.register_forward_pre_hook(note, with_kwargs=True)]
    try:
        for tap, fn in taps:
            path, _, where = tap.rpartition(":")
            module = model.get_submodule(path)
            view = _view((layouts or {}).get(tap), shape)
            if where == "out":
                handles.append(module.register_forward_hook(_output_hook(fn, view)))
            elif where == "in":
                handles.append(module.register_forward_pre_hook(_input_hook(fn, view), with_kwargs=True))
            else:
                raise ValueError(f"tap {tap!r} must end in ':in' or ':out'")
        yield
    finally:
        for h in handles:
            h.remove()


def _view(layout: str | None, shape: Callable[[], tuple[int, int] | None]):
    """(seen, back): how a tap sees a module's tensor, and how a replacement goes back."""
    if layout is None:
        return (lambda t: token_view(t, shape())), (
            lambda new, seen, original: new.reshape(original.shape) if seen is not original else new
        )
    return (lambda t: to_stream(t, layout, shape())), (
        lambda new, seen, original: from_stream(new, layout, original)
    )


def token_view(t: Any, tokens: tuple[int, int] | None) -> Any:
    """A tensor [batch x pos, d] of a module that flattens the tokens (a MoE block, OPT's MLP), seen
    as [batch, pos, d] with ``tokens`` = (batch, pos) of the forward; anything else as it is.
    """
    if isinstance(t, Tensor) and t.ndim == 2 and tokens and t.shape[0] == tokens[0] * tokens[1]:
        return t.view(*tokens, t.shape[-1])
    return t


def _output_hook(fn: Callback, view):
    see, back = view

    def hook(module, args, out):
        first = out[0] if isinstance(out, (tuple, list)) else out  # a list: GPT-1's blocks return one
        seen = see(first)
        new = fn(seen)
        if new is None:
            return None
        new = back(new, seen, first)
        if isinstance(out, list):
            return [new, *out[1:]]
        return (new, *out[1:]) if isinstance(out, tuple) else new

    return hook


def input_slot(args: tuple, kwargs: dict) -> tuple[int | str | None, Any]:
    """Where a ``"path:in"`` tap finds a call's input, and the input: its first positional argument,
    else its ``hidden_states`` keyword, else its first floating-point tensor keyword (``ln(x=h)``);
    (None, None) if it has none of them.
    """
    if args:
        return 0, args[0]
    if "hidden_states" in kwargs:
        return "hidden_states", kwargs["hidden_states"]
    key = next((k for k, v in kwargs.items() if isinstance(v, Tensor) and v.is_floating_point()), None)
    return (key, kwargs[key]) if key is not None else (None, None)


def _input_hook(fn: Callback, view):
    see, back = view

    def hook(module, args, kwargs):
        key, first = input_slot(args, kwargs)
        if key is None:
            return None
        seen = see(first)
        new = fn(seen)
        if new is None:
            return None
        new = back(new, seen, first)
        return ((new, *args[1:]), kwargs) if key == 0 else (args, {**kwargs, key: new})

    return hook


def router(taps: list[tuple[str, Callback]]) -> Callable[[str, Any], Tensor | None]:
    """``send(key, value)``: hand ``value`` to the engine's callbacks registered under ``key`` (none:
    nothing happens) and return the replacement one of them returns, if any (ablation).
    """
    routes: dict[str, list[Callback]] = {}
    for key, fn in taps:
        routes.setdefault(key, []).append(fn)

    def send(key: str, value: Any) -> Tensor | None:
        out = None
        for fn in routes.get(key, ()):
            new = fn(value if out is None else out)
            out = out if new is None else new
        return out

    return send


def output(out: Any) -> Any:
    """A module's main output: the first element of a tuple (transformers' layers), else itself."""
    return out[0] if isinstance(out, tuple) else out


def output_hook(send: Callable[[str, Any], Any], label: str) -> Hook:
    """A forward hook that sends the module's main output (``output``) as the source ``label``."""

    def hook(module, args, out) -> None:
        send(label, output(out))

    return hook


def relay(send: Callable[[str, Any], Any], key: str) -> Callback:
    """A callback that hands its value to ``send`` under ``key`` (a module path's tap to a row's key)."""
    return lambda t: send(key, t)


@contextlib.contextmanager
def forward_hooks(model: Any, hooks: list[tuple[str, Hook]]):
    """Plain forward hooks ``fn(module, args, output)`` on submodules by path; removed in the ``finally``."""
    handles = []
    try:
        for path, fn in hooks:
            handles.append(model.get_submodule(path).register_forward_hook(fn))
        yield
    finally:
        for h in handles:
            h.remove()


def find_module(model: Any, class_name: str) -> str | None:
    """Path of the first submodule of class ``class_name`` (``""`` for the model itself), or None."""
    for path, module in model.named_modules():
        if type(module).__name__ == class_name:
            return path
    return None


ABSENT = object()  # config_value's default where "absent" must differ from a stored None


def config_value(config: Any, name: str, default: Any = None) -> Any:
    """``config.name``, or ``default`` where the config has none or reading it raises: transformers'
    heterogeneous configs (one value per layer, ``per_layer_config``) raise on a global read of a
    per-layer attribute (dots3_note_text's ``num_attention_heads``: a RuntimeError, which
    ``getattr``'s default does not catch), and every family's checks must survive any config
    transformers builds.
    """
    try:
        return getattr(config, name, default)
    except Exception:  # noqa: BLE001 - whatever a config property raises, the value is not there
        return default


def config_values(config: Any, keys: tuple[str, ...], *, keep_none: bool = False) -> dict[str, Any]:
    """The ``keys`` a config has, read as ``config_value`` (for a trace's ``config`` attr); a stored
    None is left out unless ``keep_none``.
    """
    found = {k: config_value(config, k, ABSENT) for k in keys}
    return {k: v for k, v in found.items() if v is not ABSENT and (keep_none or v is not None)}


def installed_version(package: str | None) -> str | None:
    """The installed version of a distribution, or None."""
    if package is None:
        return None
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def evaluating(model: Any):
    """Eval mode inside the block; the model's previous mode afterwards."""
    was_training = getattr(model, "training", False)
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def input_device(model: Any) -> torch.device:
    """Where a batch of token ids goes: the model's first parameter's device; the CPU for a model
    dispatched over devices by accelerate (its hooks move each module's inputs themselves).
    """
    if getattr(model, "hf_device_map", None):
        return torch.device("cpu")
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")


def call_model(model: Any, tokens: Tensor) -> Any:
    """The default forward of an adapter: ``model(tokens)``."""
    return model(tokens)


def output_logits(output: Any) -> Tensor:
    """The logits [batch, pos, vocab] in a model's output (a tensor, or an object with ``logits``)."""
    return output if isinstance(output, Tensor) else output.logits


@dataclass
class Head:
    """The read-out's way to logits: a final norm (RMSNorm, or LayerNorm which also centres) and an
    unembedding (weight [vocab, d_model], optional bias). Direct logit attribution linearises the norm
    at each token's own statistics; the logit lens applies ``norm`` and ``unembed`` as they are.
    """

    norm: Any  # the final norm module
    unembed: Any  # the unembedding module (nn.Linear-like)
    centred: bool  # LayerNorm (subtracts the mean) rather than RMSNorm
    eps: float
    weight: Tensor | None  # the norm's gain (None: 1)
    bias: Tensor | None  # the norm's bias (LayerNorm)

    @property
    def W_U(self) -> Tensor:  # noqa: N802 (the usual name)
        """The unembedding's weight [vocab, d_model]."""
        return self.unembed.weight

    @property
    def b_U(self) -> Tensor | None:  # noqa: N802
        """The unembedding's bias [vocab], or None."""
        return getattr(self.unembed, "bias", None)

    def normalise(self, h: Tensor) -> Tensor:
        """The final norm, computed from its parameters (not by calling the module, whose hooks may be
        the read-out's tap).
        """
        x = h - h.mean(-1, keepdim=True) if self.centred else h
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            x = x * self.weight.to(x.dtype)
        return x + self.bias.to(x.dtype) if self.bias is not None else x

    def logits(self, h: Tensor) -> Tensor:
        """Decode a stream state through the final norm and the unembedding (the logit lens)."""
        b_U = self.b_U.to(h.dtype) if self.b_U is not None else None  # noqa: N806
        return torch.nn.functional.linear(self.normalise(h), self.W_U.to(h.dtype), b_U)


def head_of(norm: Any, unembed: Any) -> Head:
    """A Head from the modules themselves: LayerNorm-like if it has a bias or is a LayerNorm,
    RMSNorm-like otherwise; eps from ``eps`` or ``variance_epsilon``.
    """
    import torch.nn as nn

    bias = getattr(norm, "bias", None)
    centred = isinstance(norm, nn.LayerNorm) or bias is not None
    eps = getattr(norm, "eps", None)
    if eps is None:
        eps = getattr(norm, "variance_epsilon", None)
    if eps is None:  # torch's RMSNorm(eps=None): the dtype's machine epsilon
        eps = torch.finfo(
            norm.weight.dtype if getattr(norm, "weight", None) is not None else torch.float32
        ).eps
    return Head(norm, unembed, centred, float(eps), getattr(norm, "weight", None), bias)


@dataclass
class Adapter:
    """How the engine captures one model: see the module docstring."""

    family: str
    sources: list[SourceSpec]
    consumers: list[ConsumerSpec]
    attrs: dict[str, Any]  # scheme, variant, label, config
    ctx: int
    vocab: int
    encode: Encode | None = None
    native: list[NativeSpec] = field(default_factory=list)
    static_native: Callable[[], dict[str, tuple[tuple[str, ...], Any, dict[str, Any]]]] = dict
    attach: Callable[[Any, list[tuple[str, Callback]]], contextlib.AbstractContextManager] = tl_attach
    forward: Callable[[Any, Tensor], Any] = call_model
    hint: str = ""  # appended to the refusal of a model whose inputs do not rebuild
    head: Head | None = None  # the final norm and unembedding (logit attribution, lens, ablation)
    logits: Callable[[Any], Tensor] = output_logits
    # consumer taps are views (replacing one changes only what that sublayer reads, not the
    # stream): needed to remove a source's term from chosen consumers (ablation)
    views: bool = True
    # first positions of each window left out of the statistics by default: 1 for pretrained
    # causal LMs, which park an attention sink there (SmolLM2: 99% of the squared norm at the
    # input of layer 12 sits at position 0); 0 for models without one
    skip_positions: int = 0
    # ``attach`` takes a third argument, the engine's ``probes.workspace.Workspace``: the buffers an
    # adapter needs from batch to batch are lent by the engine, never kept by the adapter
    workspace: bool = False

    def __post_init__(self) -> None:
        self.attrs["family"] = self.family  # the trace's family attr: the adapter's own, said once

    def attached(self, model: Any, taps: list[tuple[str, Callback]], workspace: Any = None):
        """``attach``, lending ``workspace`` to an adapter that takes one."""
        if self.workspace and workspace is not None and _takes_three(self.attach):
            return self.attach(model, taps, workspace)
        return self.attach(model, taps)  # (an attach replaced by another family's takes two)

    def layout(self) -> Layout:
        """The trace axes."""
        return Layout(
            layer=[c.label for c in self.consumers],
            layer_depth=[c.depth for c in self.consumers],
            layer_kind=[c.kind for c in self.consumers],
            layer_sources=[c.n_sources for c in self.consumers],
            source=[s.label for s in self.sources],
            source_depth=[s.depth for s in self.sources],
            source_kind=[s.kind for s in self.sources],
        )


def _takes_three(fn: Callable) -> bool:
    """Whether ``fn`` takes a third positional argument (an ``attach`` that borrows a workspace)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) >= 3
