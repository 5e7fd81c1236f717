"""Where every family's sources and consumer inputs live, written out here in module paths apart from
the adapters (which find them their own way), and an oracle by label from plain torch hooks on those
modules: the label-keyed twin of ``tests/oracle.py``, whose dense oracle listens on the adapter's
own taps and so proves the engine's arithmetic but not which module each label belongs to.

A layout is the forward in execution order: ``src(label, path)``, a source (the module's output, the
first element of a tuple; ``where="in"``: its first input; ``entry=k``: entry k of a stacked value;
``"path:k"``: row k of a parameter, broadcast over the tokens), and ``read(label, path)``, a
consumer (the module's first input, positional or ``hidden_states``; ``where="out"``: its output);
a consumer reads every source written before it. Every hooked module must run once per forward.
How a consumer mixes its sources, by family:

* ``unit``: the input IS the sum of the sources before it (a standard residual), checked exactly;
* ``token``: per-token scalar weights, found by least squares of the input on the sources (the
  input must lie in their span: a residual of rounding size), whatever the family's mixer is;
* ``terms`` (post-LN BERT): the terms carried through every LayerNorm by hand (the gain and 1/sigma
  of the LayerNorm's own input), each LayerNorm's bias a source of its own;
* ``grn`` (deep-cross-attention): the per-feature GRN weights over the stacked block outputs, the
  dynamic part read from the GRN's own ``to_aggregate`` output, the bias from its parameter;
* ``gated`` (qwen4_exp): the per-channel weights of the gated residual recomputed by hand
  (``tests/probes/adapters/test_qwen4_exp.py``), the PLE's convolution term per stream.

Then every cell's contribution share sum_t <c[l, s], h_l> / sum_t |h_l|^2, its norm share and the
token-mean weight, each consumer's input RMS and first-position share and each source's RMS, keyed
by (consumer label, source label), in float64 from the hooked tensors only (``expected``), and
compared with the trace's cells picked by label (``assert_by_label``). The adapter is never asked
where anything is.

Legend: batch, pos, d_model; entry (one tensor of a stack [entry, batch, pos, d_model]); n (the
sources a consumer reads).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class Tap:
    """One tensor of the forward: a module's output (``out``) or first input (``in``), optionally
    one entry of a stacked value."""

    path: str
    where: str = "out"
    entry: int | None = None


@dataclass(frozen=True)
class Event:
    kind: str  # "src" | "read"
    label: str
    tap: Tap


def src(label: str, path: str, where: str = "out", entry: int | None = None) -> Event:
    return Event("src", label, Tap(path, where, entry))


def read(label: str, path: str, where: str = "in") -> Event:
    return Event("read", label, Tap(path, where))


def at(i: int, events: list[Event]) -> list[Event]:
    """``events`` of layer ``i``: ``{i}`` the layer, ``{a}`` / ``{m}`` its attention and MLP sublayer
    in packages that count sublayers (2i, 2i + 1)."""
    f = {"i": i, "a": 2 * i, "m": 2 * i + 1}
    return [
        Event(e.kind, e.label.format(**f), Tap(e.tap.path.format(**f), e.tap.where, e.tap.entry))
        for e in events
    ]


def per_layer(n: int, events: list[Event]) -> list[Event]:
    """``events`` repeated for every layer (``at``)."""
    return [e for i in range(n) for e in at(i, events)]


# --- the layouts, one per family of tests/families.py ---------------------------------------------


def hf_pre_norm(prefix: str, n: int) -> list[Event]:
    """A Hugging Face pre-norm decoder: the attention's and the MLP's outputs are written, the norm
    before each reads (the brief's own example: ``0.attn`` the output[0] of ``self_attn``, read by
    ``input_layernorm``), the final norm reads the read-out."""
    layer = prefix + "layers.{i}."
    return [
        src("embed", prefix + "embed_tokens"),
        *per_layer(
            n,
            [
                read("{i}.attn", layer + "input_layernorm"),
                src("{i}.attn", layer + "self_attn"),
                read("{i}.mlp", layer + "post_attention_layernorm"),
                src("{i}.mlp", layer + "mlp"),
            ],
        ),
        read("readout", prefix + "norm"),
    ]


def llama(model):
    return "unit", hf_pre_norm("model.", len(model.model.layers))


def bridge(model):
    """TransformerBridge (GPT-2 style, boot_native): the bridged components inside each block."""
    block = "blocks.{i}._original_component."
    return "unit", [
        src("embed", "embed"),
        src("pos_embed", "pos_embed"),
        *per_layer(
            len(model.blocks),
            [
                read("{i}.attn", block + "ln1"),
                src("{i}.attn", block + "attn"),
                read("{i}.mlp", block + "ln2"),
                src("{i}.mlp", block + "mlp"),
            ],
        ),
        read("readout", "ln_final"),
    ]


def bert(model):
    """Post-LN: every LayerNorm's bias is a source after the writes it normalises; the consumers read
    the LayerNorms' outputs (the attention's input, the intermediate's input, the last output)."""
    layer = "encoder.layer.{i}."
    return "terms", [
        src("embed", "embeddings.word_embeddings"),
        src("token_type", "embeddings.token_type_embeddings"),
        src("pos_embed", "embeddings.position_embeddings"),
        src("embed.ln", "embeddings.LayerNorm"),  # (the LayerNorm: its bias, carried by hand)
        *per_layer(
            len(model.encoder.layer),
            [
                read("{i}.attn", layer + "attention"),
                src("{i}.attn", layer + "attention.output.dense"),
                src("{i}.ln1", layer + "attention.output.LayerNorm"),
                read("{i}.mlp", layer + "intermediate"),
                src("{i}.mlp", layer + "output.dense"),
                src("{i}.ln2", layer + "output.LayerNorm"),
            ],
        ),
        read("readout", f"encoder.layer.{len(model.encoder.layer) - 1}.output.LayerNorm", "out"),
    ]


