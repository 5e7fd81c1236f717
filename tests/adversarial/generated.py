"""Random models with a ground truth by construction, for the adversarial harness (``harness.py``).

THE RECIPE. A ``Recipe`` describes a small decoder: a width d, one or two embeddings (a token
embedding [batch, pos, d], sometimes scaled by sqrt(d) in the stream as Gemma does; optionally a
position embedding computed on ``arange(pos)``, shape [pos, d], learned or sinusoidal, sometimes
called before the token embedding), layers of sublayers (a causal token mixer: attention with
QK-norm, sliding-window attention or a diagonal linear recurrence, keyed ``attn`` / ``swa`` /
``ssm``; an MLP keyed ``mlp``; or both, sequential or parallel, a parallel pair sometimes reading
one shared norm), norms on the reads (LayerNorm or RMSNorm as the read point, or none: the sublayer
module itself reads the raw mixture, and a parallel pair's second read then comes after the first
write), and how every consumer mixes the sources written before it. ``GenModel`` builds the model;
during its own forward it records through the ``Recorder`` what it really wrote and what each
consumer really mixed, from its own parameters, and its ``ModelSpec`` is ``spec_of(recipe, model)``
(labels ``embed``, ``embed.wpe``, ``{i}.{key}``, ``{i}.block``, ``readout``; the context from
``model.block_size``, from ``ModelSpec(ctx=)``, or from nothing but the ids).

Sources are increments (each sublayer's output: a residual stream) or whole states (each layer's
output, DenseFormer-style: the layer module is the write, key ``block``). Mixing kinds:

* ``unit``: the plain residual (increments: weight 1 on every source, sqrt(d) on a scaled token
  embedding; states: 1 on the latest state, 0 on the others);
* ``static``: random scalars (magnitude 0.3..1.5, a fifth negative), DenseFormer's DWA;
* ``near1``: the ``unit`` weights plus uniform noise in +-0.02 (a scaled residual near its init);
* ``softmax``: per-token scalars, AttnRes: softmax over sources of q . rmsnorm(source);
* ``softmax0``: the same at AttnRes's init, q = 0: uniform weights, static in effect;
* ``sigmoid``: per-token scalars, a highway-like gate: 2 sigmoid(G rmsnorm(sum of sources) + b);
* ``feature``: per-source vectors over d (DCA's GRN-like), static. They must be refused unless the
  recipe declares the read key in ``ModelSpec(weights={key: fn})``; ``fn`` (``GenModel.declared``)
  then returns the ground truth of every consumer of that key, whatever its kind, computed from the
  sources it is given as the model computes it.

An in-place recipe keeps the plain stream as one tensor, the token embedding's own output, updated
with ``*=`` and ``+=``, which its unit consumers read.

Planted defects (at most one a recipe, at layer ``defect_layer``): ``dup`` (an Identity after a
write, named as a second write: a duplicate), ``state`` (a whole state named beside the increments
inside it: increments mode names an Identity on the plain stream after the layer as ``block``;
states mode names every sublayer's output beside the layer outputs), ``unnamed`` (an MLP of the
token embedding added with weight 1 to every later read, never named), ``zero`` (a sublayer whose
output projection is zero: a zero source; increments mode only). Two more come from the draw
itself: per-feature weights left undeclared, and per-token weights over n >= d sources.

THE DRAW (``recipes()``; choices by ``sampled_from`` over weighted lists, which hypothesis draws
about uniformly where its bounded ``integers`` favour the low end). Per recipe: dtype float32 70%,
float64, bfloat16, float16 10% each; d in 4..8 25%, 9..24 45%, 25..48 30%; increments 75%, states
25%; a planted defect 25% (dup, state, unnamed and, with increments, zero, alike); a mixing style
(plain 35%, static/near1 20%, per-token 20%, mixed 25%: each consumer unit 3 : static 2 : near1 2 :
softmax 2 : softmax0 1 : sigmoid 2 : feature 2); the token mixer attn 60%, swa, ssm 20% each; 1..4
layers, each with both sublayers 60% (30% of those parallel, half of those with a shared norm),
the token mixer alone 20%, the MLP alone 20% (states: every layer alike); norms LayerNorm 40%,
RMSNorm 30%, none 30%; a position embedding none 40%, learned 40%, sinusoidal 20% (called first
30%); each read key with a per-feature consumer declared 60%, any other 5%; ctx from the model
50%, from the spec 25%, from nothing 25%; ``ModelSpec(embed="wte")`` as one string 10% of
one-embedding recipes; in place 25% of increments recipes; sqrt(d)-scaled token embedding 15%;
vocab 16, 64 or 257; batch 1..4 x positions 4..16.

EXPECTED, by construction (``expected``; the model measured on the tokens the harness captures).
A model whose own sources or reads are not finite there is refused (0). Otherwise each consumer c
has n named sources written before its read (what depthscope offers it: the embeddings, then the
writes by the time they return); its effective weights over them are the model's (0 for a named
source it does not mix). Its verdict, the first rule that applies:

1. c mixes an unnamed write -> refused (declared or not: nothing rebuilds its input);
2. c's key is declared -> ``either`` if a dup/state/zero source is before it, else exact;
3. ``feature`` weights, undeclared -> refused;
4. effective weights all exactly 1 (in the model's dtype) -> exact, or ``either`` if a zero source is
   before it (a zero source's weight is not determined; the unit convention gives it 1);
5. a dup, state or zero source before it: per-token weights -> refused; static weights -> refused,
   except a state whose layer input had per-token/feature weights (over the probe's tokens that
   state is not a static combination of the rest, so static weights are determined) -> ``either``;
6. per-token weights (softmax, sigmoid): n >= d -> refused; else exact when n <= d // 2
   (``TOKEN_MARGIN``) and the per-token fit is precise (``fit_errors``), else ``either``;
7. unit or static weights (softmax0 too): exact when the static fit over the probe's 16 tokens is
   precise (``fit_errors``), else ``either``. Such fits are overdetermined many times over, so the
   evidence decides between unit and static weights even within 0.02 of 1 in bfloat16.

"Precise" (``fit_errors``): least squares from values rounded to the model's dtype (each term
w_k x_k and the input rounded once, independently; ``NOISE``) predicts each weight within three
standard deviations of the harness's weight tolerance for that dtype (``TOLERANCES``): for a
static fit over ``PROBE_TOKENS`` tokens, for a per-token fit at the worst token. In float32 and
float64 this only excludes near-dependent sources; in half precision it marks ill-conditioned fits
(DenseFormer states, many sources) ``either``.

The recipe's outcome: refused if any consumer is, else ``either`` if any is, else exact. ``either``
accepts exact or a one-line refusal, never a WRONG number or a CRASH.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from hypothesis import strategies as st
from torch import Tensor, nn

from depthscope import ModelSpec
from tests.adversarial.harness import TOLERANCES, Case, Recorder, tokens_of

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
TOKEN = ("softmax", "sigmoid")  # per-token weights that vary over tokens (softmax0 does not)
CTX = 32  # every model's context (the probe runs 8 positions, the captures 4..16)
NMAX = 16  # the most sources one mixer mixes
SWA_WINDOW = 4
PROBE_TOKENS = 16  # the tokens depthscope's probe fits static weights on (2 x 8, its docstring)
# the standard deviation of one rounding, relative: uniform over half an ulp either side, the ulp
# taken at its largest (2^-7 relative in bfloat16, 2^-10 in float16, 2^-23, 2^-52)
NOISE = {
    k: 2.0**-bits / math.sqrt(12)
    for k, bits in (("bfloat16", 7), ("float16", 10), ("float32", 23), ("float64", 52))
}


def TOKEN_MARGIN(d: int) -> int:  # noqa: N802 - a rule, named like the constant it stands for
    """The most sources a per-token consumer of width d may have for the recipe to expect EXACT."""
    return d // 2


# --- the recipe ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerRecipe:
    subs: tuple[str, ...]  # sublayer keys in call order: ("attn", "mlp"), ("mlp",), ...
    parallel: bool = False  # both read before either writes (GPT-J)
    shared: bool = False  # parallel with one norm read by both (one consumer; needs a norm)
    # one mixing kind per mixer: one per sublayer; one if the norm is shared, or with states (the
    # layer's input; a parallel second read reads it too)
    mix: tuple[str, ...] = ("unit",)


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    d: int = 16
    dtype: str = "float32"
    layers: tuple[LayerRecipe, ...] = (LayerRecipe(("attn", "mlp"), mix=("unit", "unit")),)
    readout_mix: str = "unit"
    sources: str = "increments"  # or "states"
    pos: str = ""  # "", "learned" or "sinusoidal"
    pos_first: bool = False
    norm: str = "layer"  # "layer", "rms" or "none" (the sublayer itself is the read point)
    heads: int = 1
    vocab: int = 64
    batch: int = 4
    positions: int = 16
    declared: tuple[str, ...] = ()  # read keys whose weights ModelSpec(weights=) gives
    defect: str = ""  # "", "dup", "state", "unnamed", "zero"
    defect_layer: int = 0
    ctx_hint: str = "attr"  # "attr" (model.block_size), "spec" (ModelSpec(ctx=)) or "none"
    embed_str: bool = False  # ModelSpec(embed="wte") rather than ["wte"]
    inplace: bool = False
    embed_scale: bool = False  # the stream starts from sqrt(d) * the token embedding (Gemma)

    def describe(self) -> str:
        """A compact one-line description."""
        layers = " | ".join(
            ("+" if lr.parallel else ">").join(lr.subs)
            + ("(shared)" if lr.shared else "")
            + ":"
            + ",".join(lr.mix)
            for lr in self.layers
        )
        extras = [
            f"pos={self.pos}{'(first)' if self.pos_first else ''}" if self.pos else "",
            f"declared={','.join(self.declared)}" if self.declared else "",
            f"defect={self.defect}@{self.defect_layer}" if self.defect else "",
            f"ctx={self.ctx_hint}",
            "embed=str" if self.embed_str else "",
            "inplace" if self.inplace else "",
            "embed*sqrt(d)" if self.embed_scale else "",
            f"vocab={self.vocab}",
        ]
        return (
            f"seed={self.seed} d={self.d} {self.dtype} {self.sources} norm={self.norm} heads={self.heads} "
            f"[{self.batch}x{self.positions}] layers: {layers} | readout:{self.readout_mix} "
            + " ".join(e for e in extras if e)
        )


# --- modules -----------------------------------------------------------------------------------------


def _rmsnorm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class TokenMixer(nn.Module):
    """Causal token mixing: attention with QK-norm (``attn``), sliding-window attention (``swa``) or
    a diagonal linear recurrence y_t = sum_{j<=t} lambda^(t-j) v_j gated by q (``ssm``)."""

    def __init__(self, kind: str, d: int, heads: int):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        if kind == "ssm":
            self.decay = nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, -1)
        i = torch.arange(t, device=x.device)
        gap = i[:, None] - i[None, :]  # t - j
        if self.kind == "ssm":
            lam = torch.sigmoid(self.decay)
            kernel = lam ** gap.clamp_min(0)[..., None].to(x.dtype) * (gap >= 0)[..., None].to(x.dtype)
            y = torch.einsum("tjd,bjd->btd", kernel, v) * torch.sigmoid(q)
            return self.proj(y)
        h = self.heads  # QK-norm: the scores stay bounded however large a raw read's input grows
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (_rmsnorm(q), _rmsnorm(k), v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
        allowed = gap >= 0
        if self.kind == "swa":
            allowed = allowed & (gap < SWA_WINDOW)
        scores = scores.masked_fill(~allowed, float("-inf"))
        y = torch.softmax(scores, -1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc, self.proj = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(nn.functional.gelu(self.fc(x)))


class Sinusoidal(nn.Module):
    """A position embedding with no parameters: sin/cos of the positions it is given, [pos, d]."""

    def __init__(self, d: int, dtype: torch.dtype):
        super().__init__()
        self.d, self.dtype = d, dtype

    def forward(self, positions: Tensor) -> Tensor:
        half = (self.d + 1) // 2
        freq = torch.exp(-math.log(100.0) * torch.arange(half, dtype=torch.float64) / half)
        angle = positions.double()[:, None] * freq[None, :]
        return torch.cat([angle.sin(), angle.cos()], -1)[:, : self.d].to(self.dtype)


class Mixer(nn.Module):
    """One consumer's weights over the sources it mixes (see the module docstring for the kinds)."""

    def __init__(self, kind: str, d: int):
        super().__init__()
        self.kind = kind
        self.w = nn.Parameter(torch.zeros(NMAX))  # static
        self.eps = nn.Parameter(torch.zeros(NMAX))  # near1
        self.q = nn.Parameter(torch.zeros(d))  # softmax
        self.g = nn.Parameter(torch.zeros(NMAX, d))  # sigmoid
        self.gb = nn.Parameter(torch.zeros(NMAX))
        self.f = nn.Parameter(torch.zeros(NMAX, d))  # feature

    def weights(self, stack: Tensor, base: Tensor, zero: Tensor) -> Tensor:
        """Weights over ``stack`` [n, batch, pos, d]: [n] (unit, static), [batch, pos, n] (per token)
        or [n, d] (feature). ``base`` [n]: the unit weights; ``zero`` [n]: the zero sources (their
        static weight is the unit one, so that a unit fit is never wrong about them)."""
        n = stack.shape[0]
        if self.kind == "unit":
            return base
        if self.kind in ("static", "near1"):
            w = self.w[:n] if self.kind == "static" else base + self.eps[:n]
            return torch.where(zero, base, w)
        if self.kind in ("softmax", "softmax0"):
            return torch.softmax(torch.einsum("nbpd,d->bpn", _rmsnorm(stack), self.q), -1)
        if self.kind == "sigmoid":
            state = _rmsnorm(stack.sum(0))
            return 2 * torch.sigmoid(torch.einsum("bpd,nd->bpn", state, self.g[:n]) + self.gb[:n])
        return self.f[:n]

    def init(self, g: torch.Generator, d: int) -> None:
        def rand(*shape):
            return torch.rand(*shape, generator=g, dtype=torch.float64)

        def randn(*shape):
            return torch.randn(*shape, generator=g, dtype=torch.float64)

        with torch.no_grad():
            sign = torch.where(rand(NMAX) < 0.2, -1.0, 1.0)
            self.w.copy_(sign * (0.3 + 1.2 * rand(NMAX)))
            self.eps.copy_(0.04 * rand(NMAX) - 0.02)
            self.q.copy_(randn(d) / math.sqrt(d) if self.kind == "softmax" else torch.zeros(d))
            self.g.copy_(randn(NMAX, d) / math.sqrt(d))
            self.gb.copy_(0.5 * randn(NMAX))
            self.f.copy_(1 + 0.5 * randn(NMAX, d))


