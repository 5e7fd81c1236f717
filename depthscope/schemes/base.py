"""The scheme protocol, the model config, and the layout of sources and consumers.

A residual scheme is a class with a name, a frozen ``Options`` dataclass, and two duties:

* ``start(cfg, x0, track)`` turns the token embedding into the scheme's depth state;
* ``mixer(cfg, site)`` builds the module that, for one consumer (a sublayer input or the
  read-out), *reads* the state into that consumer's input and *writes* the consumer's output
  back into the state. ``read`` returns the input together with the state that ``write`` will
  receive, so whatever ``read`` computed for the write (a block's mixed stream, stream matrices)
  travels explicitly, and no state object is ever modified in place.

Every mixer reports, through ``hook_weights``, its per-token weights over the sources written so
far in the delta basis (embedding + sublayer outputs), whatever its native parametrisation; the
input it hands on goes through ``hook_in``. The standard residual is the degenerate case.

Legend: batch, pos, d_model, source (embedding, then sublayer outputs in execution order).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import numbers
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from depthscope.errors import ConfigError
from depthscope.schemes import names
from depthscope.schemes._common import MLP, Attention, listening

VOCAB = 256  # byte-level models


@dataclass(frozen=True)
class NoOptions:
    """A scheme without settings of its own."""


@dataclass(frozen=True)
class ModelConfig:
    """Size and scheme of a byte-level decoder-only pre-norm transformer."""

    scheme: str = "standard"
    n_layers: int = 4
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 0  # 0 means 4 * d_model
    ctx: int = 128
    options: Any = field(default=None)  # the scheme's Options instance; None = its defaults

    def __post_init__(self) -> None:
        scheme = get_scheme(self.scheme)
        if self.options is None:
            object.__setattr__(self, "options", scheme.Options())
        elif isinstance(self.options, dict):
            object.__setattr__(self, "options", build_options(scheme, self.options))
        elif not isinstance(self.options, scheme.Options):
            raise ConfigError(f"options for {self.scheme!r} must be {scheme.Options.__name__}")
        for key in ("n_layers", "d_model", "n_heads", "d_mlp", "ctx"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ConfigError(f"{key} must be an integer, got {value!r:.40}")
        if self.d_mlp == 0:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        for key in ("n_layers", "d_model", "n_heads", "d_mlp", "ctx"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ConfigError(f"d_model {self.d_model} must split into {self.n_heads} heads of even size")
        scheme.validate(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (options as a plain dict)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["options"] = dataclasses.asdict(self.options)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """The config a ``to_dict`` dict describes (options as a plain dict); ConfigError for unknown keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        """``to_dict`` as JSON with sorted keys (the ``config`` attr of a trace)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @property
    def kinds(self) -> tuple[names.Kind, ...]:
        """Sublayer kinds of one block, in execution order."""
        return get_scheme(self.scheme).kinds(self.options)

    @property
    def n_sublayers(self) -> int:
        """Sublayers in the whole model: blocks times sublayer kinds per block."""
        return self.n_layers * len(self.kinds)


@dataclass(frozen=True)
class Site:
    """Where a consumer sits: block, kind and position in execution order.

    ``index`` counts sublayers from 0 in execution order; the read-out has index = number of
    sublayers. ``depth`` = index + 1 is the number of sources written before it (embed has
    depth 0), so a consumer of depth T has the uniform 1/T share.
    """

    block: int
    kind: names.Kind
    index: int

    @property
    def label(self) -> str:
        """Trace label of the sublayer, e.g. ``3.attn``; ``readout`` for the read-out."""
        return names.label(self.block, self.kind)

    @property
    def depth(self) -> int:
        """Depth index + 1: its output's source depth (embed = 0), and the T of its input's 1/T share."""
        return self.index + 1

    @property
    def n_sources(self) -> int:
        """Sources written before this consumer reads: the embedding and every earlier sublayer output."""
        return self.index + 1


def sublayer_sites(cfg: ModelConfig) -> list[Site]:
    """Every sublayer in execution order."""
    kinds = cfg.kinds
    return [Site(b, k, b * len(kinds) + j) for b in range(cfg.n_layers) for j, k in enumerate(kinds)]


def readout_site(cfg: ModelConfig) -> Site:
    """The read-out's site: block ``n_layers``, index = number of sublayers (all are written before it)."""
    return Site(cfg.n_layers, names.READOUT, cfg.n_sublayers)


