"""Adapter for lucidrains' ``hyper-connections`` package (0.4.11): HC, mHC (v1) and mHCv2 modules
used anywhere inside a user's own network.

The package is a module library: the user expands the embedding into n residual streams
(``expand_stream``), wraps each branch (attention, MLP, ...) in one of its modules and sums the
streams at the end (``reduce_stream``). Three classes are read:

* ``hyper_connections.HyperConnections``: Hyper-Connections (arXiv 2409.19606), static + dynamic;
* ``hyper_connections.mHC`` (``ManifoldConstrainedHyperConnections``, file
  ``manifold_constrained_hyper_connections.py``): mHC (arXiv 2512.24880), streams folded into the
  batch [(batch stream), pos, d_model] like HC;
* ``hyper_connections.mHCv2.ManifoldConstrainedHyperConnections``: mHC keeping the stream dim,
  [batch, pos, stream, d_model].

Every module computes, per token, from the streams h_s (s = 1..n) and H_bar = norm(h_s) (the
package's per-stream RMSNorm with gain ``gamma + 1``; its output is hooked, not recomputed):

    HC:    alpha = tanh(H_bar W_alpha) s_alpha + A_static       [stream, 1 + stream]
           beta  = tanh(H_bar w_beta) s_beta + b_static          [stream]
           H_pre = alpha[:, 0],  H_res = alpha[:, 1:],  H_post = beta
    mHC:   alpha_p = (H_bar W_alpha[p]) (s_pre | s_res ... s_res) + A_static    per proposal p
           H_pre = mean_p sigmoid(alpha_p[:, 0]),  H_res = mean_p Sinkhorn(alpha_p[:, 1:])
           H_post = 2 sigmoid((H_bar w_beta) s_post + b_static)

(``tanh`` only when the module was built with ``tanh=True``, the default.) Sinkhorn is the
module's own ``residual_mix_constraint_fn``: exp(logits - max over the source stream), then, as
many times as the module's ``sinkhorn_iters`` (default 20), normalise the sums over the source
stream, then over the target stream; or the log-domain form (``log_domain_sinkhorn=True``,
alternating log-softmaxes, then exp); with zero iterations v1 returns exp(logits - max) and v2
the logits themselves, as the package does. The branch input is x = sum_s H_pre[s] h_s and the
streams become h'_t = sum_s H_res[s, t] h_s + H_post[t] f(x).

Mapping to the delta basis (research note ``implementations.md`` Sec. 6.1, 6.2 and 7): the
streams start as copies of the embedding, so ``streams.StreamUnroll`` tracks per token the
coefficients C [batch, pos, stream, source]; a branch reads sum_s H_pre[s] C[s, :], its write
makes C <- H_res^T C and appends the column H_post for its output, and the read-out (the streams
summed, as the package's ``reduce_stream`` does) reads sum_s C[s, :]. Weights are unrolled in
float64 and exact per token; the engine checks every consumer's input against them on every
batch. H_pre and H_res are recomputed, in float64, from the hooked norm output and the module's
parameters; H_post is the ``beta`` the module's width connection hands its depth connection (its
own value, not a recomputation). Native per-token quantities, token means per consumer, in the
source-row convention of ``StreamUnroll`` (H_res[s, t] carries stream s into stream t), for HC
and mHC alike: ``hc_pre`` (layer, stream), ``hc_res`` (layer, stream_from, stream_to),
``hc_post`` (layer, stream).

Layout: sources are ``embed`` (the streams' initial content), then, if the network has a
``StreamEmbed`` that runs, one source per stream ``stream_embed.{s}`` (its learned vector e_s;
stream s starts as embed + e_s, so each is a source of its own with coefficient 1 on its stream
only), then each wrapped branch's output in execution order. Consumers are each branch's input
(the width connection's output), then ``readout`` (the output of the einops ``Reduce`` that sums
the streams). Branches are labelled ``{i}.attn`` / ``{i}.mlp`` when they alternate attention,
MLP, attention, ... as in a transformer; otherwise ``{k}.branch`` with kind ``attn``, ``mlp`` or,
when neither can be told, ``block``. Attention or MLP is told from the branch's class name, then
the module's own path (``attn_hc``, ``ff_hc`` ...), then the class names inside the branch.

Choices where the package leaves room:

* execution order is the order in which the modules first run on a probe forward at build time
  (``model(tokens)`` on 4 tokens of id 0); a model that cannot be called that way (users who pass
  ``capture(..., forward=fn)``) falls back to registration order, and the capture refuses a batch
  in which the modules run in another order. A module that runs twice per forward (shared across
  depth) is refused;
* the embedding source is taken from the first module's input streams (stream 0, minus e_0 when
  a ``StreamEmbed`` runs): exactly what the streams start from, whatever module built them; a
  network that puts something else into the streams is refused by the residual check;
* the branch input and output are read by wrapping the module's ``width_connection`` and
  ``depth_connection`` for the duration of the capture (instance attributes, removed in the
  ``finally``): the one place that sees them in all three ways the package lets a module be used
  (``branch=``, the returned ``add_residual`` function, ``decorate_branch``);
* fractional connections (Frac-Connections, arXiv 2503.14125: ``HyperConnections`` with
  ``num_fracs`` = F > 1) are read exactly, as the package computes them: the streams and the
  branch output are cut into F fractions of d_model / F features, unit (f, s) is fraction f of
  stream s, and

      x_g    = sum_{f, s} alpha[f, s, g, 0] h_{f, s}                          fraction g of the input
      h'_{g, t} = sum_{f, s} alpha[f, s, g, 1 + t] h_{f, s} + sum_f beta[f, t, g] y_f

  (alpha [frac, stream, frac, 1 + stream] from the norm of each unit, as above but per unit;
  beta [frac, stream, frac], its own value; y_f fraction f of the branch output: the package mixes
  output fractions into every place). A term is then a source's fractions mixed, so the weights
  are the engine's block weights [batch, pos, frac, source, frac] (``probes.terms.block_terms``),
  unrolled per token by ``FracUnroll``; the native rows are ``frac_pre`` (layer, frac_from,
  stream_from, frac_to), ``frac_res`` (layer, frac_from, stream_from, frac_to, stream_to) and
  ``frac_post`` (layer, frac_from, stream_to, frac_to), every module of a network having the same F;
* refused, with one line: fractional mHC and mHCv2 modules, several input views
  (``num_input_views`` > 1), ``add_branch_out_to_residual=False``, a custom ``depth_residual_fn``,
  a ``residual_transform``, ``channel_first``, a custom or Triton Sinkhorn, the attention-pool
  read-out, inputs that are not token sequences, and networks without a summing ``reduce_stream``
  module;
* the context length is not a property of such a network: ``CTX`` (4096) bounds the windows and
  the user's token tensor sets them; the vocabulary is that of the first ``nn.Embedding``.

Legend: batch, pos, d_model, stream (one of the n residual streams), source (embedding, stream
embeddings, then branch outputs in execution order).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import inspect
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from depthscope.errors import DepthscopeError, TraceError
from depthscope.probes.adapters.base import Adapter, Callback, ConsumerSpec, NativeSpec, SourceSpec, router
from depthscope.probes.adapters.family import Family
from depthscope.probes.adapters.streams import StreamUnroll
from depthscope.schemes import names
from depthscope.trace.labels import Kind

NAME = "hyper-connections"
PACKAGE = "hyper-connections"
VERSION = "0.4.11"
CTX = 4096  # a module library has no context length: windows are bounded by this, set by the tokens
PROBE_TOKENS = 4  # length of the probe forward that finds the execution order
NO_VOCAB = 2**31 - 1  # a network without nn.Embedding: token ids are not checked
NATIVE = (("hc_pre", ("stream",)), ("hc_res", ("stream_from", "stream_to")), ("hc_post", ("stream",)))
NATIVE_FRAC = (
    ("frac_pre", ("frac_from", "stream_from", "frac_to")),
    ("frac_res", ("frac_from", "stream_from", "frac_to", "stream_to")),
    ("frac_post", ("frac_from", "stream_to", "frac_to")),
)
TITLES = {"hc": "HC", "mhc": "mHC", "mhcv2": "mHCv2"}
SUM_PATTERNS = ("(bs)...->b...", "...sd->...d")  # reduce_stream of HC / mHC v1, and of mHCv2
ATTN_WORDS = ("attention", "attn")
MLP_WORDS = ("feedforward", "feed_forward", "mlp", "ffn")
WRAPPED = ("width_connection", "depth_connection")  # methods seen through instance attributes
HINT = (
    " (hyper-connections: run the network in eager mode, start the streams as copies of the embedding and "
    "sum them with reduce_stream)"
)


@dataclass(frozen=True)
class Connection:
    """One of the package's modules, as a consumer (its branch input) and a source (its branch output)."""

    path: str
    module: nn.Module
    variant: str  # "hc", "mhc" (v1) or "mhcv2"
    label: str
    kind: Kind