class Layer(nn.Module):
    """One layer's modules: sublayers by key, their norms (``ln_KEY``, or ``ln`` shared), mixers."""

    def __init__(self, recipe: Recipe, lr: LayerRecipe):
        super().__init__()
        d = recipe.d
        for key in lr.subs:
            self.add_module(key, MLP(d) if key == "mlp" else TokenMixer(key, d, recipe.heads))
        if recipe.norm != "none":
            names = ["ln"] if lr.shared else [f"ln_{k}" for k in lr.subs]
            for name in names:
                self.add_module(name, nn.LayerNorm(d) if recipe.norm == "layer" else nn.RMSNorm(d, eps=1e-6))
        self.mixers = nn.ModuleList(Mixer(m, d) for m in lr.mix)
        self.lr = lr
        self.ctx: _Forward | None = None  # the model's forward state while a states-mode layer runs

    def forward(self, x: Tensor, mix: _Mix) -> Tensor:
        """States mode: the layer's output (a whole state) from its input ``x`` (``mix.h``)."""
        assert self.ctx is not None
        return self.ctx.run_state_layer(self, x, mix)


# --- the model ---------------------------------------------------------------------------------------


@dataclass
class Entry:
    """A source the model wrote (named in the spec or not) and how later mixers use it."""

    label: str
    value: Tensor  # [batch, pos, d] or [pos, d], never changed after it is written
    named: bool = True
    gated: bool = True  # mixed with the mixers' weights
    fixed: bool = False  # mixed with weight 1 by every later mixer (an unnamed write)
    defect: str = ""  # "dup", "state", "zero"
    unit: float = 1.0  # its weight in the plain stream (the scaled token embedding's: sqrt(d))
    static_dep: bool = True  # a state: a static combination of the named sources (its layer's input was)