def hyper_connections(model):
    return "token", [
        src("embed", "embed"),
        *per_layer(
            len(model.layers),
            [
                read("{i}.attn", "layers.{i}.0.branch"),
                src("{i}.attn", "layers.{i}.0.branch"),
                read("{i}.mlp", "layers.{i}.1.branch"),
                src("{i}.mlp", "layers.{i}.1.branch"),
            ],
        ),
        read("readout", "norm"),
    ]


def dca(model):
    """Deep cross-attention: three consumers per attention (the q, k, v GRN outputs, read by
    ``to_q`` / ``to_k`` / ``to_v``), the MLP reads the attention output plus the q input."""
    block = "dca_blocks.{i}."
    return "grn", [
        src("embed", "token_emb"),
        *per_layer(
            len(model.dca_blocks),
            [
                read("{i}.attn.q", block + "attn.to_q"),
                read("{i}.attn.k", block + "attn.to_k"),
                read("{i}.attn.v", block + "attn.to_v"),
                src("{i}.attn", block + "attn"),
                read("{i}.mlp", block + "pre_ff_norm"),
                src("{i}.mlp", block + "ff"),
            ],
        ),
        read("readout", "norm"),
    ]


def attn_res(model):
    return "token", [
        src("embed", "token_emb"),
        *per_layer(
            len(model.layers) // 2,
            [
                read("{i}.attn", "layers.{a}.norm"),
                src("{i}.attn", "layers.{a}.fn"),
                read("{i}.mlp", "layers.{m}.norm"),
                src("{i}.mlp", "layers.{m}.fn"),
            ],
        ),
        read("readout", "out_norm"),
    ]


def x_transformers(model):
    """x-transformers: ``attn_layers.layers.{k}`` = [pre-norms, branch, residual]; the embedding is
    the input of ``attn_layers``; with hyper-connections each stream also starts with its own
    learned ``stream_emb`` (a parameter, broadcast over the tokens: see ``value``)."""
    layers = model.attn_layers
    streams = getattr(layers, "num_residual_streams", 1)
    stream_emb = (
        [src(f"stream_emb.{s}", f"attn_layers.stream_emb:{s}") for s in range(streams)] if streams > 1 else []
    )
    return "token", [
        src("embed", "attn_layers", "in"),
        *stream_emb,
        *per_layer(
            len(layers.layers) // 2,
            [
                read("{i}.attn", "attn_layers.layers.{a}.0.0"),
                src("{i}.attn", "attn_layers.layers.{a}.1"),
                read("{i}.mlp", "attn_layers.layers.{m}.0.0"),
                src("{i}.mlp", "attn_layers.layers.{m}.1"),
            ],
        ),
        read("readout", "attn_layers.final_norm"),
    ]