@dataclass(frozen=True)
class Plan:
    """What a capture of one network reads, in execution order."""

    connections: tuple[Connection, ...]
    streams: int
    fracs: int  # F: the fractions of Frac-Connections (1: none)
    readout: str  # path of the einops Reduce that sums the streams
    readout_module: nn.Module
    stream_embed: nn.Module | None
    order: str  # how the execution order was found: "probe forward" or "registration"


def _classes() -> dict[type, str]:
    """The package's module classes, by variant; empty if the package is not installed."""
    try:
        from hyper_connections import HyperConnections, ManifoldConstrainedHyperConnections
    except ImportError:
        return {}
    found = {HyperConnections: "hc", ManifoldConstrainedHyperConnections: "mhc"}
    try:  # mHCv2 needs torch-einops-utils as well
        from hyper_connections.mHCv2 import ManifoldConstrainedHyperConnections as V2
    except ImportError:  # pragma: no cover - a dependency of the package
        return found
    return {**found, V2: "mhcv2"}


def _found(model: Any) -> list[tuple[str, nn.Module, str]]:
    """(path, module, variant) of every HC / mHC / mHCv2 module, in registration order."""
    classes = _classes()
    if not classes or not isinstance(model, nn.Module):
        return []
    return [(p, m, classes[type(m)]) for p, m in model.named_modules() if type(m) in classes]