@dataclass
class Plan:
    """One consumer as the model built it: what depthscope sees and the ground truth."""

    label: str
    key: str
    index: int | None
    kind: str
    names: list[str]  # the named sources written before its read (depthscope's view)
    gated: list[int]  # for each source it mixes with its weights, its position in ``names``
    unit_weights: list[float]  # the unit weights of those
    zero: list[bool]
    unit: bool  # every effective weight over ``names`` is exactly 1
    unnamed: bool  # it mixes an unnamed write
    defects: set[str] = field(default_factory=set)  # dup/state/zero sources before it
    static_dep: bool = True  # those make its sources dependent over the probe's tokens too
    static_error: float = math.nan  # a static fit's predicted error over its tolerance (``fit_errors``)
    token_error: float = math.nan  # a per-token fit's


@dataclass
class _Mix:
    h: Tensor
    mixer: Mixer
    gated: list[Entry]
    fixed: list[Entry]
    weights: Tensor
    base: Tensor
    zero: Tensor


class _Forward:
    """One forward's state: the sources so far, and the model's bookkeeping of its consumers."""

    def __init__(self, model: GenModel, idx: Tensor):
        self.model, self.r = model, model.recipe
        self.entries: list[Entry] = []
        self.b, self.t = idx.shape
        self.stream: Tensor | None = None  # the plain stream, updated in place (in-place recipes)

    # sources
    def emit(self, label: str, value: Tensor, **kw) -> Entry:
        e = Entry(label, value, **kw)
        self.model.finite &= bool(torch.isfinite(value).all())
        if e.named or e.gated or e.fixed:
            self.model.source(label, value)
        if self.stream is not None and (e.gated or e.fixed) and self.r.sources == "increments":
            self.stream += value
        self.entries.append(e)
        return e

    # consumers
    def mix(self, mixer: Mixer, fresh: bool = False) -> _Mix:
        gated = [e for e in self.entries if e.gated]
        fixed = [e for e in self.entries if e.fixed]
        shape = (self.b, self.t, self.r.d)
        stack = torch.stack([torch.broadcast_to(e.value, shape) for e in gated])
        base = self.model.base(gated, stack.dtype)
        zero = torch.tensor([e.defect == "zero" for e in gated])
        w = mixer.weights(stack, base, zero)
        if mixer.kind == "unit" and self.stream is not None and not fresh:
            h = self.stream  # the in-place stream itself
        else:
            h = combine(w, stack)
            for e in fixed:
                h = h + e.value
        return _Mix(h, mixer, gated, fixed, w, base, zero)

    def read(self, label: str | None, key: str, index: int | None, module: nn.Module, mix: _Mix) -> Tensor:
        """Call the read module on the mixture, recording the consumer (``label`` None: an unnamed
        read inside a layer)."""
        self.model.finite &= bool(torch.isfinite(mix.h).all())
        if label is not None:
            self.model.consumer(label, mix.h, *self.plan(label, key, index, mix))
        return module(mix.h)

    def plan(self, label: str, key: str, index: int | None, mix: _Mix) -> tuple[list[str], Tensor]:
        named = [e for e in self.entries if e.named]
        names = [e.label for e in named]
        pos = {id(e): k for k, e in enumerate(named)}
        gated = [pos[id(e)] for e in mix.gated]
        n = len(names) + len(mix.fixed)
        w, kind = mix.weights.double(), mix.mixer.kind
        if w.ndim == 3:  # per token
            full = torch.zeros(self.b, self.t, n, dtype=torch.float64)
            full[..., gated] = w
            full[..., len(names) :] = 1
        else:  # [n] or [n, d]
            full = torch.zeros(n, *w.shape[1:], dtype=torch.float64)
            full[gated] = w
            full[len(names) :] = 1
        unit = kind != "feature" and not mix.fixed and bool((full == 1).all())
        if kind == "feature":
            full = full.expand(self.b, self.t, n, self.r.d)
        before = {e.defect for e in named if e.defect}
        states = [e for e in named if e.defect == "state"]
        self.model.plans[label] = Plan(
            label,
            key,
            index,
            kind,
            names,
            gated,
            [float(x) for x in mix.base],
            [bool(x) for x in mix.zero],
            unit,
            bool(mix.fixed),
            before,
            static_dep=bool(before - {"state"}) or any(e.static_dep for e in states),
        )
        if self.model.measuring and kind != "feature" and not mix.fixed:
            plan = self.model.plans[label]
            values = torch.stack([torch.broadcast_to(e.value, mix.h.shape) for e in named]).double()
            plan.static_error, plan.token_error = fit_errors(
                values, mix.h.double(), full[..., : len(names)], self.r.dtype
            )
        return names + [e.label for e in mix.fixed], full

    # layers
    def run_increments_layer(self, i: int, layer: Layer) -> None:
        lr = layer.lr
        if lr.shared:
            mix = self.mix(layer.mixers[0])
            n = self.read(f"{i}.{lr.subs[0]}", lr.subs[0], i, layer.ln, mix)
            for k in lr.subs:
                self.write(i, k, layer.get_submodule(k)(n))
            return
        # a parallel layer mixes before any write; with raw reads its second read comes after the
        # first write, so it reads a fresh mixture rather than the in-place stream
        fresh = self.r.norm == "none"
        mixes = [self.mix(m, fresh) for m in layer.mixers] if lr.parallel else [None] * len(lr.subs)
        normed: list[Tensor | None] = [None] * len(lr.subs)
        if lr.parallel and self.r.norm != "none":  # every read before any write
            for j, k in enumerate(lr.subs):
                normed[j] = self.read(f"{i}.{k}", k, i, layer.get_submodule(f"ln_{k}"), mixes[j])
        for j, k in enumerate(lr.subs):
            sub = layer.get_submodule(k)
            mix = mixes[j] if lr.parallel else self.mix(layer.mixers[j])
            if normed[j] is not None:
                out = sub(normed[j])
            elif self.r.norm == "none":
                out = self.read(f"{i}.{k}", k, i, sub, mix)
            else:
                out = sub(self.read(f"{i}.{k}", k, i, layer.get_submodule(f"ln_{k}"), mix))
            self.write(i, k, out)

    def write(self, i: int, key: str, out: Tensor) -> None:
        """A sublayer's output, and a planted duplicate of it."""
        r, model = self.r, self.model
        zero = r.defect == "zero" and i == r.defect_layer and key == model.zero_key
        self.emit(f"{i}.{key}", out, defect="zero" if zero else "")
        if r.defect == "dup" and i == r.defect_layer and key == model.dup_key:
            self.emit(f"{i}.{key}.out", model.taps[str(i)](out), gated=False, defect="dup")

    def run_state_layer(self, layer: Layer, x: Tensor, mix: _Mix) -> Tensor:
        """Inside a states-mode layer: its reads (the first, and a parallel second, are consumers
        over the states; a sequential second reads inside the layer, unnamed), its sublayers."""
        lr, i, r = layer.lr, self.model.index_of(layer), self.r
        named = r.defect == "state"  # the increments inside each state are named too

        def sub_out(k: str, y: Tensor, consumer: bool) -> Tensor:
            m = replace(mix, h=y)
            label = f"{i}.{k}" if consumer else None
            if r.norm == "none":
                return self.read(label, k, i, layer.get_submodule(k), m)
            ln = layer.ln if lr.shared else layer.get_submodule(f"ln_{k}")
            return layer.get_submodule(k)(self.read(label, k, i, ln, m))

        if lr.shared:
            n = self.read(f"{i}.{lr.subs[0]}", lr.subs[0], i, layer.ln, mix)
            outs = [layer.get_submodule(k)(n) for k in lr.subs]
            for k, out in zip(lr.subs, outs):
                self.emit(f"{i}.{k}", out, named=named, gated=False)
            return x + sum(outs)
        if lr.parallel:
            if r.norm != "none":  # every read before any write
                ns = [self.read(f"{i}.{k}", k, i, layer.get_submodule(f"ln_{k}"), mix) for k in lr.subs]
                outs = [layer.get_submodule(k)(n) for k, n in zip(lr.subs, ns)]
                for k, out in zip(lr.subs, outs):
                    self.emit(f"{i}.{k}", out, named=named, gated=False)
                return x + sum(outs)
            outs = []
            for k in lr.subs:
                outs.append(sub_out(k, x, True))
                self.emit(f"{i}.{k}", outs[-1], named=named, gated=False)
            return x + sum(outs)
        y = x
        for j, k in enumerate(lr.subs):
            out = sub_out(k, y, j == 0)
            self.emit(f"{i}.{k}", out, named=named, gated=False)
            y = y + out
        return y