def deepseek_v4(model):
    return "token", hf_pre_norm("model.", len(model.model.layers))


def glm5_next(model):
    return "token", hf_pre_norm("model.language_model.", len(model.model.language_model.layers))


def hy_v4(model):
    return "token", hf_pre_norm("model.", len(model.model.layers))


def beam(model):
    """Beam (sandwich norms): the written values are the post-norms' outputs."""
    layer = "model.layers.{i}."
    return "token", [
        src("embed", "model.embed_tokens"),
        *per_layer(
            len(model.model.layers),
            [
                read("{i}.attn", layer + "input_layernorm"),
                src("{i}.attn", layer + "post_attention_layernorm"),
                read("{i}.mlp", layer + "pre_feedforward_layernorm"),
                src("{i}.mlp", layer + "post_feedforward_layernorm"),
            ],
        ),
        read("readout", "model.norm"),
    ]


def gemma3n(model):
    """Gemma 3n: AltUp's streams as layer 0 receives them (the embedding, then its projections),
    LAuReL beside the attention (its whole output, its skip included), the per-layer input after
    the MLP, and the unembedding projections of streams 1.. (the model rescales them per token to
    the magnitude of stream 0 before the read-out's mean: a per-token weight)."""
    cfg = model.config
    layer = "model.layers.{i}."
    return "token", [
        src("embed", "model.layers.0", "in", entry=0),
        *(src(f"embed.stream{k}", "model.layers.0", "in", entry=k) for k in range(1, cfg.altup_num_inputs)),
        *per_layer(
            cfg.num_hidden_layers,
            [
                read("{i}.attn", layer + "input_layernorm"),
                src("{i}.laurel", layer + "laurel"),
                src("{i}.attn", layer + "post_attention_layernorm"),
                read("{i}.mlp", layer + "pre_feedforward_layernorm"),
                src("{i}.mlp", layer + "post_feedforward_layernorm"),
                src("{i}.ple", layer + "post_per_layer_input_norm"),
            ],
        ),
        *(
            src(f"readout.stream{k}", f"model.altup_unembed_projections.{k - 1}")
            for k in range(1, cfg.altup_num_inputs)
        ),
        read("readout", "model.norm"),
    ]


def qwen4_exp(model):
    """Qwen4-Exp: a consumer's input is its gated residual's output; a PLE layer writes the n-gram
    value (``value_proj``) and, per stream, the rest of its write (see ``gated``)."""
    cfg = model.config
    ple = {i - 1 for i in cfg.ple_layer_ids or []}
    layer = "model.layers.{i}."
    events = [src("embed", "model.embed_tokens")]
    for i, kind in enumerate(cfg.layer_types):
        one = []
        if i in ple:
            one += [src("{i}.ple", layer + "ple.value_proj")]
            one += [src(f"{{i}}.ple_conv.{s}", layer + "ple", entry=s) for s in range(cfg.hc_count)]
        attn = "linear_attn" if kind == "linear_attention" else "self_attn"
        one += [
            read("{i}.attn", layer + "attn_hyper_connection", "out"),
            src("{i}.attn", layer + attn),
            read("{i}.mlp", layer + "mlp_hyper_connection", "out"),
            src("{i}.mlp", layer + "mlp"),
        ]
        events += at(i, one)
    return "gated", [*events, read("readout", "model.hyper_connection_mixer", "out")]


# family name in tests/families.py -> its layout
LAYOUTS = {
    "huggingface (llama)": llama,
    "post-ln (bert)": bert,
    "transformer-lens bridge": bridge,
    "hyper_connections": hyper_connections,
    "deep_cross_attention": dca,
    "attn_res": attn_res,
    "x_transformers (hc)": x_transformers,
    "x_transformers (attnres)": x_transformers,
    "deepseek_v4": deepseek_v4,
    "qwen4_exp": qwen4_exp,
    "beam": beam,
    "glm5_next": glm5_next,
    "hy_v4": hy_v4,
    "gemma3n": gemma3n,
}