def detect(model: Any) -> bool:
    """Whether ``model`` holds any of the package's HC, mHC or mHCv2 modules."""
    return bool(_found(model))


def _of_package(fn: Any, *function_names: str) -> bool:
    module, name = getattr(fn, "__module__", None) or "", getattr(fn, "__name__", "")
    return module.startswith("hyper_connections") and name in function_names


def _sinkhorn_options(module: nn.Module) -> tuple[int, bool] | None:
    """(iterations, log domain) of an mHC module's own Sinkhorn; None for a custom or Triton one."""
    fn = module.residual_mix_constraint_fn
    if not isinstance(fn, functools.partial) or fn.args:
        return None
    if not _of_package(fn.func, "sinkhorn_knopps", "log_domain_sinkhorn_knopps"):
        return None
    iters = fn.keywords.get("iters", inspect.signature(fn.func).parameters["iters"].default)
    return int(iters), fn.func.__name__.startswith("log_domain")


def _refusal(path: str, m: nn.Module, variant: str) -> str | None:
    """Why the module at ``path`` cannot be read, or None."""
    where = f"{type(m).__name__} at {path or '<root>'}"
    if m.num_fracs != 1 and variant != "hc":
        return (
            f"{where} uses fractional connections (num_fracs={m.num_fracs}), which this adapter reads for "
            "HyperConnections only"
        )
    if m.num_input_views != 1:
        return f"{where} has {m.num_input_views} input views, which this adapter does not read"
    if not m.add_branch_out_to_residual:
        return f"{where} does not add its branch output to the streams (add_branch_out_to_residual=False)"
    if not _of_package(m.depth_residual_fn, "add"):
        return f"{where} has a custom depth_residual_fn, which this adapter does not read"
    if getattr(m, "channel_first", False):
        return f"{where} is channel-first, which this adapter does not read"
    if not isinstance(getattr(m, "residual_transform", nn.Identity()), nn.Identity):
        return f"{where} has a residual_transform, which this adapter does not read"
    if variant == "hc" and not isinstance(m.act, nn.Tanh | nn.Identity):
        return f"{where} has an activation {type(m.act).__name__} other than the package's tanh or identity"
    if variant != "hc" and _sinkhorn_options(m) is None:
        return (
            f"{where} has a custom or Triton residual_mix_constraint_fn; capture with the package's Sinkhorn"
        )
    return None