def fit_errors(values: Tensor, h: Tensor, w: Tensor, dtype: str) -> tuple[float, float]:
    """How precisely least squares finds the weights ``w`` ([n] or [batch, pos, n]) of ``h`` [batch,
    pos, d] over ``values`` [n, batch, pos, d] (float64) from values rounded to ``dtype``: the
    largest predicted error (three standard deviations) of any weight over the harness's weight
    tolerance, for a static fit over the probe's ``PROBE_TOKENS`` tokens and for a per-token fit
    (at the worst token, no averaging). Rounding noise: each term w_k x_k and the input h rounded
    once, independently, by a standard deviation of ``NOISE[dtype]`` relative; inf where the sources
    are dependent."""
    n, u, tol = values.shape[0], NOISE[dtype], TOLERANCES[DTYPES[dtype]][1]
    wt = w if w.ndim == 3 else w.expand(*h.shape[:2], n)
    terms = wt.permute(2, 0, 1)[..., None] * values  # [n, batch, pos, d]
    var = u * u * (terms.pow(2).sum(0) + h.pow(2))  # [batch, pos, d]
    scale = torch.clamp(wt.abs(), min=1.0) * tol  # [batch, pos, n]

    def worst(a: Tensor, v: Tensor, sc: Tensor, tokens: float) -> float:  # a [..., rows, n]
        s = torch.linalg.svdvals(a)
        if not bool((s[..., -1] > 1e-12 * s[..., 0]).all()):
            return math.inf
        b = torch.linalg.pinv(a)  # [..., n, rows]
        sd = (b.pow(2) * v[..., None, :]).sum(-1).mul(tokens).sqrt()  # [..., n]
        return float((3 * sd / sc).max())

    a = values.reshape(n, -1).T  # [rows, n]
    static = worst(
        a, var.reshape(-1), scale.reshape(-1, n).min(0).values, h.shape[0] * h.shape[1] / PROBE_TOKENS
    )
    token = worst(values.permute(1, 2, 3, 0), var, scale, 1.0)
    return static, token