# the models that compute their stream mixing in float32 whatever their dtype (their RMS norms and
# hyper-connection projections cast to float32): made float64, their inputs are their sources'
# combination to about 3e-8 only (the trace's own residual_error says as much), not to rounding
ROUNDED = {"deepseek_v4", "glm5_next", "hy_v4", "qwen4_exp"}


def tolerance(name: str) -> tuple[float, float]:
    """(how far an input may be from its sources' combination, how far a statistic may be from the
    trace's), both relative."""
    return (1e-7, 1e-6) if name in ROUNDED else (1e-12, 1e-9)


def wake(model, seed: int = 0, scale: float = 0.1):
    """Seeded noise on every parameter that is exactly zero everywhere (zero-initialised biases,
    stream embeddings, output scales, dynamic projections, convolutions): no source is then zero on
    every token (a label without a value of its own) and few weights are the same on every token.
    Not attn-res's pseudo-queries: once nonzero, the package rounds its softmax in float32."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.is_floating_point() and not bool(p.any()) and not name.endswith("pseudo_query"):
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


# --- the oracle by label --------------------------------------------------------------------------


def first_tensor(args: tuple, kwargs: dict) -> Tensor:
    """A module's first input: positional, else ``hidden_states``, else its first float tensor keyword."""
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    return next(v for v in kwargs.values() if isinstance(v, Tensor) and v.is_floating_point())


def record(model, tokens: Tensor, events: list[Event]) -> dict[tuple[str, str], Tensor]:
    """One forward with plain forward (pre-)hooks on every (module, in | out) of ``events``: each
    tensor in float64, as the module has it (the first element of a tuple or list). Every hooked
    module must run exactly once (a label is one tensor of the forward)."""
    seen: dict[tuple[str, str], list[Tensor]] = {}
    handles = []

    def keep(key, t):
        t = t[0] if isinstance(t, (tuple, list)) else t
        seen.setdefault(key, []).append(t.detach().double().clone())

    try:
        for key in dict.fromkeys((e.tap.path, e.tap.where) for e in events):
            path, where = key
            if ":" in path:  # a parameter, not a module
                continue
            module = model.get_submodule(path)
            if where == "out":
                handles.append(module.register_forward_hook(lambda m, a, out, key=key: keep(key, out)))
            else:
                handles.append(
                    module.register_forward_pre_hook(
                        lambda m, a, kw, key=key: keep(key, first_tensor(a, kw)), with_kwargs=True
                    )
                )
        with torch.no_grad():
            model(tokens)
    finally:
        for h in handles:
            h.remove()
    for key, ts in seen.items():
        assert len(ts) == 1, f"{key} ran {len(ts)} times in one forward"
    return {k: v[0] for k, v in seen.items()}


def value(model, raw: dict, tap: Tap, shape: tuple[int, int]) -> Tensor:
    """The tensor of ``tap`` as [batch, pos, d_model] (flattened tokens unflattened, a tensor shared
    over the batch expanded, a parameter row broadcast over the tokens)."""
    b, p = shape
    if ":" in tap.path:
        name, _, row = tap.path.partition(":")
        t = model.get_parameter(name).detach().double()[int(row)]
        return t.expand(b, p, -1)
    t = raw[(tap.path, tap.where)]
    if tap.entry is not None:
        t = t[tap.entry]
    if t.ndim == 2:
        t = t.view(b, p, -1) if t.shape[0] == b * p else t.unsqueeze(0)
    assert t.shape[1] == p and t.shape[0] in (1, b), f"{tap.path}:{tap.where} has shape {tuple(t.shape)}"
    return t.expand(b, *t.shape[1:])


@dataclass
class Row:
    """One consumer: its hooked input, and per source label read, its term c[l, s] [batch, pos,
    d_model] and its weight [batch, pos] (the channel mean of per-feature weights; None for a
    source zero on every token, which any weight fits)."""

    h: Tensor
    terms: dict[str, Tensor]
    weights: dict[str, Tensor | None]


