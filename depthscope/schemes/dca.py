"""DeepCrossAttention (Heddes et al., arXiv 2502.06785, ICML 2025): GRN-v1/v2/v3 and DCA.

The unit of depth is a decoder block. Block t reads the stack G_t = [x, f_0, ..., f_{t-1}]: the
model input x (the token embedding) and the previous blocks' output increments
f_j = attn_out_j + mlp_out_j (no residual). A generalized residual network (GRN, Sec. 3) builds an input
from the stack, g = sum_i c_i (*) g_i over its entries g_i:

    v1   c_i = b_i                      b_i scalar, init 1
    v2   c_i = b_i                      b_i in R^d, init 1
    v3   c_i = b_i + relu(w . N(g_i))   b_i in R^d (init 1), w in R^d (init 0); the gate is one
                                        scalar per token and entry, shared over features
    dca  three independent v3 GRNs give the query, key and value inputs of the attention

Block t: with x_t the GRN output (the query GRN's for dca), the attention reads x_t (or the q/k/v
triple), the MLP reads x_t + attn_out, and f_t = attn_out + mlp_out is pushed on the stack: the
inputs are not added to the block's output (Sec. 3, Fig. 4). The read-out is a final GRN of the same
variant (a v3 for dca) over the whole stack; its output goes to the final norm. With b = 1 and
w = 0 every variant is exactly the standard residual at initialisation.

k-DCA (Sec. 3, option k): the stack holds the model input, the plain sum of all outputs older
than the last k, and the last k outputs (at most k + 2 entries; the sum entry appears once there
are k + 1 outputs). GRN parameters belong to stack positions, so the sum position's weight applies
to whatever the sum holds.

Choices where the paper is silent:
* N is a weightless RMSNorm of each stack entry: the only scale-free choice without parameters
  of its own (lucidrains' port uses RMSNorm with a gain), so the gate sees each entry's direction.
* relu is computed as clamp(min=0): the same forward, but its gradient at 0 is 1 (torch's relu
  gives 0 there), otherwise w, initialised to 0, would never receive a gradient.
* dca's MLP skip uses the query GRN's output: an attention's output at a token answers that
  token's query, so the query input plays the part of the stream x in x + attn(x) (also
  lucidrains' choice).
* The read-out GRN is the paper's g_T (lucidrains' port has the same final GRN).

Parameters: ``blocks.{t}.attn_mix.b`` ([entry] for v1, [entry, d_model] otherwise) and
``.w`` ([d_model], v3) for the single-GRN variants; ``blocks.{t}.attn_mix.{q,k,v}.b`` / ``.w`` for
dca; ``readout_mix.b`` / ``.w``.

Native hooks (v3 and dca): ``hook_gate`` = relu(w . N(g_i)), [batch, pos, entry], on every v3 GRN:
``blocks.{t}.attn_mix.hook_gate`` (v3), ``blocks.{t}.attn_mix.{q,k,v}.hook_gate`` (dca),
``readout_mix.hook_gate``. The dca attention mixer is a ``ViewsMixer``: its three views carry the
``hook_in``/``hook_weights`` (it has none of its own), so ``hook_dict`` lists only hooks that fire.

Weight decay: the gate projections ``w`` are decayed (the paper trains every GRN parameter with
AdamW, weight decay 0.1); the static ``b`` are not, since their initialisation at 1 is what makes
the model a standard residual.

Delta basis: an entry for block j covers its two sources j.attn and j.mlp with the same weight,
the sum entry all of its members', the embedding is its own entry. v1 emits [batch, pos, source];
v2/v3/dca emit per-feature weights [batch, pos, source, d_model]. The MLP consumer's weights are
its block's (query) GRN weights plus 1 on the block's own attention output.

Legend: batch, pos, d_model, entry (a stack entry), source (embedding + sublayer outputs).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, replace
from typing import Literal

import torch
from einops import rearrange
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from depthscope.errors import ConfigError
from depthscope.schemes import names
from depthscope.schemes._common import inv_rms
from depthscope.schemes.base import Mixer, ModelConfig, Port, Scheme, Site, ViewsMixer, register

Variant = Literal["v1", "v2", "v3", "dca"]


@dataclass(frozen=True)
class DCAOptions:
    """The GRN variant (v1, v2, v3, or dca: three v3 for q, k, v) and k-DCA's k (None: the full stack)."""

    grn: Variant = "dca"
    k: int | None = None  # k-DCA: keep the last k outputs, sum the older ones; None = full stack