def combine(w: Tensor, stack: Tensor) -> Tensor:
    """sum_n w_n stack_n for weights [n], [batch, pos, n] or [n, d]."""
    if w.ndim == 1:
        return (w[:, None, None, None] * stack).sum(0)
    if w.ndim == 3:
        return (w.permute(2, 0, 1)[..., None] * stack).sum(0)
    return (w[:, None, None, :] * stack).sum(0)


class GenModel(Recorder):
    """The model a ``Recipe`` describes (see the module docstring)."""

    def __init__(self, recipe: Recipe):
        super().__init__()
        self.recipe = r = recipe
        dtype = DTYPES[r.dtype]
        with torch.random.fork_rng():
            torch.manual_seed(r.seed)
            self.wte = nn.Embedding(r.vocab, r.d)
            if r.pos == "learned":
                self.wpe = nn.Embedding(CTX, r.d)
            elif r.pos == "sinusoidal":
                self.wpe = Sinusoidal(r.d, dtype)
            self.layers = nn.ModuleList(Layer(r, lr) for lr in r.layers)
            self.readout_mixer = Mixer(r.readout_mix, r.d)
            if r.norm != "none":
                self.ln_f = nn.LayerNorm(r.d) if r.norm == "layer" else nn.RMSNorm(r.d, eps=1e-6)
            self.lm_head = nn.Linear(r.d, r.vocab, bias=False)
            self._defect_modules()
            self._init(torch.Generator().manual_seed(r.seed))
        if r.ctx_hint == "attr":
            self.block_size = CTX
        self.to(dtype)
        self.plans: dict[str, Plan] = {}
        self.finite = True  # every source and read of every forward so far is finite
        self.measuring = False  # measure each consumer's fits' precision (``fit_errors``) this forward
        self.eval()
        with torch.no_grad():  # the plans (structure only) and the declared weights' bookkeeping
            self(torch.zeros(2, 8, dtype=torch.long))

    def _defect_modules(self) -> None:
        r = self.recipe
        self.zero_key = self.dup_key = ""
        if not r.defect:
            return
        subs = r.layers[r.defect_layer].subs
        if r.defect == "dup":
            self.dup_key = subs[-1]
            self.taps = nn.ModuleDict({str(r.defect_layer): nn.Identity()})
        elif r.defect == "state" and r.sources == "increments":
            self.outs = nn.ModuleDict({str(r.defect_layer): nn.Identity()})
        elif r.defect == "unnamed":
            self.extras = nn.ModuleDict({str(r.defect_layer): MLP(r.d)})
        elif r.defect == "zero":
            self.zero_key = subs[-1]

    def _init(self, g: torch.Generator) -> None:
        r = self.recipe
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "mixer" in name:  # Mixer.init
                    continue
                if name.startswith(("wte", "wpe")):
                    p.copy_(torch.randn(p.shape, generator=g))
                elif p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
                elif name.endswith("decay"):
                    p.copy_(torch.randn(p.shape, generator=g) + 1.0)
                else:  # biases and norm weights
                    base = 1.0 if ("ln" in name and name.endswith("weight")) else 0.0
                    p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            for m in self.modules():
                if isinstance(m, Mixer):
                    m.init(g, r.d)
            if r.defect == "zero":
                proj = self.layers[r.defect_layer].get_submodule(self.zero_key).proj
                proj.weight.zero_()
                proj.bias.zero_()

    def index_of(self, layer: Layer) -> int:
        return next(i for i, x in enumerate(self.layers) if x is layer)

    def base(self, gated: list[Entry], dtype: torch.dtype) -> Tensor:
        """The unit weights over ``gated``: increments, 1 on every source; states, 1 on the latest
        state (the embeddings while there is none)."""
        states = [k for k, e in enumerate(gated) if e.label.endswith(".block")]
        if self.recipe.sources == "increments" or not states:
            return torch.tensor([e.unit for e in gated], dtype=dtype)
        w = torch.zeros(len(gated), dtype=dtype)
        w[states[-1]] = 1
        return w

    def forward(self, idx: Tensor) -> Tensor:
        r = self.recipe
        f = _Forward(self, idx)
        positions = torch.arange(idx.shape[1], device=idx.device)
        pe = self.wpe(positions) if r.pos and r.pos_first else None
        te = self.wte(idx)
        if r.pos and not r.pos_first:
            pe = self.wpe(positions)
        scale = torch.tensor(math.sqrt(r.d), dtype=te.dtype) if r.embed_scale else None
        f.emit("embed", te.clone() if r.inplace else te, unit=1.0 if scale is None else float(scale))
        if pe is not None:
            f.emit("embed.wpe", pe)
        if r.inplace and r.sources == "increments":
            f.stream = te  # the embedding's own output, updated in place from here on
            if scale is not None:
                te *= scale
            if pe is not None:
                te += pe
        for i, layer in enumerate(self.layers):
            self._layer(f, i, layer)
        mix = f.mix(self.readout_mixer)
        read = self.ln_f if r.norm != "none" else self.lm_head
        out = f.read("readout", "readout", None, read, mix)
        return self.lm_head(out) if r.norm != "none" else out

    def _layer(self, f: _Forward, i: int, layer: Layer) -> None:
        r = self.recipe
        if r.sources == "increments":
            f.run_increments_layer(i, layer)
        else:
            mix = f.mix(layer.mixers[0])
            layer.ctx = f
            try:
                state = layer(mix.h, mix)
            finally:
                layer.ctx = None
            f.emit(f"{i}.block", state, static_dep=layer.lr.mix[0] not in (*TOKEN, "feature"))
            if r.defect == "dup" and i == r.defect_layer:
                f.emit(f"{i}.block.out", self.taps[str(i)](state), gated=False, defect="dup")
        if r.defect == "state" and i == r.defect_layer and r.sources == "increments":
            plain = sum(torch.broadcast_to(e.value, (f.b, f.t, r.d)) for e in f.entries if e.gated or e.fixed)
            f.emit(f"{i}.block", self.outs[str(i)](plain), gated=False, defect="state")
        if r.defect == "state" and r.sources == "states":
            f.entries[-1].defect = "state"
        if r.defect == "unnamed" and i == r.defect_layer:
            clean = f.entries[0].value
            f.emit(f"{i}.extra", self.extras[str(i)](clean), named=False, gated=False, fixed=True)

    # the declared weights
    def declared(self, key: str) -> Callable[[int | None, Tensor, Tensor], Tensor]:
        """``ModelSpec(weights={key: fn})``'s fn: the ground truth of every consumer of ``key``,
        computed from the sources it is given as the model computes it."""

        @torch.no_grad()
        def fn(index: int | None, sources: Tensor, h: Tensor) -> Tensor:
            plan = self.plans[key if index is None else f"{index}.{key}"]
            mixer = self._mixer_of(plan)
            dtype = DTYPES[self.recipe.dtype]
            stack = sources.to(dtype)[plan.gated]
            base = torch.tensor(plan.unit_weights, dtype=dtype)
            w = mixer.weights(stack, base, torch.tensor(plan.zero)).detach().to(sources.dtype)
            n = sources.shape[0]
            if w.ndim == 3:  # per token
                full = torch.zeros(*sources.shape[1:3], n, dtype=w.dtype)
                full[..., plan.gated] = w
            elif mixer.kind == "feature":
                full = torch.zeros(n, sources.shape[-1], dtype=w.dtype)
                full[plan.gated] = w
            else:
                full = torch.zeros(n, dtype=w.dtype)
                full[plan.gated] = w
            return full.detach()

        return fn

    def _mixer_of(self, plan: Plan) -> Mixer:
        if plan.index is None:
            return self.readout_mixer
        layer = self.layers[plan.index]
        if len(layer.mixers) == 1:
            return layer.mixers[0]
        return layer.mixers[layer.lr.subs.index(plan.key)]