def split(events: list[Event]) -> tuple[list[Event], list[tuple[Event, int]]]:
    """(sources, [(consumer, how many sources it reads)]) in execution order."""
    sources, consumers = [], []
    for e in events:
        if e.kind == "src":
            sources.append(e)
        else:
            consumers.append((e, len(sources)))
    return sources, consumers


def rows_of(model, tokens: Tensor, name: str) -> tuple[dict[str, Row], dict[str, Tensor], list[str]]:
    """The family's rows by consumer label, the source values by label and the source labels in
    order, from plain hooks on the layout's modules only."""
    mixing, events = LAYOUTS[name](model)
    rows, v = MIXING[mixing](model, tokens, events, tolerance(name)[0])
    sources, consumers = split(events)
    for c, n in consumers:
        assert list(rows[c.label].terms) == [e.label for e in sources[:n]], c.label
    return rows, v, [e.label for e in sources]


def by_weights(
    model, tokens: Tensor, events: list[Event], tol: float, unit: bool
) -> tuple[dict[str, Row], dict]:
    """Unit weights (the input is the sum of the sources, exactly) or per-token weights (least
    squares of the input on the sources, which it must lie in the span of)."""
    raw = record(model, tokens, events)
    shape = tuple(tokens.shape)
    sources, consumers = split(events)
    v = {e.label: value(model, raw, e.tap, shape) for e in sources}
    rows = {}
    for c, n in consumers:
        h = value(model, raw, c.tap, shape)
        read = [e.label for e in sources[:n]]
        if unit:
            rebuilt = sum(v[s] for s in read)
            err = float((h - rebuilt).norm() / h.norm())
            assert err < tol, f"{c.label}: the input is not the sum of {read} (off by {err:.2g})"
            w = dict.fromkeys(read, torch.ones(shape, dtype=torch.float64))
        else:
            w = dict(zip(read, least_squares([v[s] for s in read], h, c.label, tol).unbind(-1)))
        terms = {s: w[s][..., None] * v[s] for s in read}
        w = {s: w[s] if bool(v[s].abs().amax() > 0) else None for s in read}  # zero: any weight
        rows[c.label] = Row(h, terms, w)
    return rows, v


def least_squares(sources: list[Tensor], h: Tensor, label: str, tol: float) -> Tensor:
    """Per-token weights [batch, pos, n] of ``h`` on the ``sources``, the columns scaled to unit
    norm; the input must lie in their span (a source zero everywhere gets weight 0)."""
    a = torch.stack(sources, dim=-1)  # [batch, pos, d, n]
    scale = torch.linalg.vector_norm(a, dim=-2, keepdim=True)
    scale = torch.where(scale > 0, scale, 1.0)
    w = torch.linalg.lstsq(a / scale, h.unsqueeze(-1), driver="gelsd").solution / scale.transpose(-1, -2)
    resid = torch.linalg.vector_norm(h - (a @ w).squeeze(-1), dim=-1) / torch.linalg.vector_norm(h, dim=-1)
    worst = float(resid.max())
    assert worst < tol, f"{label}: the input is not a combination of its sources (off by {worst:.2g})"
    return w.squeeze(-1)