def stack_layout(cfg: ModelConfig, block: int) -> list[tuple[int, ...]]:
    """The block outputs held by each stack entry read by ``block`` (n_layers = read-out); -1 = embedding."""
    outs, k = list(range(block)), cfg.options.k
    if k is None or block <= k:
        return [(-1,)] + [(j,) for j in outs]
    return [(-1,), tuple(outs[:-k])] + [(j,) for j in outs[-k:]]


def entry_of_source(cfg: ModelConfig, block: int) -> list[int]:
    """For each source written before ``block`` (embed, 0.attn, 0.mlp, ...), its stack entry."""
    entry = {j: e for e, members in enumerate(stack_layout(cfg, block)) for j in members}
    return [0] + [entry[j] for j in range(block) for _ in range(2)]


def entry_inv_rms(x: Tensor) -> Tensor:
    """The inverse RMS over d_model of a stack entry, [batch, pos]: N(g) = g times it; kept once per entry."""
    return inv_rms(x).squeeze(-1)


def gated(cfg: ModelConfig) -> bool:
    """Whether the variant has input-dependent gates (v3, dca): then the stack keeps 1/RMS per entry."""
    return cfg.options.grn in ("v3", "dca")


@dataclass
class DCAState:
    """The stack, and what the current block's attention leaves for its MLP.

    The attention mixer's read returns a state carrying ``x`` and ``coef`` (computed once, used by
    the attention's write and by the MLP mixer); every write returns a fresh state.
    """

    entries: list[Tensor]  # [batch, pos, d_model] each: embedding, (sum of older outputs), last outputs
    inv_rms: list[Tensor]  # [batch, pos] each (v3/dca only, else empty)
    x: Tensor | None = None  # the GRN output this block's attention was built on (set by read)
    coef: Tensor | None = None  # its per-entry coefficients (for the MLP's delta-basis weights)
    attn_out: Tensor | None = None
    h: Tensor | None = None  # the MLP's input: x + attn_out

    def stacked(self) -> tuple[Tensor, Tensor | None]:
        """The stack [entry, batch, pos, d_model] and its 1/RMS [entry, batch, pos] (None if ungated)."""
        return torch.stack(self.entries), torch.stack(self.inv_rms) if self.inv_rms else None

    def attn_written(self, out: Tensor) -> DCAState:
        """The state after the block's attention wrote ``out``: the MLP reads x + out."""
        return DCAState(self.entries, self.inv_rms, self.x, self.coef, out, self.x + out)


def gates(w: Tensor, stack: Tensor, inv: Tensor) -> Tensor:
    """The gates relu(w . N(g_i)) of every stack entry: [entry, batch, pos(, view)] for w [d_model(, view)].

    Computed once for all three views of a DCA attention (w [d_model, view]).
    """
    logits = stack @ w * (inv if w.ndim == 1 else inv[..., None])
    return logits.clamp(min=0)  # relu with gradient 1 at 0, so that w can leave its zero init