# --- the spec, the expected outcome, the case -----------------------------------------------------------


def spec_of(recipe: Recipe, model: GenModel) -> ModelSpec:
    """The recipe's ModelSpec: its writes (and a planted defect's), the reads of its consumers."""
    r = recipe
    used = list(dict.fromkeys(k for lr in r.layers for k in lr.subs))
    if r.sources == "increments":
        writes: dict[str, list[str] | str] = {k: f"layers.*.{k}" for k in used}
        if r.defect == "state":
            writes["block"] = "outs.*"
        if r.defect == "dup":
            writes[f"{model.dup_key}.out"] = "taps.*"
    else:
        writes = {"block": "layers.*"}
        if r.defect == "state":
            writes.update({k: f"layers.*.{k}" for k in used})
        if r.defect == "dup":
            writes["block.out"] = "taps.*"
    reads: dict[str, list[str] | str] = {}
    for plan in model.plans.values():
        if plan.index is None:
            continue
        layer = model.layers[plan.index]
        module = plan.key if r.norm == "none" else ("ln" if layer.lr.shared else f"ln_{plan.key}")
        pattern = f"layers.*.{module}"
        reads.setdefault(plan.key, [])
        if pattern not in reads[plan.key]:
            reads[plan.key].append(pattern)
    reads["readout"] = "ln_f" if r.norm != "none" else "lm_head"
    embed = ["wte", "wpe"] if r.pos else ("wte" if r.embed_str else ["wte"])
    return ModelSpec(
        embed=embed,
        writes=writes,
        reads=reads,
        ctx=CTX if r.ctx_hint == "spec" else None,
        weights={k: model.declared(k) for k in r.declared},
    )