def carried_terms(model, tokens: Tensor, events: list[Event], tol: float) -> tuple[dict[str, Row], dict]:
    """Post-LN: walk the forward; a write is a term; a LayerNorm (its input checked to be the sum
    of the terms) turns every term c into gain * (c - mean c) / sigma, sigma that of its input, and
    adds its bias as a term; a consumer's input must be the sum of the terms it reads. The weight
    of a term is the product of the 1/sigma it went through."""
    lns = [Event("src", e.label, Tap(e.tap.path, "in")) for e in events if is_norm(model, e)]
    raw = record(model, tokens, events + lns)
    shape = tuple(tokens.shape)
    terms: dict[str, Tensor] = {}
    scales: dict[str, Tensor] = {}
    v, rows = {}, {}
    for e in events:
        if e.kind == "read":
            h = value(model, raw, e.tap, shape)
            err = float((h - sum(terms.values())).norm() / h.norm())
            assert err < tol, f"{e.label}: the input is not the sum of the carried terms (off by {err:.2g})"
            rows[e.label] = Row(h, dict(terms), dict(scales))
        elif is_norm(model, e):
            ln = model.get_submodule(e.tap.path)
            x = value(model, raw, Tap(e.tap.path, "in"), shape)
            err = float((x - sum(terms.values())).norm() / x.norm())
            assert err < tol, f"{e.tap.path}: its input is not the sum of the terms (off by {err:.2g})"
            inv = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + ln.eps)
            gain = ln.weight.detach().double()
            terms = {s: gain * (c - c.mean(-1, keepdim=True)) * inv for s, c in terms.items()}
            scales = {s: w * inv.squeeze(-1) for s, w in scales.items()}
            terms[e.label] = v[e.label] = ln.bias.detach().double().expand(*shape, -1)
            scales[e.label] = torch.ones(shape, dtype=torch.float64)
            out = value(model, raw, e.tap, shape)
            assert float((out - sum(terms.values())).norm() / out.norm()) < tol, e.tap.path
        else:
            terms[e.label] = v[e.label] = value(model, raw, e.tap, shape)
            scales[e.label] = torch.ones(shape, dtype=torch.float64)
    return rows, v


def is_norm(model, e: Event) -> bool:
    return e.kind == "src" and isinstance(model.get_submodule(e.tap.path), torch.nn.LayerNorm)


def grn(model, tokens: Tensor, events: list[Event], tol: float) -> tuple[dict[str, Row], dict]:
    """Deep cross-attention: a GRN reads the stack of the embedding and every block's output
    (attention + MLP: checked) and gives output o per feature sum_y (dynamic[o, y] + bias[o, y]) *
    stack[y], dynamic from its ``to_aggregate``; a source weighs what its stack entry does. The q,
    k, v consumers read the block GRN's outputs 0, 1, 2, the MLP reads the attention output plus
    the q input, the read-out the final GRN's."""
    blocks = len(model.dca_blocks)
    grns = [f"dca_blocks.{i}.qkv_grn" for i in range(blocks)] + ["final_grn"]
    extra = [Event("src", p, Tap(p, "in")) for p in grns] + [
        Event("src", p, Tap(p + ".to_aggregate")) for p in grns
    ]
    raw = record(model, tokens, events + extra)
    shape = tuple(tokens.shape)
    sources, consumers = split(events)
    v = {e.label: value(model, raw, e.tap, shape) for e in sources}
    entries = [["embed"]] + [[f"{j}.attn", f"{j}.mlp"] for j in range(blocks)]
    weights = {}  # GRN path -> per-feature weights [output, entry, batch, pos, d]
    for path in grns:
        stack = raw[(path, "in")]
        for y, members in enumerate(entries[: stack.shape[0]]):
            assert float((stack[y] - sum(v[s] for s in members)).norm() / stack[y].norm()) < tol
        dyn = raw[(path + ".to_aggregate", "out")]  # [output, entry, batch, pos]
        weights[path] = dyn[..., None] + model.get_submodule(path).bias.detach().double()[:, :, None, None]
    rows = {}
    for c, n in consumers:
        h = value(model, raw, c.tap, shape)
        path = grns[-1] if c.label == "readout" else grns[int(c.label.split(".")[0])]
        w = weights[path]["qkv".index(c.label[-1]) if ".attn." in c.label else 0]  # the MLP: q's
        per = {s: w[y] for y, members in enumerate(entries[: w.shape[0]]) for s in members}
        read = [e.label for e in sources[:n]]
        per.update({s: torch.ones_like(w[0]) for s in read if s not in per})  # the MLP's own attention
        terms = {s: per[s] * v[s] for s in read}
        err = float((h - sum(terms.values())).norm() / h.norm())
        assert err < tol, f"{c.label}: the input is not the GRN's sum (off by {err:.2g})"
        rows[c.label] = Row(h, terms, {s: per[s].mean(-1) for s in read})
    return rows, v


