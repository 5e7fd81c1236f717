"""Adapter for any Hugging Face ``transformers`` decoder whose layers add their sublayers' writes to
one stream: a table of layouts for the common families, discovery for the rest.

Plain PyTorch hooks on the model's own modules (no wrapper, so a capture costs little more than a
forward). Sources are the token embedding (and a learned position embedding as its own source),
then every sublayer's write: an attention, MLP (a MoE block's output is one write) or state-space /
convolution / linear-attention mixer (kind ``ssm``), or the norm on a branch's output where there is
one (gemma2/3, olmo2/3: what is added is the post-norm output). Consumers are the inputs of the
modules that read the stream: each sublayer's input norm (or the sublayer itself where it has none)
and the final norm (the read-out); a view of the stream, so replacing one changes only what that
sublayer reads. A norm shared by parallel sublayers (phi, gptj, cohere, falcon) is one input, one
consumer (labelled by the first of them); a parallel residual's second sublayer does not see the
first's write. Writes and embeddings scaled in the forward (granite's ``residual_multiplier`` and
``embedding_multiplier``, minicpm3's ``scale_depth / sqrt(L)``, falcon_h1's multipliers) are static
weights of the consumers on those sources; a scale inside the embedding module (gemma) is part of
the source.

How a model is read is a ``structure.Plan``: a row of ``LAYOUTS`` (module paths and a few structural
switches) for the model types it names, else ``structure.discover``. Either is written as a
``ModelSpec`` (``spec_of``: what ``depthscope spec`` prints) and the adapter is built from that spec
as any spec's is (``spec.build_spec``, its weights given by the plan, not found), which checks it on
the probe forward: a model that is not the sum of its writes is refused naming the first consumer
that is not. The engine checks the rebuild on every batch as for every family.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from depthscope.errors import DepthscopeError, first_line
from depthscope.probes.adapters import post_ln
from depthscope.probes.adapters.base import (
    Adapter,
    Head,
    config_value,
    config_values,
    head_of,
)
from depthscope.probes.adapters.family import Family
from depthscope.probes.adapters.hf import as_family, input_embedding, model_name, pretrained
from depthscope.probes.adapters.spec import SPEC_COMMAND, ModelSpec, build_spec
from depthscope.probes.adapters.structure import (
    Embed,
    Plan,
    Probe,
    Refused,
    Step,
    Sublayer,
    discover,
    error,
    layer_calls,
    tap_value,
)
from depthscope.trace.labels import ATTN, EMBED, MLP, READOUT, SSM, Kind, label

NAME = "huggingface"
Scale = Callable[[Any], float]  # a static scale from the (text) config


def _attr(name: str) -> Scale:
    return lambda cfg: float(getattr(cfg, name))


@dataclass(frozen=True)
class Branch:
    """One sublayer of a layer, by module names relative to the layer."""

    kind: Kind
    module: str  # the sublayer; a layer without it (a hybrid's other kind of layer) skips it
    read: tuple[str, ...] = ()  # its input norm: the first the layer has; () = the sublayer reads the stream
    out: str | None = None  # a norm on its output: that is what is added
    scale: Scale | None = None  # its write is added times this


@dataclass(frozen=True)
class DecoderLayout:
    """Module paths of one architecture: the layer list (candidates, relative to the model), the
    embeddings and the final norm (relative to the layer list's parent), and the steps of a layer:
    the branches of one step read the same stream and are added together.
    """

    layers: tuple[str, ...]
    embed: str
    readout: str
    steps: tuple[tuple[Branch, ...], ...]
    positions: str | None = None  # a learned position embedding, added to the token embedding
    parallel: Callable[[Any], bool] | None = None  # a config switch that puts every branch in one step
    embed_scale: Scale | None = None  # the embedding is added times this (in the forward)


MODEL = ("model.layers", "model.language_model.layers")  # a *ForCausalLM, a *ForConditionalGeneration


def _llama(attn: str = "self_attn", mlp: str = "mlp", scale: Scale | None = None, **kw) -> DecoderLayout:
    return DecoderLayout(
        layers=MODEL,
        embed="embed_tokens",
        readout="norm",
        steps=(
            (Branch(ATTN, attn, ("input_layernorm",), scale=scale),),
            (Branch(MLP, mlp, ("post_attention_layernorm",), scale=scale),),
        ),
        **kw,
    )


def _sandwich(pre_mlp: str, post_attn: str, post_mlp: str, read_attn: tuple[str, ...]) -> DecoderLayout:
    """A norm on each branch output (and on its input where ``read_*`` names one)."""
    return DecoderLayout(
        layers=MODEL,
        embed="embed_tokens",
        readout="norm",
        steps=(
            (Branch(ATTN, "self_attn", read_attn, out=post_attn),),
            (Branch(MLP, "mlp", (pre_mlp,) if pre_mlp else (), out=post_mlp),),
        ),
    )


def _parallel(base, embed, readout, norm, attn="self_attn", mlp="mlp") -> DecoderLayout:
    """Attention and MLP both read the layer's input through one norm and are added together."""
    return DecoderLayout(
        layers=base,
        embed=embed,
        readout=readout,
        steps=((Branch(ATTN, attn, (norm,)), Branch(MLP, mlp, (norm,))),),
    )


def _gpt2(positions: str | None = "wpe") -> DecoderLayout:
    return DecoderLayout(
        layers=("transformer.h",),
        embed="wte",
        positions=positions,
        readout="ln_f",
        steps=((Branch(ATTN, "attn", ("ln_1",)),), (Branch(MLP, "mlp", ("ln_2",)),)),
    )


def _hybrid(attn: Scale | None = None, ssm: Scale | None = None, **kw) -> DecoderLayout:
    """Jamba-style layers: a mamba mixer or an attention (falcon_h1: both, in parallel), then an MLP."""
    return DecoderLayout(
        layers=MODEL,
        embed="embed_tokens",
        readout="final_layernorm",
        steps=(
            (
                Branch(SSM, "mamba", ("input_layernorm",), scale=ssm),
                Branch(ATTN, "self_attn", ("input_layernorm",), scale=attn),
            ),
            (Branch(MLP, "feed_forward", ("pre_ff_layernorm",)),),
        ),
        **kw,
    )


MAMBA = DecoderLayout(
    layers=("backbone.layers",),
    embed="embeddings",
    readout="norm_f",
    steps=((Branch(SSM, "mixer", ("norm",)),),),
)
LLAMA = _llama()
GEMMA2 = _sandwich(
    "pre_feedforward_layernorm",
    "post_attention_layernorm",
    "post_feedforward_layernorm",
    ("input_layernorm",),
)
OLMO2 = _sandwich("", "post_attention_layernorm", "post_feedforward_layernorm", ())
GPTJ = _parallel(("transformer.h",), "wte", "ln_f", "ln_1", attn="attn")
COHERE = _parallel(MODEL, "embed_tokens", "norm", "input_layernorm")
LAYOUTS: dict[str, DecoderLayout] = {
    **dict.fromkeys(
        (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen2_moe",
            "qwen3",
            "qwen3_moe",
            "deepseek_v2",
            "deepseek_v3",
            "starcoder2",
            "olmo",
            "olmoe",
            "internlm3",
            "exaone",
            "ernie4_5",
            "ernie4_5_moe",
            "hunyuan_v1_dense",
            "hunyuan_v1_moe",
            "gpt_oss",
            "glm",
            "glm4_moe",
            "phi3",
            "smollm3",
            "gemma",
            "helium",
            "granite_swa",
            "ministral",
            "seed_oss",
            "nemotron",
        ),
        LLAMA,
    ),
    "stablelm": DecoderLayout(
        layers=MODEL,
        embed="embed_tokens",
        readout="norm",
        steps=(
            (Branch(ATTN, "self_attn", ("input_layernorm",)),),
            (Branch(MLP, "mlp", ("post_attention_layernorm", "input_layernorm")),),
        ),
        parallel=lambda cfg: bool(cfg.use_parallel_residual),
    ),
    "granite": _llama(scale=_attr("residual_multiplier"), embed_scale=_attr("embedding_multiplier")),
    "granitemoe": _llama(
        mlp="block_sparse_moe", scale=_attr("residual_multiplier"), embed_scale=_attr("embedding_multiplier")
    ),
    "minicpm3": _llama(scale=lambda cfg: cfg.scale_depth / math.sqrt(cfg.num_hidden_layers)),
    "llama4": _llama(mlp="feed_forward"),
    "llama4_text": _llama(mlp="feed_forward"),
    **dict.fromkeys(("gemma2", "gemma3", "gemma3_text"), GEMMA2),
    **dict.fromkeys(("olmo2", "olmo3"), OLMO2),
    "glm4": _sandwich(
        "post_attention_layernorm", "post_self_attn_layernorm", "post_mlp_layernorm", ("input_layernorm",)
    ),
    **dict.fromkeys(("cohere", "cohere2"), COHERE),
    "phi": _parallel(MODEL, "embed_tokens", "final_layernorm", "input_layernorm"),
    **dict.fromkeys(("gptj", "codegen"), GPTJ),
    "falcon": DecoderLayout(
        layers=("transformer.h",),
        embed="word_embeddings",
        readout="ln_f",
        steps=(
            (Branch(ATTN, "self_attention", ("ln_attn", "input_layernorm")),),
            (Branch(MLP, "mlp", ("ln_mlp", "post_attention_layernorm", "input_layernorm")),),
        ),
        parallel=lambda cfg: bool(cfg.parallel_attn or cfg.new_decoder_architecture),
    ),
    **dict.fromkeys(("gpt2", "gpt_neo", "gpt_bigcode"), _gpt2()),
    "gpt_neox": DecoderLayout(
        layers=("gpt_neox.layers",),
        embed="embed_in",
        readout="final_layer_norm",
        steps=(
            (Branch(ATTN, "attention", ("input_layernorm",)),),
            (Branch(MLP, "mlp", ("post_attention_layernorm",)),),
        ),
        parallel=lambda cfg: bool(cfg.use_parallel_residual),
    ),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba"), MAMBA),
    **dict.fromkeys(("jamba", "bamba"), _hybrid()),
    "falcon_h1": _hybrid(
        attn=_attr("attention_out_multiplier"),
        ssm=_attr("ssm_out_multiplier"),
        embed_scale=_attr("embedding_multiplier"),
    ),
}


def detect(model: Any) -> bool:
    """Whether ``model`` is a transformers model (the registry leaves it the types no family claims)."""
    return pretrained(model)


def text_config(model: Any) -> Any:
    """The config of the language model (a multimodal model's ``text_config``)."""
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _module(model: Any, path: str) -> Any:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def layout_plan(model: Any, layout: DecoderLayout, name: str) -> Plan:
    """The plan a ``DecoderLayout`` row says for ``model``; Refused where the model lacks its modules."""
    cfg = text_config(model)
    path = next((p for p in layout.layers if isinstance(_module(model, p), torch.nn.ModuleList)), None)
    if path is None:
        raise Refused(f"no list of layers at {' or '.join(layout.layers)}")
    parent = path.rpartition(".")[0]
    scale = _from_config(layout.embed_scale, cfg, name) if layout.embed_scale else 1.0
    embeds = [Embed(EMBED, f"{parent}.{layout.embed}:out", scale)]
    if layout.positions:
        embeds.append(Embed("pos_embed", f"{parent}.{layout.positions}:out"))
    steps = layout.steps
    if layout.parallel is not None and _from_config(layout.parallel, cfg, name):
        steps = (tuple(b for step in steps for b in step),)
    layers = []
    for i in range(len(_module(model, path))):
        at = f"{path}.{i}"
        plan = tuple(Step(s) for s in (_step(model, at, i, step, cfg, name) for step in steps) if s)
        if not plan:
            raise Refused(f"layer {i} has none of the sublayers of the {name} layout")
        layers.append(plan)
    return Plan(path, tuple(embeds), tuple(layers), f"{parent}.{layout.readout}:in", f"layout {name}")


def _from_config(read: Callable[[Any], Any], cfg: Any, name: str) -> Any:
    """A layout's switch or scale, read from the config; Refused where the config will not give it
    (an attribute missing, or one of a per-layer config that refuses a global read).
    """
    try:
        return read(cfg)
    except Exception as err:  # noqa: BLE001 - whatever the config raises: the layout cannot be read
        raise Refused(
            f"the {name} layout reads its config, which refuses "
            f"({type(err).__name__}: {first_line(err, 120)})"
        ) from None


def _step(
    model: Any, at: str, i: int, step: tuple[Branch, ...], cfg: Any, name: str = ""
) -> tuple[Sublayer, ...]:
    subs = []
    for b in step:
        if _module(model, f"{at}.{b.module}") is None:
            continue
        read = next((f"{at}.{r}" for r in b.read if _module(model, f"{at}.{r}") is not None), None)
        if read is None and b.read:
            raise Refused(f"layer {i} has none of the input norms {', '.join(b.read)} of its {b.module}")
        write = f"{at}.{b.out or b.module}:out"
        scale = _from_config(b.scale, cfg, name) if b.scale else 1.0
        subs.append(Sublayer(read or f"{at}.{b.module}", write, b.kind, scale))
    return tuple(subs)


def plan_of(model: Any, probe: Probe) -> Plan:
    """The model's plan: its ``LAYOUTS`` row, else discovered (checked when its spec is built)."""
    model_type = getattr(model.config, "model_type", "")
    layout = LAYOUTS.get(model_type)
    if layout is not None:
        plan = layout_plan(model, layout, model_type)
    else:
        embedding = input_embedding(model)
        path = next((p for p, m in model.named_modules() if m is embedding), None) if embedding else None
        plan = discover(model, probe, path)
    return plan


def _vocab(model: Any) -> int:
    vocab = int(
        getattr(input_embedding(model), "num_embeddings", None)
        or config_value(text_config(model), "vocab_size")
        or 0
    )
    if vocab < 1:
        raise Refused(
            f"cannot read this {getattr(model.config, 'model_type', '')} model: neither its embedding nor "
            "its config gives a vocabulary"
        )
    return vocab


def plan_spec(model: Any) -> tuple[ModelSpec | None, str]:
    """The ModelSpec naming the modules this family reads of ``model`` (its checked plan, in the
    model's own paths, ``*`` for the layer index where one pattern names exactly the plan's modules),
    and how the plan was found; (None, why) where the plan is refused. A source that is a module's
    input, or a read of a module's output, is named with its ``:in`` or ``:out``; a per-layer
    embedding is a write under the key ``ple``; the weights a spec would not find as the plan has
    them are given (``static=``: ``_given``). The family builds from this spec (``build``), its other
    weights unit; read with ``--spec``, they are found from the activations (``build_spec``).
    """
    try:
        spec, plan, _, _ = _read(model)
    except DepthscopeError as err:  # the family's refusal
        return None, _unprefixed(err)
    return spec, plan.origin if plan is not None else "post-LN structure"


def spec_of(model: Any, plan: Plan, probe: Probe) -> ModelSpec:
    """A plan as the ModelSpec that reads it (checked when it is built: ``build_spec``); Refused where
    the layers that run are not the plan's, or a consumer reads a source written after its module runs.

    A step's writes are labelled as they ran (a layer writing two of one kind labels the second by its
    module's name: ``3.mlp.shared_mlp``); each distinct read of a stream is one consumer, labelled by
    the first write it feeds. A consumer's weights are those the plan gives its stream's sources
    (scaled writes; a step that scales the stream scales every earlier one), given as ``static=``
    over the sources a spec orders before it (as they return) where they are not all 1: a source
    written before one it reads but not read by it gets 0 (longcat_flash's shortcut MoE, computed
    from the first half-layer's stream and added at the layer's end), trailing ones are left out
    (gpt_neox's parallel MLP, whose norm runs after the attention has written).
    """
    writes, reads = _walk(plan, probe)
    static = _given(plan, probe, writes, reads)

    named = {p for p, _ in model.named_modules()}

    def patterns(paths: dict[int, str]) -> list[str]:
        rests = {p.removeprefix(f"{plan.layers}.{i}.") for i, p in paths.items()}
        star = f"{plan.layers}.*.{rests.pop()}" if len(rests) == 1 else None
        rx = star and re.compile("^" + re.escape(star).replace(r"\*", r"\d+") + "$")
        if rx and {p for p in named if rx.match(p)} == set(paths.values()):
            return [star]
        return list(paths.values())

    def by_key(rows, usual: str) -> dict[str, list[str]]:
        keyed: dict[str, dict[int, str]] = {}
        for lab, tap in rows:
            i, _, key = lab.partition(".")
            keyed.setdefault(key, {})[int(i)] = tap.removesuffix(usual)  # the tap where it is not the usual
        return {k: patterns(v) for k, v in keyed.items()}

    embeds = {e.label: e.tap.removesuffix(":out") for e in plan.embeds}
    default = [EMBED] + [f"{EMBED}.{p.rsplit('.', 1)[-1]}" for p in list(embeds.values())[1:]]
    embed = list(embeds.values()) if list(embeds) == default else embeds
    readout = {READOUT: [plan.readout.removesuffix(":in")]}
    keys = by_key(writes.items(), ":out"), by_key(((lab, tap) for lab, tap, _ in reads[:-1]), ":in") | readout
    ctx, vocab, name = _context(text_config(model)), _vocab(model), model_name(model)
    return ModelSpec(embed, *keys, ctx=ctx, vocab=vocab, label=name, static=static)


def _walk(plan: Plan, probe: Probe) -> tuple[dict[str, str], list[tuple[str, str, dict[str, float]]]]:
    """The plan's writes (label -> tap) and reads (label, tap, each source's weight in what it reads)."""
    ran = [k for k, _ in layer_calls(probe, plan.layers)]
    if tuple(ran) != plan.index():
        raise Refused(f"the layers that run are {ran}, not {list(plan.index())}")
    weights = {e.label: e.scale for e in plan.embeds}  # each source's weight in the stream so far
    writes: dict[str, str] = {}  # label -> tap
    reads: list[tuple[str, str, dict[str, float]]] = []  # (label, tap, its weights)
    for i, steps in zip(plan.index(), plan.steps):
        used: set[str] = set()
        start = lambda sub: probe.once(sub.write.rpartition(":")[0]).index  # noqa: E731
        ran_as = [[(sub, _label(i, sub, used)) for sub in sorted(st.subs, key=start)] for st in steps]
        fed: list[list[tuple[Sublayer, str]]] = [[] for _ in steps]  # the writes a read of each stream feeds
        for k, step in enumerate(ran_as):
            for sub, lab in step:
                fed[k - sub.back].append((sub, lab))
        for k, step in enumerate(steps):
            for read in dict.fromkeys(sub.read for sub, _ in fed[k]):
                lab = next(lab for sub, lab in fed[k] if sub.read == read)
                reads.append((lab, f"{read}:in", dict(weights)))
            weights = {lab: step.keep * w for lab, w in weights.items()}
            for sub, lab in ran_as[k]:
                writes[lab], weights[lab] = sub.write, sub.scale
    reads.append((READOUT, plan.readout, weights))
    return writes, reads


def _label(i: int, sub: Sublayer, used: set[str]) -> str:
    lab = f"{i}.ple" if sub.kind == EMBED else label(i, sub.kind)  # a per-layer embedding (gemma4)
    if lab in used:
        lab = f"{lab}.{sub.write.rpartition(':')[0].rsplit('.', 1)[-1]}"
    used.add(lab)
    return lab


def _given(plan: Plan, probe: Probe, writes: dict[str, str], reads) -> dict[str, tuple[float, ...]]:
    """Each read's weights over the sources a spec orders before it, where they are not all 1."""
    order = [e.label for e in plan.embeds] + sorted(writes, key=lambda lab: probe.when(writes[lab]))
    out = {}
    for lab, tap, own in reads:
        before = order[: len(plan.embeds)] + [
            s for s in order[len(plan.embeds) :] if probe.when(writes[s]) < probe.when(tap)
        ]
        missing = set(own) - set(before)
        if missing:
            raise Refused(f"{lab} reads {sorted(missing)[0]}, written after its module runs")
        w = [own.get(s, 0.0) for s in before]
        while len(w) > 1 and w[-1] == 0.0 and before[len(w) - 1] not in own:
            w.pop()
        if w != [1.0] * len(before):
            out[lab] = tuple(w)
    return out


def reading_gap(model: Any, spec: ModelSpec) -> str:
    """The first way ``model`` read through ``spec`` differs from this family's reading of it (a
    source's or consumer's label, kind, depth or count of sources), "" where it does not.
    """
    try:
        family, through = build(model), build_spec(model, spec)
    except DepthscopeError as err:
        return f"refused: {err}"
    rows = [
        [(s.label, s.kind, s.depth) for s in ad.sources]
        + [(c.label, c.kind, c.depth, c.n_sources) for c in ad.consumers]
        for ad in (family, through)
    ]
    pairs = [*zip(*rows), ((len(rows[0]),), (len(rows[1]),))]
    show = " ".join  # label, kind, depth (and a consumer's count of sources)
    return next((f"{show(map(str, g))} where it has {show(map(str, f))}" for f, g in pairs if f != g), "")


def _read(model: Any) -> tuple[ModelSpec, Plan | None, Probe, Adapter]:
    """The spec this family reads ``model`` by, its plan (None: the model read as post-LN, its layout
    found by structure), the probe both were found on, and the adapter built and checked from the spec;
    Refused in the family's one line where neither reading holds.
    """
    model_type = str(getattr(model.config, "model_type", ""))
    probe = None
    try:
        probe = Probe(model, _vocab(model))
        plan = plan_of(model, probe)
        spec = spec_of(model, plan, probe)
        # the one checked way from a description to hooks
        return spec, plan, probe, build_spec(model, spec, find=False, probe=probe)
    except DepthscopeError as err:  # Refused, or any other check of the spec's build
        how = f"the {model_type} layout" if model_type in LAYOUTS else "discovery"
        also = ""
        if probe is not None:  # not a sum of its writes: a post-LN model, read through its LayerNorms?
            try:
                found = post_ln.find_layout(model, probe)
                return found, None, probe, post_ln.build(model, found, probe=probe, origin="structure")
            except DepthscopeError as post:
                also = f"; nor as a post-LN model: {_unprefixed(post)}"
        advice = (
            ""
            if model_type in LAYOUTS
            else "; name where it writes and reads in a spec file: " + SPEC_COMMAND
        )
        raise Refused(
            f"cannot read this {model_type} model as a sum of its writes ({how}): "
            f"{_unprefixed(err)}{also}{advice}"
        ) from None


def build(model: Any) -> Adapter:
    """The adapter of a decoder from its checked plan: static weights where writes are scaled (a
    post-LN model found by structure: read through its LayerNorms, ``post_ln``).
    """
    _, plan, probe, read = _read(model)
    if plan is None:
        return read
    cfg = text_config(model)
    model_type = str(getattr(model.config, "model_type", ""))
    name = model_name(model)
    keep = (
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "n_positions",
        "tie_word_embeddings",
    )
    config = config_values(cfg, keep)
    attrs = {
        "scheme": "standard",
        "variant": name,
        "label": name,
        "config": json.dumps(config, sort_keys=True, default=str),
        "layout": plan.origin,
        "parallel_residual": int(any(len(step.subs) > 1 for steps in plan.steps for step in steps)),
        "static_weights": int(any(c.static is not None for c in read.consumers)),
    }
    return as_family(
        read,
        model,
        NAME,
        attrs,
        head=verified_head(model, plan, probe),
        hint=f"; this {model_type} model ({plan.origin}) is not a plain sum of its writes here",
    )


def _unprefixed(err: Exception) -> str:
    """A refusal of the family's spec as the family's own (not a user's ModelSpec)."""
    return str(err).removeprefix("ModelSpec: ")


def _context(cfg: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = config_value(cfg, key)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 16  # no stated limit (a state-space model)


def verified_head(model: Any, plan: Plan, probe: Probe) -> Head | None:
    """The final norm and unembedding as a ``Head`` (logit attribution, lens, ablation) if it
    reproduces the model's logits on the probe; None otherwise (softcapped or scaled logits, a norm
    of another form), so those views are refused rather than wrong. Gemma's norms scale by
    1 + weight: both gains are tried.
    """
    final = tap_value(probe, plan.readout)
    last = probe.first[f"{plan.layers}.{plan.index()[-1]}"]
    # the final norm: the first module after the last layer that reads the final stream
    norm = next(
        (
            c.module
            for c in probe.calls
            if c.index > last.index
            and c.input is not None
            and not c.path.startswith(f"{plan.layers}.")
            and error(c.input, final) == 0.0
        ),
        None,
    )
    unembed = model.get_output_embeddings()
    if unembed is None or probe.logits is None or getattr(unembed, "weight", None) is None:
        return None
    try:
        head = head_of(norm, unembed)
    except Exception:  # not a norm with the attributes of one
        return None
    gains = [head.weight] if head.weight is None else [head.weight, head.weight + 1]
    for gain in gains:
        candidate = Head(head.norm, head.unembed, head.centred, head.eps, gain, head.bias)
        try:
            with torch.no_grad():
                logits = candidate.logits(final.to(unembed.weight.device, unembed.weight.dtype))
        except RuntimeError:  # shapes of another kind of module
            continue
        if logits.shape == probe.logits.shape and error(probe.logits.cpu(), logits.cpu()) <= max(
            1e-4, 10 * probe.tolerance()
        ):
            return candidate
    return None


FAMILY = Family(
    name=NAME,
    reads=(
        "any transformers decoder whose layers add their writes to one stream (a layouts table: llama-like, "
        "gpt2, gpt_neox, gptj, phi, cohere, falcon, gemma2/3, olmo2/3, glm4, granite, minicpm3, "
        "mamba, jamba, "
        "falcon_h1 ...; discovery, checked on a probe batch, for the rest): hooks on embeddings, sublayer "
        "writes (attn, mlp, ssm), norm inputs; unit weights, or static ones for scaled writes"
    ),
    detect=detect,
    build=build,
    priority=90,  # after every family that claims its model types (MODEL_TYPES): this one takes the rest
    generic=True,  # the registry tries it only for model types no other family claims
)
