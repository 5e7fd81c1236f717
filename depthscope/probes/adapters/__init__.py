"""Model families as adapters, in one typed registry (``registry``): the built-in families (one
module each in this package), those other packages declare in the entry-point group
``depthscope.families``, and those user code adds with ``depthscope.register_family``.

A family (``registry.Family``) has a name (``capture(..., adapter=NAME)`` selects it), one line of
what it reads (``depthscope adapters`` prints it), the package and version it was written for,
the transformers model types it claims, a priority (families are tried in increasing priority,
then by name), ``detect(model) -> bool``, ``build(model) -> Adapter`` (``base.py``) and optionally
``from_saved(args)``. The generic transformers reader (``huggingface``) reads every transformers
decoder whose model type no family claims.

An installed version other than the one a family was written for gives a warning (and the trace
records both), never a silent misreading. A model no family detects is read by discovery or a
``ModelSpec`` (``spec.py``).
"""

from __future__ import annotations

import warnings
from typing import Any

from depthscope.errors import DepthscopeError, first_line
from depthscope.probes.adapters.base import Adapter, ConsumerSpec, NativeSpec, SourceSpec, installed_version
from depthscope.probes.adapters.registry import (
    Family,
    claimed,
    detect_safely,
    detecting,
    families,
    register_family,
    unregister_family,
)


def __getattr__(name: str) -> Any:
    if name == "FAMILIES":  # every registered family by name, as now registered
        return families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _built(family: Family, model: Any) -> Adapter:
    try:
        ad = family.build(model)
    except DepthscopeError:
        raise
    except Exception as err:  # a family's own code on a model it did not expect: one line, no traceback
        raise DepthscopeError(
            f"the {family.name} family cannot read this {type(model).__name__} "
            f"({type(err).__name__}: {first_line(err)})"
        ) from None
    package, pinned = family.package, family.version
    if package:
        have = installed_version(package)
        ad.attrs.update(package=package, package_version=have or "", adapter_written_for=pinned or "")
        if have != pinned:
            warnings.warn(
                f"{family.name}: the adapter was written for {package} {pinned}, installed is {have}; "
                "check the trace against the package's own computation",
                stacklevel=3,
            )
    return ad


def resolve(
    model: Any, adapter: str | Adapter | None = None, ctx: int | None = None, forward: Any = None
) -> Adapter:
    """The adapter of ``model``: the one given, the family named, the first family that detects it,
    or the spec discovery guesses (``suggest``; ``ctx``: the window length where the model does not say;
    ``forward``: how discovery runs the model).
    """
    if isinstance(adapter, Adapter):
        return adapter
    known = families()
    if adapter is not None:
        if adapter not in known:
            raise DepthscopeError(f"unknown adapter {adapter!r}; known: {', '.join(known)}")
        if not detect_safely(known[adapter], model):
            what = f"this {type(model).__name__}"
            raise DepthscopeError(
                f"the {adapter} family does not read {what}: it reads {known[adapter].reads}"
            )
        return _built(known[adapter], model)
    family = detecting(model)
    if family is not None:
        return _built(family, model)
    from depthscope.probes.adapters.spec import SPEC_COMMAND, build_spec
    from depthscope.probes.adapters.suggest import post_ln_spec, suggest_spec

    guessed = suggest_spec(model, forward, check=False).spec
    why = ""
    if guessed is not None:  # a plain module shaped like a decoder: read as the guessed spec says
        try:
            ad = build_spec(model, guessed, ctx=ctx)
            ad.attrs["spec_origin"] = "discovered"
            return ad
        except DepthscopeError as err:
            why = f"; read as {_short(guessed)}: {str(err).removeprefix('ModelSpec: ')}"
    # not a sum of its writes: a post-LN model, read through its norms?
    post = post_ln_spec(model, forward)
    if post is not None:
        ad = build_spec(model, post, ctx=ctx)
        ad.attrs["spec_origin"] = "discovered"
        return ad
    raise DepthscopeError(
        f"cannot capture a {type(model).__name__}: no adapter knows it (known families: {', '.join(known)})"
        f"{why}; name where it writes and reads with a ModelSpec: {SPEC_COMMAND}, in the model's own module "
        "names (docs/reference.md#modelspec)"
    )


def _short(spec: Any) -> str:
    """A spec in one line: ModelSpec(embed=[...], writes={...}, reads={...})."""
    d = spec.describe()
    return f"ModelSpec(embed={d['embed']}, writes={d['writes']}, reads={d['reads']})"


def describe() -> list[dict[str, str]]:
    """Every family: name, what it reads, the package and version it was written for, what is installed."""
    return [
        {
            "family": f.name,
            "reads": f.reads,
            "package": f.package or "-",
            "written_for": f.version or "-",
            "installed": installed_version(f.package) or "-",
        }
        for f in families().values()
    ]


__all__ = [
    "FAMILIES",
    "Adapter",
    "ConsumerSpec",
    "Family",
    "NativeSpec",
    "SourceSpec",
    "claimed",
    "describe",
    "detecting",
    "families",
    "register_family",
    "resolve",
    "unregister_family",
]