@dataclass(frozen=True)
class Consumer:
    """One row of the depth-mixing matrix: a distinct input of a sublayer, or the read-out."""

    site: Site
    view: str | None = None

    @property
    def label(self) -> str:
        """Trace label of the row: the site's, plus ``.view`` for one of several inputs (``3.attn.q``)."""
        return f"{self.site.label}.{self.view}" if self.view else self.site.label

    @property
    def hook_in(self) -> str:
        """Hook name of the mixed input this row describes."""
        return names.mix_in(self.site.block, self.site.kind, self.view)

    @property
    def hook_weights(self) -> str:
        """Hook name of this row's per-token delta-basis weights over the sources."""
        return names.mix_weights(self.site.block, self.site.kind, self.view)


@dataclass(frozen=True)
class Source:
    """One column of the depth-mixing matrix: the embedding or a sublayer output."""

    label: str
    hook: str
    depth: int
    kind: names.Kind


def sources(cfg: ModelConfig) -> list[Source]:
    """The embedding, then every sublayer output, in execution order."""
    out = [Source(names.EMBED, names.HOOK_EMBED, 0, names.EMBED)]
    out += [Source(s.label, names.source_out(s.block, s.kind), s.depth, s.kind) for s in sublayer_sites(cfg)]
    return out


def consumers(cfg: ModelConfig) -> list[Consumer]:
    """Every consumer (with one row per view), in execution order, then the read-out."""
    scheme = get_scheme(cfg.scheme)
    out = []
    for site in sublayer_sites(cfg):
        views = scheme.views(cfg.options, site.kind)
        out += [Consumer(site, v) for v in views] if views else [Consumer(site)]
    return out + [Consumer(readout_site(cfg))]


class Port(nn.Module):
    """The hooks of one consumer input: the mixed input and its weights over the sources.

    ``decayed`` names the parameters of a depth-mixing module that get weight decay (a paper's
    dynamic projections); every other parameter of a mixer is exempt, since its initialisation
    (ones, identities, uniform queries) is meaningful.
    """

    decayed: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        self.hook_in = HookPoint()  # [batch, pos, d_model]
        self.hook_weights = HookPoint()  # [batch, pos, source] or [batch, pos, source, d_model]

    def emit(self, weights: typing.Callable[[], Tensor]) -> None:
        """Pass delta-basis weights to ``hook_weights``, building them only if someone listens."""
        if listening(self.hook_weights):
            self.hook_weights(weights())


class MixerBase(nn.Module, abc.ABC):
    """One consumer's depth mixer: state -> consumer input, then consumer output -> state.

    A consumer with one input is a ``Mixer`` (its own ``Port``); one with several inputs (DCA's
    attention) is a ``ViewsMixer`` whose ports are children named after the views.
    """

    decayed: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__()
        self.site = site

    @abc.abstractmethod
    def read(self, state: Any) -> tuple[Tensor | tuple[Tensor, ...], Any]:
        """(the consumer's input, already passed through ``hook_in``; the state for ``write``)."""

    def write(self, state: Any, out: Tensor) -> Any:
        """Fold the consumer's output into the state ``read`` returned.

        The read-out never writes: calling this on it is a programming error.
        """
        raise NotImplementedError(f"{self.site.label} does not write")


class Mixer(MixerBase, Port):
    """A consumer with one input: ``hook_in`` / ``hook_weights`` sit on the mixer itself."""


class ViewsMixer(MixerBase):
    """A consumer with several inputs: one ``Port`` child per view (``blocks.{i}.attn_mix.q``...)."""