def consumer_expected(recipe: Recipe, plan: Plan) -> tuple[str, str]:
    """One consumer's expected verdict and the rule that decides it (the module docstring's)."""
    if plan.unnamed:
        return "refused", "1 unnamed write"
    if plan.key in recipe.declared:
        return ("either", "2 declared, dependent sources") if plan.defects else ("exact", "2 declared")
    if plan.kind == "feature":
        return "refused", "3 per-feature, undeclared"
    if plan.unit:
        return ("either", "4 unit over a zero source") if "zero" in plan.defects else ("exact", "4 unit")
    if plan.defects:
        if plan.kind in TOKEN or plan.static_dep:
            return "refused", f"5 dependent sources ({'/'.join(sorted(plan.defects))})"
        return "either", "5 a state after per-token weights, static fit"
    if plan.kind in TOKEN:
        return _token_expected(recipe, plan)
    if not plan.static_error <= 1:
        return "either", "7 static, imprecise on the probe's tokens"
    return "exact", "7 unit or static"


def _token_expected(recipe: Recipe, plan: Plan) -> tuple[str, str]:
    n, d = len(plan.names), recipe.d
    if n >= d:
        return "refused", "6 per-token, n >= d"
    if not plan.token_error <= 1:
        return "either", "6 per-token, imprecise"
    if n <= TOKEN_MARGIN(d):
        return "exact", "6 per-token, n <= d/2"
    return "either", "6 per-token, d/2 < n < d"


def expected(recipe: Recipe, model: GenModel) -> tuple[str, list[str]]:
    """The recipe's expected outcome (refused, either or exact: the module docstring's rule) and the
    rules that decide it (those of its consumers with that verdict), from ``model`` measured on the
    captured tokens (``generate``)."""
    if not model.finite:  # the model overflows in its own precision: nothing of it can be read
        return "refused", ["0 overflow"]
    verdicts = [consumer_expected(recipe, p) for p in model.plans.values()]
    got = {v for v, _ in verdicts}
    outcome = "refused" if "refused" in got else "either" if "either" in got else "exact"
    return outcome, sorted({why for v, why in verdicts if v == outcome})


@dataclass
class Generated:
    """A recipe's model (built once: the case's ``build`` gives it), its harness case, its expected
    outcome and the rules that decide it."""

    case: Case
    model: GenModel
    want: str
    why: list[str]