def _readouts(model: nn.Module, streams: int) -> list[tuple[str, nn.Module]]:
    """The einops ``Reduce`` modules that sum the streams, as the package's ``reduce_stream``."""
    from einops.layers.torch import Reduce

    found = []
    for path, m in model.named_modules():
        if isinstance(m, Reduce) and m.reduction == "sum" and re.sub(r"\s", "", m.pattern) in SUM_PATTERNS:
            if m.axes_lengths.get("s", streams) == streams:
                found.append((path, m))
    return found


def _stream_embeds(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [
        (p, m)
        for p, m in model.named_modules()
        if type(m).__name__ == "StreamEmbed" and type(m).__module__.startswith("hyper_connections")
    ]


def _vocab(model: nn.Module) -> int:
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return int(m.num_embeddings)
    return NO_VOCAB


def _probe(model: nn.Module, watched: list[nn.Module]) -> list[int] | None:
    """Indices into ``watched`` in the order they run on one forward of ``model`` (repeats kept);
    None if the network cannot be called as ``model(tokens)``.
    """
    fired: list[int] = []
    handles = [m.register_forward_hook(lambda *_, i=i: fired.append(i)) for i, m in enumerate(watched)]
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, PROBE_TOKENS, dtype=torch.long, device=device))
    except Exception:  # any failure of the user's forward: fall back to registration order
        return None
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return fired


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def _says(name: str) -> Kind | None:
    """The kind a class name or module path names, if any."""
    low = name.lower()
    if any(w in low for w in ATTN_WORDS):
        return names.ATTN
    if any(w in low for w in MLP_WORDS) or "ff" in _words(name):
        return names.MLP
    return None


def _kind(path: str, module: nn.Module) -> Kind | None:
    """Attention or MLP: the branch's class, then the module's own name (the last part of its path
    that is not a list index), then the classes inside the branch.
    """
    branch = getattr(module, "branch", None)
    if branch is not None and (kind := _says(type(branch).__name__)):
        return kind
    own = [part for part in path.split(".") if not part.isdigit()]  # its name, not its list index
    if own and (kind := _says(own[-1])):
        return kind
    if branch is not None:
        inner = [_says(type(m).__name__) for m in branch.modules()]
        for kind in (names.ATTN, names.MLP):
            if kind in inner:
                return kind
    return None