class Scheme(abc.ABC):
    """A residual scheme: its name, paper, options, sublayer kinds and mixers.

    Everything the rest of depthscope needs to know about a scheme is declared here, so adding
    one is its module plus one import in ``schemes/__init__.py``: its named variants (tables,
    tests, benchmarks) and whether its weights are static (``is_static``, used by the benchmarks'
    targets). Which variants the zoo bundles is the zoo's curation (``depthscope.zoo``), a
    scheme's colour a figure concern (``figures.style.SCHEME_COLORS``).
    """

    name: ClassVar[str]
    paper: ClassVar[str]  # "arXiv id: short title"
    Options: ClassVar[type] = NoOptions
    # Named option sets shown in the demo table, benchmarks and the generic tests; a scheme that
    # names none has one, named after it, with the default options (``register`` fills it in).
    variants: ClassVar[dict[str, dict[str, Any]]] = {}
    # Whether the delta-basis weights are input-independent (the same for every token): always
    # (True), never (False), or when each named option takes one of the listed values.
    static: ClassVar[bool | dict[str, tuple[Any, ...]]] = False

    @classmethod
    def is_static(cls, options: Any) -> bool:
        """Whether the weights are the same for every token under these options (``static``)."""
        if isinstance(cls.static, bool):
            return cls.static
        return all(getattr(options, key) in values for key, values in cls.static.items())

    @classmethod
    def kinds(cls, options: Any) -> tuple[names.Kind, ...]:
        """Sublayer kinds of one block in execution order; by default attention, then MLP."""
        return (names.ATTN, names.MLP)

    @classmethod
    def views(cls, options: Any, kind: str) -> tuple[str, ...]:
        """Named inputs of a sublayer kind when it takes several (DCA: q, k, v)."""
        return ()

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError if the options do not fit the model size (most schemes fit any)."""
        return None

    @classmethod
    def native_hooks(cls, cfg: ModelConfig) -> list[NativeHook]:
        """Per-token native quantities worth keeping in a trace (token means), if any."""
        return []

    @classmethod
    def trace_attrs(cls, cfg: ModelConfig) -> dict[str, str]:
        """Extra trace attrs, e.g. what a consumer row describes when it is not the sublayer's own input."""
        return {}

    @classmethod
    def static_native(cls, model: nn.Module) -> dict[str, tuple[tuple[str, ...], Any, dict[str, Any]]]:
        """Input-independent native weights as {name: (dims, array, coords)}, if any."""
        return {}

    @classmethod
    def sublayer(cls, cfg: ModelConfig, site: Site) -> nn.Module:
        """The sublayer at ``site``: rotary causal attention or a GELU MLP, each applying its own pre-norm."""
        if site.kind == names.ATTN:
            return Attention(cfg.d_model, cfg.n_heads, cfg.ctx)
        if site.kind == names.MLP:
            return MLP(cfg.d_model, cfg.d_mlp)
        raise ConfigError(f"scheme {cls.name!r} has no sublayer kind {site.kind!r}")

    @classmethod
    @abc.abstractmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> Any:
        """The depth state after the embedding; ``track`` asks for delta-basis bookkeeping."""

    @classmethod
    @abc.abstractmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> MixerBase:
        """The mixer of one consumer."""


_REGISTRY: dict[str, type[Scheme]] = {}


def register(cls: type[Scheme]) -> type[Scheme]:
    """Class decorator adding a scheme to the registry; a scheme that names no variants has one, its own
    name with the default options.
    """
    if not cls.__dict__.get("variants"):
        cls.variants = {cls.name: {}}
    _REGISTRY[cls.name] = cls
    return cls


def variants() -> list[tuple[str, str, dict[str, Any]]]:
    """Every (label, scheme name, options) variant of every registered scheme."""
    out = []
    for name, cls in _REGISTRY.items():
        out += [(label, name, dict(opts)) for label, opts in cls.variants.items()]
    return out


def scheme_names() -> list[str]:
    """Names of the registered schemes, in registration order."""
    return list(_REGISTRY)