def generate(recipe: Recipe) -> Generated:
    """Build a recipe's model, run it on the tokens the harness captures (its overflow, its fits'
    precision), and its case."""
    model = GenModel(recipe)
    case = Case(
        recipe.describe(),
        f"generated.{recipe.sources}",
        lambda: model,
        lambda m: spec_of(recipe, m),
        vocab=recipe.vocab,
        shape=(recipe.batch, recipe.positions),
    )
    model.measuring = True
    with torch.no_grad():
        model(tokens_of(case))
    model.measuring = False
    want, why = expected(recipe, model)
    case.expect = "refused" if want == "refused" else "exact"
    return Generated(case, model, want, why)


# --- the strategies ------------------------------------------------------------------------------------


def _weighted(draw, options: list[tuple[int, object]]):
    """One of ``options`` (weight, value). Choices are drawn with ``sampled_from``, which hypothesis
    draws about uniformly (its bounded ``integers`` favour the low end: 0 about 40% of the time)."""
    return draw(st.sampled_from([value for weight, value in options for _ in range(weight)]))


def _chance(draw, k: int, n: int) -> bool:
    """True with probability k / n (False what hypothesis favours and shrinks to)."""
    return draw(st.sampled_from(range(n))) >= n - k


def _between(draw, lo: int, hi: int) -> int:
    return draw(st.sampled_from(range(lo, hi + 1)))


def _layer_recipe(draw, sources: str, norm: str, mix_kind: Callable[[], str], key: str) -> LayerRecipe:
    subs = _weighted(draw, [(6, (key, "mlp")), (2, (key,)), (2, ("mlp",))])
    parallel = len(subs) == 2 and _chance(draw, 3, 10)
    shared = parallel and norm != "none" and draw(st.booleans())
    count = 1 if sources == "states" or shared else len(subs)
    return LayerRecipe(subs, parallel, shared, tuple(mix_kind() for _ in range(count)))


def consumer_keys(sources: str, lr: LayerRecipe) -> list[tuple[str, int]]:
    """A layer's consumers: (read key, index of the mixer it reads)."""
    if lr.shared:
        return [(lr.subs[0], 0)]
    if sources == "states":
        return [(k, 0) for k in (lr.subs if lr.parallel else lr.subs[:1])]
    return [(k, j) for j, k in enumerate(lr.subs)]


@st.composite
def recipes(draw) -> Recipe:
    """A random recipe (see the module docstring)."""
    dtype = _weighted(draw, [(14, "float32"), (2, "float64"), (2, "bfloat16"), (2, "float16")])
    d = _between(draw, *_weighted(draw, [(9, (9, 24)), (6, (25, 48)), (5, (4, 8))]))
    sources = _weighted(draw, [(3, "increments"), (1, "states")])
    kinds = ("dup", "state", "unnamed") + (("zero",) if sources == "increments" else ())
    defect = _weighted(draw, [(6 * len(kinds), "")] + [(2, k) for k in kinds])  # a quarter planted
    style = _weighted(draw, [(7, "plain"), (4, "static"), (4, "token"), (5, "mixed")])
    styles = {
        "plain": [(1, "unit")],
        "static": [(2, "static"), (1, "near1")],
        "token": [(2, "softmax"), (2, "sigmoid"), (1, "softmax0")],
        "mixed": [
            (3, "unit"),
            (2, "static"),
            (2, "near1"),
            (2, "softmax"),
            (1, "softmax0"),
            (2, "sigmoid"),
            (2, "feature"),
        ],
    }[style]

    def mix_kind():
        return _weighted(draw, styles)

    key = _weighted(draw, [(3, "attn"), (1, "swa"), (1, "ssm")])
    n_layers = _between(draw, 1, 4)
    norm = _weighted(draw, [(4, "layer"), (3, "rms"), (3, "none")])
    if sources == "states":  # DenseFormer: every layer alike, its own weights
        one = _layer_recipe(draw, sources, norm, mix_kind, key)
        layers = (one, *(replace(one, mix=(mix_kind(),)) for _ in range(n_layers - 1)))
    else:
        layers = tuple(_layer_recipe(draw, sources, norm, mix_kind, key) for _ in range(n_layers))
    readout = mix_kind()
    pos = _weighted(draw, [(4, ""), (4, "learned"), (2, "sinusoidal")])
    heads = draw(st.sampled_from([h for h in (1, 2, 4) if d % h == 0]))
    keys = {k for lr in layers for k in lr.subs} | {"readout"}
    featured = {k for lr in layers for k, j in consumer_keys(sources, lr) if lr.mix[j] == "feature"}
    featured |= {"readout"} if readout == "feature" else set()
    declared = tuple(k for k in sorted(keys) if _chance(draw, 12 if k in featured else 1, 20))
    at = _between(draw, 0, n_layers - 1) if defect else 0
    return Recipe(
        seed=draw(st.integers(0, 2**31 - 1)),
        d=d,
        dtype=dtype,
        layers=layers,
        readout_mix=readout,
        sources=sources,
        pos=pos,
        pos_first=bool(pos) and _chance(draw, 3, 10),
        norm=norm,
        heads=heads,
        vocab=draw(st.sampled_from([64, 16, 257])),
        batch=_between(draw, 1, 4),
        positions=_between(draw, 4, 16),
        declared=declared,
        defect=defect,
        defect_layer=at,
        ctx_hint=_weighted(draw, [(2, "attr"), (1, "spec"), (1, "none")]),
        embed_str=not pos and _chance(draw, 1, 10),
        inplace=sources == "increments" and _chance(draw, 1, 4),
        embed_scale=_chance(draw, 3, 20),
    )