class GRN:
    """One generalized residual network over a stack of ``n`` entries (a mixin of an nn.Module).

    Parameters ``b`` ([entry] for v1, [entry, d_model] otherwise, init 1) and, for v3, ``w``
    ([d_model], init 0: the gate starts at relu(0) = 0) with the gate hook ``hook_gate``.
    """

    decayed = ("w",)  # the gate's projection is the dynamic part; the static b keeps its init

    def init_grn(self, variant: Variant, n: int, d_model: int) -> None:
        """Create b (ones: [n] for v1, [n, d_model] otherwise) and, for v3, w (zeros) and ``hook_gate``."""
        self.variant = variant
        self.b = nn.Parameter(torch.ones(n) if variant == "v1" else torch.ones(n, d_model))
        if variant == "v3":
            self.w = nn.Parameter(torch.zeros(d_model))
            self.hook_gate = HookPoint()  # [batch, pos, entry]

    def mix(self, stack: Tensor, inv: Tensor | None, gate: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(g [batch, pos, d_model], per-entry coefficients) from stack [entry, batch, pos, d_model].

        Coefficients: [entry] (v1), [entry, d_model] (v2), [entry, batch, pos, d_model] (v3).
        ``gate`` may be given precomputed (DCA computes its three views' gates in one product).
        """
        if self.variant == "v1":
            return torch.einsum("n,nbpd->bpd", self.b, stack), self.b
        if self.variant == "v2":
            return (self.b[:, None, None, :] * stack).sum(0), self.b
        gate = gates(self.w, stack, inv) if gate is None else gate  # [entry, batch, pos]
        self.hook_gate(rearrange(gate, "entry batch pos -> batch pos entry"))
        coef = self.b[:, None, None, :] + gate[..., None]
        return (coef * stack).sum(0), coef


def delta_weights(coef: Tensor, index: Tensor, like: Tensor, extra: int = 0) -> Tensor:
    """Per-entry coefficients -> delta-basis weights [batch, pos, source(, d_model)], with ``extra``
    more sources of weight 1 at the end (the MLP's own block attention).

    v3's weights are gathered source-major (each source's [batch, pos, d_model] contiguous, as the
    capture engine holds the sources) and returned as a [batch, pos, source, d_model] view of that.
    """
    batch_pos = like.shape[:-1]
    if coef.ndim == 3 + 1:  # v3: [entry, batch, pos, d_model]
        w = coef.index_select(0, index)
        if extra:
            w = torch.cat([w, w.new_ones(extra, *w.shape[1:])])
        return w.permute(1, 2, 0, 3)
    w = coef[index]  # v1 [source], v2 [source, d_model]
    if extra:
        w = torch.cat([w, w.new_ones(extra, *w.shape[1:])])
    return w.expand(*batch_pos, *w.shape)


class GRNMixer(GRN, Mixer):
    """A single GRN over the stack: the attention consumer of v1/v2/v3, and every read-out."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        self.init_grn(
            "v3" if gated(cfg) else cfg.options.grn, len(stack_layout(cfg, site.block)), cfg.d_model
        )
        self.register_buffer("index", torch.tensor(entry_of_source(cfg, site.block)), persistent=False)

    def read(self, state: DCAState) -> tuple[Tensor, DCAState]:
        """The GRN output g = sum_i c_i (*) g_i over the stack (v1, v2: c_i = b_i; v3: b_i + relu(w.N(g_i))).

        The returned state carries g and the c_i: the MLP's skip and the base of its weights.
        """
        x, coef = self.mix(*state.stacked())
        self.emit(lambda: delta_weights(coef, self.index, x))
        return self.hook_in(x), replace(state, x=x, coef=coef)  # the MLP's skip and its weights

    def write(self, state: DCAState, out: Tensor) -> DCAState:
        """Keep the attention output: the MLP reads x_t + attn_out (only attention consumers write)."""
        return state.attn_written(out)


class GRNView(GRN, Port):
    """One of the three GRN-v3 of a DCA attention: its own parameters, input and weights hooks."""

    def __init__(self, n: int, d_model: int):
        super().__init__()
        self.init_grn("v3", n, d_model)


class DCAAttentionMixer(ViewsMixer):
    """Three independent GRN-v3 (views q, k, v) give the attention's query, key and value inputs."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        n = len(stack_layout(cfg, site.block))
        self.q, self.k, self.v = (GRNView(n, cfg.d_model) for _ in range(3))
        self.register_buffer("index", torch.tensor(entry_of_source(cfg, site.block)), persistent=False)

    def read(self, state: DCAState) -> tuple[tuple[Tensor, Tensor, Tensor], DCAState]:
        """The (query, key, value) inputs: three GRN-v3 over the same stack, their gates in one product.

        The query GRN's output and coefficients go on in the state as the MLP's skip (Sec. 3, Fig. 4).
        """
        stack, inv = state.stacked()
        views = (self.q, self.k, self.v)
        gate = gates(torch.stack([view.w for view in views], dim=-1), stack, inv)  # [entry, batch, pos, view]
        out, mixed = [], []
        for i, view in enumerate(views):
            x, coef = view.mix(stack, inv, gate[..., i])
            view.emit(lambda coef=coef, x=x: delta_weights(coef, self.index, x))
            out.append(view.hook_in(x))
            mixed.append((x, coef))
        x, coef = mixed[0]  # the query input is the MLP's skip
        return tuple(out), replace(state, x=x, coef=coef)

    def write(self, state: DCAState, out: Tensor) -> DCAState:
        """Keep the attention output: the MLP reads x_t + attn_out, x_t the query GRN's output."""
        return state.attn_written(out)


class SkipMixer(Mixer):
    """The MLP consumer: its block's GRN output plus the attention output; writes f_t to the stack."""

    def __init__(self, cfg: ModelConfig, site: Site):
        super().__init__(cfg, site)
        self.k = cfg.options.k
        self.gated = gated(cfg)
        self.register_buffer("index", torch.tensor(entry_of_source(cfg, site.block)), persistent=False)

    def read(self, state: DCAState) -> tuple[Tensor, DCAState]:
        """The MLP reads x_t + attn_out: weights x_t's coefficients, plus 1 on this block's attention."""
        self.emit(lambda: self._weights(state))
        return self.hook_in(state.h), state

    def _weights(self, state: DCAState) -> Tensor:
        return delta_weights(state.coef, self.index, state.h, extra=1)  # + 1 on this block's attn output

    def write(self, state: DCAState, out: Tensor) -> DCAState:
        """Push f_t = attn_out + mlp_out on the stack; in k-DCA the oldest kept output may join the sum."""
        f = state.attn_out + out
        entries = state.entries + [f]
        inv = state.inv_rms + [entry_inv_rms(f)] if self.gated else []
        if self.k is not None and len(entries) > self.k + 2:  # the oldest kept output joins the sum
            total = entries[1] + entries[2]
            entries = [entries[0], total] + entries[3:]
            if self.gated:
                inv = [inv[0], entry_inv_rms(total)] + inv[3:]
        return DCAState(entries, inv)


@register
class DCA(Scheme):
    """DeepCrossAttention: GRN-v1/v2/v3 and DCA, full or k-DCA (arXiv 2502.06785, Sec. 3, Fig. 4)."""

    name = "dca"
    paper = "arXiv 2502.06785: DeepCrossAttention: Supercharging Transformer Residual Connections"
    Options = DCAOptions
    variants = {
        "dca": {},
        "dca-k2": {"k": 2},
        "grn-v1": {"grn": "v1"},
        "grn-v2": {"grn": "v2"},
        "grn-v3": {"grn": "v3"},
    }
    static = {"grn": ("v1", "v2")}  # static b only; v3 and dca add input-dependent gates

    @classmethod
    def views(cls, options: DCAOptions, kind: str) -> tuple[str, ...]:
        """The attention of dca reads three inputs, q, k and v; every other consumer one."""
        return ("q", "k", "v") if options.grn == "dca" and kind == names.ATTN else ()

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Refuse an unknown GRN variant, and a k that is neither None nor a positive integer."""
        opts = cfg.options
        if opts.grn not in typing.get_args(Variant):
            choices = ", ".join(typing.get_args(Variant))
            raise ConfigError(f"dca grn must be one of {choices}, got {opts.grn!r}")
        if opts.k is not None and (isinstance(opts.k, bool) or not isinstance(opts.k, int) or opts.k < 1):
            raise ConfigError(f"dca k must be a positive integer or none, got {opts.k!r}")

    @classmethod
    def start(cls, cfg: ModelConfig, x0: Tensor, track: bool) -> DCAState:
        """The stack G_0 = [x] (the embedding), with its inverse RMS for the gated variants (v3, dca)."""
        return DCAState([x0], [entry_inv_rms(x0)] if gated(cfg) else [])

    @classmethod
    def mixer(cls, cfg: ModelConfig, site: Site) -> Mixer | ViewsMixer:
        """A ``SkipMixer`` for each MLP, the three-view ``DCAAttentionMixer`` for dca's attention, and a
        single ``GRNMixer`` for the other attentions and every read-out (a v3 for dca's).
        """
        if site.kind == names.MLP:
            return SkipMixer(cfg, site)
        if site.kind == names.ATTN and cfg.options.grn == "dca":
            return DCAAttentionMixer(cfg, site)
        return GRNMixer(cfg, site)