def get_scheme(name: str) -> type[Scheme]:
    """The scheme class registered under ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown scheme {name!r}; known: {', '.join(_REGISTRY)}") from None


def _convert(value: str, kind: Any, key: str) -> Any:
    """One option value as the type its field declares: parsed from a string, or checked if already typed."""
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return _choice(value, kind, key)
    if origin in (typing.Union, types.UnionType):
        return _optional(value, kind, key)
    if not isinstance(value, str):
        return _typed(value, kind, key)
    return _parsed(value, kind, key)


def _choice(value: Any, kind: Any, key: str) -> Any:
    """The ``Literal`` choice whose string form is the value's."""
    choices = typing.get_args(kind)
    for c in choices:
        if str(c) == str(value):
            return c
    raise ConfigError(f"option {key}={value!r} is not one of {', '.join(map(str, choices))}")


def _optional(value: Any, kind: Any, key: str) -> Any:
    """None for None, "none" or "None"; otherwise the value as the union's first type other than None."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if value in (None, "none", "None"):
        return None
    return _convert(value, args[0], key)


def _typed(value: Any, kind: type, key: str) -> Any:
    """A value given already typed: an int widened to float where a float is due, else checked as it is."""
    if kind is float and isinstance(value, int):
        return float(value)
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"option {key} must be true or false, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"option {key} must be {kind.__name__}, got {value!r}")
    return value


def _parsed(value: str, kind: type, key: str) -> Any:
    """A value given as a string: a bool from 1/true/yes or 0/false/no (any case), else ``kind(value)``."""
    try:
        if kind is bool:
            if value.lower() in ("1", "true", "yes"):
                return True
            if value.lower() in ("0", "false", "no"):
                return False
            raise ValueError(value)
        return kind(value)
    except ValueError:
        raise ConfigError(f"option {key}={value!r} is not a valid {kind.__name__}") from None


def build_options(scheme: type[Scheme], values: dict[str, Any]) -> Any:
    """The scheme's Options from a dict of (string or typed) values, validated."""
    hints = typing.get_type_hints(scheme.Options)
    fields = {f.name for f in dataclasses.fields(scheme.Options)}
    unknown = set(values) - fields
    if unknown:
        valid = ", ".join(sorted(fields)) or "none"
        raise ConfigError(
            f"unknown option(s) {', '.join(sorted(unknown))} for scheme {scheme.name!r} (valid: {valid})"
        )
    try:
        return scheme.Options(**{k: _convert(v, hints[k], k) for k, v in values.items()})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"bad options for scheme {scheme.name!r}: {err}") from None


def variant_label(cfg: ModelConfig) -> str:
    """The named variant a config belongs to (e.g. ``attnres-block4``), else scheme + options."""
    scheme = get_scheme(cfg.scheme)
    for label, opts in scheme.variants.items():
        if build_options(scheme, opts) == cfg.options:
            return label
    default = scheme.Options()
    changed = [
        f"{f.name}={getattr(cfg.options, f.name)}"
        for f in dataclasses.fields(cfg.options)
        if getattr(cfg.options, f.name) != getattr(default, f.name)
    ]
    return f"{cfg.scheme}({','.join(changed)})" if changed else cfg.scheme


@dataclass(frozen=True)
class NativeHook:
    """A scheme-specific per-token hook whose token mean the probe stores as a trace variable.

    ``hook`` fires once per consumer ``layer`` (a consumer label); the tensor is
    [batch, pos, *dims] and becomes variable ``name`` with dims (layer, *dims).
    """

    name: str
    hook: str
    layer: str
    dims: tuple[str, ...] = ()
    # a source label: the hook carries the parts of that source's write [batch, pos, part, d_model];
    # the probe checks they add up to it and keeps the token mean of <part, write> per part
    parts_of: str | None = None
    # with ``parts_of``, a module path: the parts as they are before this linear map (no bias), whose
    # image of their sum is the write; the probe maps once, not each part (<W t, w> = <t, W^T w>)
    project: str | None = None