def gated(model, tokens: Tensor, events: list[Event], tol: float) -> tuple[dict[str, Row], dict]:
    """Qwen4-Exp: per-channel weights of every gated residual recomputed by hand from plain hooks
    (``test_qwen4_exp.hand_weights``: over the embedding, each PLE's value and per-stream rest, and
    the sublayer outputs, in that order); the PLE's per-stream rest is its write to that stream
    minus the gated value."""
    from tests.probes.adapters.test_qwen4_exp import hand_weights

    cfg = model.config
    n, d = cfg.hc_count, cfg.hidden_size
    raw = record(model, tokens, events)
    shape = tuple(tokens.shape)
    sources, consumers = split(events)
    hand, _, ple_gates, _ = hand_weights(model, tokens)
    assert len(hand) == len(consumers)
    v, sigmas = {}, iter(ple_gates)
    for e in sources:
        if e.tap.entry is None:
            v[e.label] = value(model, raw, e.tap, shape)
            continue
        if e.tap.entry == 0:
            sigma = next(sigmas)  # [batch, pos, stream]
            write = raw[(e.tap.path, "out")].unflatten(-1, (n, d))
        value_label = e.label.rsplit(".", 2)[0] + ".ple"
        v[e.label] = write[..., e.tap.entry, :] - sigma[..., e.tap.entry, None] * v[value_label]
    rows = {}
    for (c, k), w in zip(consumers, hand):
        assert w.shape[-2] == k, c.label
        h = value(model, raw, c.tap, shape)
        read = [e.label for e in sources[:k]]
        terms = {s: w[..., j, :] * v[s] for j, s in enumerate(read)}
        err = float((h - sum(terms.values())).norm() / h.norm())
        assert err < tol, f"{c.label}: the input is not its weighted sources (off by {err:.2g})"
        rows[c.label] = Row(h, terms, {s: w[..., j, :].mean(-1) for j, s in enumerate(read)})
    return rows, v


MIXING = {
    "unit": lambda m, t, e, tol: by_weights(m, t, e, tol, unit=True),
    "token": lambda m, t, e, tol: by_weights(m, t, e, tol, unit=False),
    "terms": carried_terms,
    "grn": grn,
    "gated": gated,
}


def expected(rows: dict[str, Row], v: dict[str, Tensor], skip: int) -> dict[tuple[str, ...], float]:
    """Each statistic the trace keeps, keyed by (variable, consumer label[, source label]) or
    (variable, source label), over the positions after the first ``skip``."""
    out = {}
    for label, r in rows.items():
        h = r.h[:, skip:]
        energy = float(h.pow(2).sum())
        norms = {s: float(torch.linalg.vector_norm(c[:, skip:], dim=-1).sum()) for s, c in r.terms.items()}
        for s, c in r.terms.items():
            out["contribution_share", label, s] = float((c[:, skip:] * h).sum()) / energy
            out["norm_share", label, s] = norms[s] / sum(norms.values())
            if r.weights[s] is not None:
                out["mixing", label, s] = float(r.weights[s][:, skip:].mean())
        out["input_rms", label] = float(h.pow(2).mean().sqrt())
        out["first_position_share", label] = float(r.h[:, 0].pow(2).sum() / r.h.pow(2).sum())
    for s, t in v.items():
        out["source_rms", s] = float(t[:, skip:].pow(2).mean().sqrt())
    return out


def assert_by_label(
    trace, rows: dict[str, Row], expect: dict[tuple[str, ...], float], rtol: float, what: str
):
    """Every statistic of ``expect`` equals the trace's cell picked by label (``sel``), to ``rtol``
    of the largest magnitude of that statistic; a cell a consumer does not read is NaN."""
    scale: dict[str, float] = {}
    for (name, *_), x in expect.items():
        scale[name] = max(scale.get(name, 0.0), abs(x))
    for (name, *labels), x in expect.items():
        dims = (
            ("layer", "source") if len(labels) == 2 else ("source",) if name == "source_rms" else ("layer",)
        )
        got = float(trace[name].sel(dict(zip(dims, labels))))
        assert abs(got - x) <= rtol * scale[name], (
            f"{what}: {name} at {dict(zip(dims, labels))} is {got!r} in the trace, {x!r} from the hooks"
        )
    for label, r in rows.items():
        unread = [s for s in trace["source"].values if s not in r.terms]
        cells = trace["contribution_share"].sel(layer=label, source=unread).values
        assert np.isnan(cells).all(), f"{what}: {label} has a share of a source written after it"