def _labels(kinds: list[Kind | None]) -> list[tuple[str, Kind]]:
    """``{i}.attn`` / ``{i}.mlp`` for a transformer's alternation, else ``{k}.branch``."""
    if len(kinds) % 2 == 0 and kinds == [names.ATTN, names.MLP] * (len(kinds) // 2):
        return [(names.label(k // 2, kind), kind) for k, kind in enumerate(kinds)]
    return [(f"{k}.branch", kind or names.BLOCK) for k, kind in enumerate(kinds)]


def _order(model: nn.Module, found, readouts, embeds) -> tuple[list[int], int, list[int], str]:
    """Execution order of the modules, the read-out chosen, the stream embeddings that run, and how
    the order was found.
    """
    watched = [m.norm for _, m, _ in found] + [m for _, m in readouts] + [m for _, m in embeds]
    fired = _probe(model, watched)
    n, r = len(found), len(readouts)
    if fired is None:
        return list(range(n)), r - 1, list(range(len(embeds))), "registration"
    order = [i for i in fired if i < n]
    for i in set(order):
        if order.count(i) > 1:
            raise DepthscopeError(
                f"{found[i][0]} runs {order.count(i)} times in one forward (shared across depth): "
                "this adapter reads each module once"
            )
    if not order:
        raise DepthscopeError("no hyper-connections module ran on a probe forward of the network")
    last = fired.index(order[-1])
    after = [i - n for i in fired[last:] if n <= i < n + r]
    ran_embeds = sorted({i - n - r for i in fired if i >= n + r})
    return order, after[-1] if after else -1, ran_embeds, "probe forward"


def plan(model: Any) -> Plan:
    """What a capture reads in ``model``, or a DepthscopeError saying why it cannot."""
    found = _found(model)
    if not found:
        raise DepthscopeError(
            f"no hyper-connections module (HyperConnections, mHC, mHCv2) in the {type(model).__name__}"
        )
    for path, m, variant in found:
        if why := _refusal(path, m, variant):
            raise DepthscopeError(why)
    counts = {m.num_residual_streams for _, m, _ in found}
    if len(counts) != 1:
        raise DepthscopeError(
            f"hyper-connections modules disagree on the number of streams: {sorted(counts)}"
        )
    streams = counts.pop()
    fracs = {m.num_fracs for _, m, _ in found}
    if len(fracs) != 1:
        raise DepthscopeError(
            f"hyper-connections modules disagree on the number of fractions: {sorted(fracs)}"
        )
    readouts = _readouts(model, streams)
    if not readouts:
        pool = any(type(m).__name__ == "AttentionPoolReduceStream" for m in model.modules())
        raise DepthscopeError(
            "the attention-pool read-out (AttentionPoolReduceStream) is not supported: sum the streams"
            if pool
            else "no reduce_stream module (an einops Reduce summing the streams) among the network's "
            "modules: register the package's reduce_stream as a submodule"
        )
    embeds = _stream_embeds(model)
    order, readout, ran_embeds, how = _order(model, found, readouts, embeds)
    if readout < 0:
        raise DepthscopeError("no reduce_stream module runs after the last hyper-connections module")
    if len(ran_embeds) > 1:
        raise DepthscopeError("the network runs several StreamEmbed modules; this adapter reads one")
    stream_embed = embeds[ran_embeds[0]][1] if ran_embeds else None
    if stream_embed is not None and stream_embed.stream_embed.shape[0] != streams:
        raise DepthscopeError(
            f"the StreamEmbed has {stream_embed.stream_embed.shape[0]} streams, not {streams}"
        )
    ordered = [found[i] for i in order]
    labels = _labels([_kind(path, m) for path, m, _ in ordered])
    return Plan(
        connections=tuple(
            Connection(path, m, variant, label, kind)
            for (path, m, variant), (label, kind) in zip(ordered, labels)
        ),
        streams=streams,
        fracs=fracs.pop(),
        readout=readouts[readout][0],
        readout_module=readouts[readout][1],
        stream_embed=stream_embed,
        order=how,
    )


def _initial_sources(p: Plan) -> list[str]:
    extra = [f"stream_embed.{s}" for s in range(p.streams)] if p.stream_embed is not None else []
    return [names.EMBED, *extra]


def _config(p: Plan) -> dict[str, Any]:
    per_module = []
    for c in p.connections:
        m = c.module
        entry: dict[str, Any] = {"path": c.path, "variant": c.variant, "label": c.label}
        if c.variant == "hc":
            entry["tanh"] = isinstance(m.act, nn.Tanh)
        else:
            iters, log_domain = _sinkhorn_options(m)
            entry.update(
                sinkhorn_iters=iters,
                log_domain_sinkhorn=log_domain,
                dynamic_alpha_proposals=int(m.num_dynamic_alpha_proposals),
            )
            if c.variant == "mhcv2":
                entry["mix_streams_before_norm"] = m.maybe_mix_streams is not None
        per_module.append(entry)
    return {
        "streams": p.streams,
        "fracs": p.fracs,
        "modules": per_module,
        "readout": p.readout,
        "stream_embed": p.stream_embed is not None,
        "order": p.order,
    }


def build(model: Any) -> Adapter:
    """The adapter of a network using the package's modules, from its ``plan``: weights unrolled per token
    from the streams, the read-out the streams summed; DepthscopeError for a network it cannot read.
    """
    p = plan(model)
    initial = _initial_sources(p)
    srcs = [SourceSpec(label, label, names.EMBED, 0) for label in initial]
    cons, native = [], []
    for k, c in enumerate(p.connections):
        cons.append(ConsumerSpec(c.label, f"{c.path}:in", c.kind, k + 1, len(srcs), f"{c.path}:weights"))
        kept = NATIVE if p.fracs == 1 else NATIVE_FRAC
        native += [NativeSpec(name, f"{c.path}:{name}", c.label, dims) for name, dims in kept]
        srcs.append(SourceSpec(c.label, f"{c.path}:out", c.kind, k + 1))
    n = len(p.connections)
    cons.append(ConsumerSpec(names.READOUT, "readout:in", names.READOUT, n + 1, len(srcs), "readout:weights"))
    variants = list(dict.fromkeys(c.variant for c in p.connections))
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - plan() needs the package
        version = VERSION
    variant = "+".join(variants)
    return Adapter(
        family=NAME,
        sources=srcs,
        consumers=cons,
        attrs={
            "scheme": "hc" if variants == ["hc"] else "mhc" if "hc" not in variants else "hc+mhc",
            "variant": variant,
            "label": f"hyper-connections {version}: {'+'.join(TITLES[v] for v in variants)}"
            + (f" ({p.fracs} fractions)" if p.fracs > 1 else ""),
            "config": json.dumps(_config(p), sort_keys=True),
            "readout": "streams summed",
            "execution_order": p.order,
        },
        ctx=CTX,
        vocab=_vocab(model),
        native=native,
        attach=lambda _model, taps: _attach(p, taps),
        hint=HINT,
    )


# --- the per-token stream matrices, recomputed (float64) ---------------------------------------


def sinkhorn(logits: Tensor, iters: int, log_domain: bool, raw_without_iters: bool) -> Tensor:
    """The package's Sinkhorn over the last two dims (source stream, target stream): normalise
    the sums over the source stream, then over the target stream, ``iters`` times.

    Args:
        raw_without_iters: with ``iters`` <= 0 return the logits themselves (mHCv2), not their
            exponential (mHC v1).
    """
    if iters <= 0 and raw_without_iters:
        return logits
    if log_domain:
        for _ in range(iters):
            logits = F.log_softmax(logits, dim=-2)
            logits = F.log_softmax(logits, dim=-1)
        return logits.exp()
    m = (logits - logits.amax(dim=-2, keepdim=True)).exp()
    for _ in range(iters):  # F.normalize(p=1) of the package: the sum, clamped at 1e-12
        m = m / m.sum(dim=-2, keepdim=True).clamp_min(1e-12)
        m = m / m.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return m


def _onto(x: Tensor, w: Tensor) -> Tensor:
    """``x @ w`` for ``w`` [d, k] of a few columns (a dynamic alpha's projection), computed with those
    columns as the rows of a linear map: BLAS is several times faster so on a CPU (3.4x measured for
    [8192, 256] @ [256, 5] on one thread). The sums run in another order than the model's own
    ``normed @ fn``, so the two agree to the dtype's rounding, not bit for bit.
    """
    return F.linear(x, w.mT.contiguous())


def pre_and_res(c: Connection, normed: Tensor) -> tuple[Tensor, Tensor]:
    """H_pre [batch, pos, stream] and H_res [batch, pos, stream, stream] of ``c`` from its norm's
    output ``normed`` [batch, pos, stream, d_model], in float64 from the projection onto the
    dynamic alpha as the model computes it (in its dtype: a float64 copy of the normed streams
    cost more than the rest of the read).
    """
    m, x = c.module, normed
    fn, static = m.dynamic_alpha_fn.to(x.dtype), m.static_alpha.double()  # [(proposal,) d, 1 + s], [s, 1 + s]
    if c.variant == "hc":
        z = _onto(x, fn).double()
        z = torch.tanh(z) if isinstance(m.act, nn.Tanh) else z
        alpha = z * m.dynamic_alpha_scale.double() + static
        return alpha[..., 0], alpha[..., 1:]
    streams = static.shape[0]
    scale = torch.cat([m.pre_branch_scale.double(), m.residual_scale.double().expand(streams)])
    alpha = torch.stack([_onto(x, f) for f in fn]).double() * scale + static  # per proposal k
    iters, log_domain = _sinkhorn_options(m)
    res = sinkhorn(alpha[..., 1:], iters, log_domain, raw_without_iters=c.variant == "mhcv2")
    return alpha[..., 0].sigmoid().mean(0), res.mean(0)


def frac_pre_and_res(c: Connection, normed: Tensor) -> tuple[Tensor, Tensor]:
    """Frac-Connections: alpha's read part [batch, pos, frac, stream, frac] and stream part
    [batch, pos, frac, stream, frac, stream] of ``c`` from its norm's output ``normed`` [batch, pos,
    frac, stream, d_model / F] (unit (f, s)), in float64. The static alpha's rows are the units
    f-major, its columns F groups of 1 + streams, as the package lays them out. The projection is
    computed in the model's dtype, as in ``pre_and_res``.
    """
    m, x = c.module, normed
    fracs, streams = m.num_fracs, m.num_residual_streams
    z = _onto(x, m.dynamic_alpha_fn.to(x.dtype)).double()
    z = torch.tanh(z) if isinstance(m.act, nn.Tanh) else z
    static = m.static_alpha.double().reshape(fracs, streams, -1)
    alpha = (z * m.dynamic_alpha_scale.double() + static).unflatten(-1, (fracs, 1 + streams))
    return alpha[..., 0], alpha[..., 1:]


class FracUnroll:
    """The coefficients C [batch, pos, frac, stream, source, frac] of Frac-Connections: unit (f, s)
    holds sum_{j, g} C[f, s, j, g] times fraction g of source j. Reads give block weights
    [batch, pos, frac, source, frac]; a write mixes the units and appends beta, transposed to
    (target fraction, stream, source fraction), for the new source.
    """

    def __init__(self, coef: Tensor):
        self.coef = coef

    @classmethod
    def start(cls, batch_pos: tuple[int, int], fracs: int, streams: int, embeds: bool, device) -> FracUnroll:
        """Every stream a copy of the embedding, fraction by fraction; with ``embeds`` a source per
        stream embedding, in its own stream only.
        """
        eye = torch.eye(fracs, dtype=torch.float64)
        init = eye[:, None, None, :].expand(fracs, streams, 1, fracs)  # [frac, stream, source, frac]
        if embeds:
            own = torch.eye(streams, dtype=torch.float64)[None, :, :, None] * eye[:, None, None, :]
            init = torch.cat([init, own], dim=2)
        return cls(init.to(device).expand(*batch_pos, *init.shape).clone())

    def read(self, pre: Tensor) -> Tensor:
        """Block weights of the read ``pre`` [batch, pos, frac, stream, frac (of the input)]."""
        return torch.einsum("bpisf,bpisjg->bpfjg", pre.to(self.coef), self.coef)

    def write(self, res: Tensor, post: Tensor) -> None:
        """C <- the units mixed by ``res`` [batch, pos, frac, stream, frac, stream]; then ``post``
        [batch, pos, frac (of the output), stream, frac] as the new source's column.
        """
        coef = torch.einsum("bpisft,bpisjg->bpftjg", res.to(self.coef), self.coef)
        column = post.to(coef).permute(0, 1, 4, 3, 2).unsqueeze(-2)  # [batch, pos, frac, stream, 1, frac]
        self.coef = torch.cat([coef, column], dim=-2)

    def readout(self) -> Tensor:
        """The read-out's block weights: the streams summed, fraction by fraction."""
        return self.coef.sum(3)


# --- capture -------------------------------------------------------------------------------------


class _Streams:
    """The unrolling of one forward, driven by the package's own calls, sent to the engine's taps."""

    def __init__(self, plan: Plan, send):
        self.plan, self.send = plan, send
        self.unroll: StreamUnroll | None = None
        self.normed: Tensor | None = None
        self.pending: tuple[int, Tensor, Tensor] | None = None  # (module, H_res, H_post) awaiting its write
        self.next = 0  # the module expected to run next
        self.read = False

    def _start(self, residuals: Tensor) -> None:
        """A new forward: the embedding (and stream embeddings) from the first module's input streams."""
        s = self.plan.streams
        if self.plan.connections[0].variant == "mhcv2":
            if residuals.ndim != 4:
                raise TraceError(
                    f"mHCv2 expects streams [batch, pos, stream, d_model], got {tuple(residuals.shape)}"
                )
            first = residuals[:, :, 0]
        else:
            if residuals.ndim != 3:
                raise TraceError(
                    "expected streams [(batch stream), pos, d_model] of token sequences, got "
                    f"{tuple(residuals.shape)}"
                )
            first = residuals.unflatten(0, (-1, s))[:, 0]
        init = torch.ones(s, 1, dtype=torch.float64)
        embed = self.plan.stream_embed
        if embed is not None:
            vectors = embed.stream_embed.detach().to(first.dtype)
            first = first - vectors[0]
            init = torch.cat([init, torch.eye(s, dtype=torch.float64)], dim=1)
        self.send(names.EMBED, first)
        if embed is not None:
            for j in range(s):
                self.send(f"stream_embed.{j}", vectors[j].expand_as(first))
        if self.plan.fracs > 1:
            self.unroll = FracUnroll.start(
                tuple(first.shape[:2]), self.plan.fracs, s, embed is not None, first.device
            )
        else:
            self.unroll = StreamUnroll.start(tuple(first.shape[:2]), s, init, device=first.device)
        self.next, self.pending, self.read = 0, None, False

    def on_norm(self, module, args, out) -> None:
        self.normed = out

    def width(self, k: int, residuals: Tensor, out) -> None:
        c = self.plan.connections[k]
        if k == 0:
            self._start(residuals)
        if k != self.next or self.pending is not None:
            raise TraceError(
                f"{c.path} ran out of the order found at build time ({self.plan.order}): "
                f"expected {self.plan.connections[min(self.next, len(self.plan.connections) - 1)].path}"
            )
        h, _, kwargs = out
        b, pos = h.shape[:2]
        if self.plan.fracs > 1:  # the norm's output is already [batch, pos, frac, stream, d_model / F]
            pre, res = frac_pre_and_res(c, self.normed)
            post = kwargs["beta"]  # [batch, pos, frac, stream, frac]
            names_ = ("frac_pre", "frac_res", "frac_post")
        else:
            pre, res = pre_and_res(c, self.normed.reshape(b, pos, self.plan.streams, -1))
            post = kwargs["beta"].reshape(b, pos, self.plan.streams)
            names_ = ("hc_pre", "hc_res", "hc_post")
        self.normed = None
        self.send(f"{c.path}:weights", self.unroll.read(pre).to(h.dtype))
        self.send(f"{c.path}:in", h)
        for name, value in zip(names_, (pre, res, post)):
            self.send(f"{c.path}:{name}", value)
        self.pending = (k, res, post)

    def depth(self, k: int, branch_output: Tensor) -> None:
        c = self.plan.connections[k]
        if self.pending is None or self.pending[0] != k:
            raise TraceError(f"{c.path} wrote its branch output without reading its streams first")
        _, res, post = self.pending
        self.send(f"{c.path}:out", branch_output)
        self.unroll.write(res, post)
        self.pending, self.next = None, k + 1

    def on_readout(self, module, args, out: Tensor) -> None:
        if self.read:
            return
        if self.next != len(self.plan.connections) or self.pending is not None:
            raise TraceError(
                f"the read-out {self.plan.readout} ran before every hyper-connections module wrote"
            )
        self.read = True
        self.send("readout:weights", self.unroll.readout().to(out.dtype))
        self.send("readout:in", out)


def _wrap(module: nn.Module, k: int, state: _Streams) -> None:
    """Let ``state`` see the module's width and depth connections (instance attributes)."""
    width, depth = module.width_connection, module.depth_connection

    def width_connection(residuals, *args, **kwargs):
        out = width(residuals, *args, **kwargs)
        state.width(k, residuals, out)
        return out

    def depth_connection(branch_output, *args, **kwargs):
        state.depth(k, branch_output)
        return depth(branch_output, *args, **kwargs)

    if any(name in module.__dict__ for name in WRAPPED):
        raise DepthscopeError(f"{type(module).__name__} is already wrapped: is another capture running?")
    module.width_connection, module.depth_connection = width_connection, depth_connection


@contextlib.contextmanager
def _attach(p: Plan, taps: list[tuple[str, Callback]]) -> Iterator[None]:
    state = _Streams(p, router(taps))
    handles, wrapped = [], []
    try:
        for k, c in enumerate(p.connections):
            handles.append(c.module.norm.register_forward_hook(state.on_norm))
            _wrap(c.module, k, state)
            wrapped.append(c.module)
        handles.append(p.readout_module.register_forward_hook(state.on_readout))
        yield
    finally:
        for h in handles:
            h.remove()
        for m in wrapped:
            for name in WRAPPED:
                m.__dict__.pop(name, None)


FAMILY = Family(
    name=NAME,
    reads=(
        "lucidrains hyper-connections HC / mHC / mHCv2 modules anywhere in a network: each module's norm "
        "output + parameters -> H_pre, H_res (recomputed), H_post (its beta) per token; M by unrolling the "
        "streams; HC's Frac-Connections (num_fracs > 1) as block weights over (fraction, stream) units"
    ),
    detect=detect,
    build=build,
    package=PACKAGE,
    version=VERSION,
)
