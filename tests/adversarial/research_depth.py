"""Research shapes that mix over depth: DenseFormer's depth-weighted averages (static), Attention
Residuals (a softmax over depth, per token), MUDDFormer-like dynamic dense connections (per token,
per query / key / value / residual input), a hybrid of SSM and attention layers, and the same at a
tiny width where per-token weights over more sources than the width are not determined.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from depthscope import ModelSpec
from tests.adversarial.harness import Case, Recorder
from tests.adversarial.research_parts import (
    CTX,
    HEADS,
    MLP,
    VOCAB,
    CausalSelfAttention,
    D,
    GPTBlock,
    causal,
    combine,
    scalar,
    scramble_norms,
    weights_of,
)

# --- DenseFormer ----------------------------------------------------------------------------------


class DepthWeightedAverage(nn.Module):
    """DWA after block i: a learned weight per state X_0 .. X_{i+1} (one-hot on X_{i+1} at init)."""

    def __init__(self, n_states: int, generator: torch.Generator):
        super().__init__()
        init = torch.zeros(n_states)
        init[-1] = 1.0
        self.alphas = nn.Parameter(init + 0.25 * torch.randn(n_states, generator=generator))

    def forward(self, states: list[Tensor]) -> Tensor:
        return sum(a * s for a, s in zip(self.alphas, states))


class DenseFormer(Recorder):
    """DenseFormer (arXiv 2402.02622): after block i, the stream is a depth-weighted average of every
    state so far, X_0 (the embeddings) .. X_{i+1} (block i's output), the weights learned (the plain
    residual at initialisation; trained values here). Read by states: each block's input, and the
    read-out, a static combination of the embeddings and the block outputs.
    """

    def __init__(self, n_layer: int = 4, d: int = D):
        super().__init__()
        torch.manual_seed(20)
        self.config = type("C", (), {"block_size": CTX})()
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(CTX, d)
        self.blocks = nn.ModuleList(GPTBlock(d) for _ in range(n_layer))
        g = torch.Generator().manual_seed(2020)
        self.dwa = nn.ModuleList(DepthWeightedAverage(i + 2, g) for i in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, VOCAB, bias=False)
        scramble_norms(self, g)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names = ["embed", "embed.wpe"]
        states, state_coefs = [x], [{"embed": 1.0, "embed.wpe": 1.0}]
        coef = state_coefs[0]
        for i, (block, dwa) in enumerate(zip(self.blocks, self.dwa)):
            self.consumer(f"{i}.block", x, names, weights_of(names, coef, x))
            x = self.source(f"{i}.block", block(x))
            names = [*names, f"{i}.block"]
            states.append(x)
            state_coefs.append({f"{i}.block": 1.0})
            x = dwa(states)
            coef = combine(*((scalar(a), c) for a, c in zip(dwa.alphas, state_coefs)))
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.ln_f(x))


DENSEFORMER_SPEC = ModelSpec(
    embed=["wte", "wpe"], writes={"block": "blocks.*"}, reads={"block": "blocks.*", "readout": "ln_f"}
)


class DenseFormerIncrements(DenseFormer):
    """The same DenseFormer with the writes inside each block named beside the block's output: a
    state is the sum of its block's input and the increments in it, so the sources are linearly
    dependent and a static fit's weights are not determined: refused. (The oracle gives the
    increments weight 0 beside the states; any other split rebuilds the inputs as well.)
    """

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names = ["embed", "embed.wpe"]
        states, state_coefs = [x], [{"embed": 1.0, "embed.wpe": 1.0}]
        coef = state_coefs[0]
        for i, (block, dwa) in enumerate(zip(self.blocks, self.dwa)):
            out = block(x)
            x_in, a, h, m = block.seen
            self.consumer(f"{i}.attn", x_in, names, weights_of(names, coef, x_in))
            self.source(f"{i}.attn", a)
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", h, names, weights_of(names, {**coef, f"{i}.attn": 1.0}, h))
            self.source(f"{i}.mlp", m)
            x = self.source(f"{i}.block", out)
            names = [*names, f"{i}.mlp", f"{i}.block"]
            states.append(x)
            state_coefs.append({f"{i}.block": 1.0})
            x = dwa(states)
            coef = combine(*((scalar(a), c) for a, c in zip(dwa.alphas, state_coefs)))
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.ln_f(x))


DENSEFORMER_INCREMENTS_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp", "block": "blocks.*"},
    reads={"attn": "blocks.*.ln_1", "mlp": "blocks.*.ln_2", "readout": "ln_f"},
)


# --- Attention Residuals --------------------------------------------------------------------------


class DepthAttention(nn.Module):
    """One consumer's attention over depth: alpha_n = softmax_n(w . RMSNorm(v_n)), h = sum alpha_n v_n
    (the keys normed without a weight; the pseudo-query w zero, uniform weights, at initialisation)."""

    def __init__(self, d: int):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(d))

    def forward(self, values: list[Tensor]) -> tuple[Tensor, Tensor]:
        v = torch.stack(values, 2)  # [b, t, n, d]
        alpha = (F.rms_norm(v, (v.shape[-1],)) @ self.query).softmax(-1)  # [b, t, n]
        return (alpha.unsqueeze(-1) * v).sum(2), alpha


class PreNorm(nn.Module):
    def __init__(self, d: int, f: nn.Module):
        super().__init__()
        self.norm, self.f = nn.RMSNorm(d), f

    def forward(self, x: Tensor) -> Tensor:
        return self.f(self.norm(x))


class AttnRes(Recorder):
    """Full Attention Residuals (arXiv 2603.15031): every sublayer and the read-out take a softmax
    over depth of the embedding and every earlier sublayer's output, weights from a learned
    pseudo-query per consumer against the normed values: per-token weights. Written from the
    paper's description; the queries trained off zero.
    """

    def __init__(self, n_layer: int = 3, d: int = D):
        super().__init__()
        torch.manual_seed(21)
        self.tok_embeddings = nn.Embedding(VOCAB, d)
        self.layers = nn.ModuleList(
            nn.ModuleDict({"attn": PreNorm(d, CausalSelfAttention(d)), "mlp": PreNorm(d, MLP(d))})
            for _ in range(n_layer)
        )
        self.depth_attn = nn.ModuleList(DepthAttention(d) for _ in range(2 * n_layer + 1))
        self.norm, self.output = nn.RMSNorm(d), nn.Linear(d, VOCAB, bias=False)
        self.max_seq_len = CTX
        g = torch.Generator().manual_seed(2121)
        scramble_norms(self, g)
        with torch.no_grad():
            for da in self.depth_attn:
                da.query.copy_(torch.randn(d, generator=g) / d**0.25)

    def forward(self, idx: Tensor) -> Tensor:
        values = [self.source("embed", self.tok_embeddings(idx))]
        names = ["embed"]
        subs = [(f"{i}.{k}", layer[k]) for i, layer in enumerate(self.layers) for k in ("attn", "mlp")]
        for (label, sub), da in zip(subs, self.depth_attn):
            h, alpha = da(values)
            self.consumer(label, h, names, alpha.detach().double())
            values.append(self.source(label, sub(h)))
            names = [*names, label]
        h, alpha = self.depth_attn[-1](values)
        self.consumer("readout", h, names, alpha.detach().double())
        return self.output(self.norm(h))


ATTNRES_SPEC = ModelSpec(
    embed=["tok_embeddings"],
    writes={"attn": "layers.*.attn.f", "mlp": "layers.*.mlp.f"},
    reads={"attn": "layers.*.attn.norm", "mlp": "layers.*.mlp.norm", "readout": "norm"},
)


# --- MUDDFormer-like ------------------------------------------------------------------------------


class QKVAttention(nn.Module):
    """Causal attention with separate query, key and value inputs."""

    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D, bias=False) for _ in range(4))

    def forward(self, xq: Tensor, xk: Tensor, xv: Tensor) -> Tensor:
        b, t, d = xq.shape
        split = lambda y: y.view(b, t, HEADS, d // HEADS).transpose(1, 2)  # noqa: E731
        y = causal(split(self.wq(xq)), split(self.wk(xk)), split(self.wv(xv)))
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class MUDDBlock(nn.Module):
    """Layer 0 reads one input through ``attention_norm``; later layers read four (query, key,
    value, residual), the first three through ``attention_norms.0/1/2``."""

    def __init__(self, layer_id: int):
        super().__init__()
        if layer_id == 0:
            self.attention_norm = nn.RMSNorm(D)
        else:
            self.attention_norms = nn.ModuleList(nn.RMSNorm(D) for _ in range(3))
        self.attention, self.ffn_norm, self.feed_forward = QKVAttention(), nn.RMSNorm(D), MLP(bias=False)

    def forward(self, x: Tensor | tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
        if isinstance(x, Tensor):
            n = self.attention_norm(x)
            a, xr = self.attention(n, n, n), x
        else:
            xq, xk, xv, xr = x
            a = self.attention(*(norm(y) for norm, y in zip(self.attention_norms, (xq, xk, xv))))
        h = xr + a
        m = self.feed_forward(self.ffn_norm(h))
        self.seen = (a, h)
        return h + m


class DynamicDense(nn.Module):
    """After block i: per-token weights over the states X_0 .. X_{i+1}, for ``ways`` inputs of the next
    block, from the newest state (a static part, the bias, plus a dynamic part)."""

    def __init__(self, n_states: int, ways: int):
        super().__init__()
        self.ways, self.n = ways, n_states
        self.proj = nn.Linear(D, ways * n_states)
        nn.init.normal_(self.proj.weight, std=0.4)
        nn.init.normal_(self.proj.bias, mean=0.5, std=0.3)

    def forward(self, states: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        w = self.proj(F.rms_norm(states[-1], (D,))).view(*states[-1].shape[:2], self.ways, self.n)
        stack = torch.stack(states, 2)  # [b, t, n, d]
        return [torch.einsum("btn,btnd->btd", w[:, :, c], stack) for c in range(self.ways)], w


class MUDD(Recorder):
    """MUDDFormer-like multiway dynamic dense connections (arXiv 2502.12170): after each block, the
    query, key, value and residual inputs of the next block are each a per-token combination of
    every state so far (the embedding and each block's output), and the read-out one more.
    Layer 0 reads the embedding through one ``attention_norm`` (named under attn.q, attn.k and
    attn.v alike); later layers through ``attention_norms.0/1/2``. Writes: each block's attention
    output and its output (a state); the MLP's norm reads the residual input plus the attention.
    ``literal``: layer 0's norm is named by its literal path (``layers.0.attention_norm``).
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(22)
        self.tok_embeddings = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(MUDDBlock(i) for i in range(n_layer))
        self.dense = nn.ModuleList(DynamicDense(i + 2, 4 if i + 1 < n_layer else 1) for i in range(n_layer))
        self.norm, self.output = nn.RMSNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.max_seq_len = CTX
        scramble_norms(self, torch.Generator().manual_seed(2222))

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed", self.tok_embeddings(idx))
        states, names, state_at = [x], ["embed"], ["embed"]
        inputs: Tensor | list[Tensor] = x
        w = None  # the dense weights [b, t, ways, n states] that made ``inputs``
        for i, (layer, dense) in enumerate(zip(self.layers, self.dense)):
            out = layer(inputs if i == 0 else tuple(inputs))
            a, h = layer.seen
            for c, view in enumerate(("q", "k", "v")):
                h_in = inputs if i == 0 else inputs[c]
                coef = {"embed": 1.0} if i == 0 else {s: w[:, :, c, k, None] for k, s in enumerate(state_at)}
                self.consumer(f"{i}.attn.{view}", h_in, names, weights_of(names, coef, h_in))
            names = [*names, f"{i}.attn"]
            self.source(f"{i}.attn", a)
            coef = {"embed": 1.0} if i == 0 else {s: w[:, :, 3, k, None] for k, s in enumerate(state_at)}
            self.consumer(f"{i}.mlp", h, names, weights_of(names, {**coef, f"{i}.attn": 1.0}, h))
            names, state_at = [*names, f"{i}.block"], [*state_at, f"{i}.block"]
            states.append(self.source(f"{i}.block", out))
            inputs, w = dense(states)
            w = w.detach().double()
        final = inputs[0]
        self.consumer(
            "readout",
            final,
            names,
            weights_of(names, {s: w[:, :, 0, k, None] for k, s in enumerate(state_at)}, final),
        )
        return self.output(self.norm(final))


def mudd_spec(literal: bool) -> ModelSpec:
    first = "layers.0.attention_norm" if literal else "layers.*.attention_norm"
    return ModelSpec(
        embed=["tok_embeddings"],
        writes={"attn": "layers.*.attention", "block": "layers.*"},
        reads={
            **{f"attn.{v}": [first, f"layers.*.attention_norms.{c}"] for c, v in enumerate("qkv")},
            "mlp": "layers.*.ffn_norm",
            "readout": "norm",
        },
    )


# --- a hybrid of SSM and attention layers ---------------------------------------------------------


class DiagonalSSM(nn.Module):
    """A gated diagonal linear recurrence (the shape of Mamba's mixer, without selectivity):
    h_t = a * h_{t-1} + (1 - a) * u_t, y = out_proj(h * silu(z))."""

    def __init__(self, expand: int = 2):
        super().__init__()
        self.in_proj, self.out_proj = nn.Linear(D, 2 * expand * D), nn.Linear(expand * D, D)
        self.decay_logit = nn.Parameter(torch.randn(expand * D))

    def forward(self, x: Tensor) -> Tensor:
        u, z = self.in_proj(x).chunk(2, -1)
        a = torch.sigmoid(self.decay_logit)
        h, ys = torch.zeros_like(u[:, 0]), []
        for t in range(u.shape[1]):
            h = a * h + (1 - a) * u[:, t]
            ys.append(h)
        return self.out_proj(torch.stack(ys, 1) * F.silu(z))


class SSMLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ssm_norm, self.ssm, self.ffn_norm, self.ffn = nn.RMSNorm(D), DiagonalSSM(), nn.RMSNorm(D), MLP()


class AttnLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.attn, self.ffn_norm, self.ffn = (
            nn.RMSNorm(D),
            CausalSelfAttention(),
            nn.RMSNorm(D),
            MLP(),
        )


class Hybrid(Recorder):
    """A Jamba-like hybrid (arXiv 2403.19887): SSM layers with an attention layer every other
    layer, each followed by an MLP, all pre-norm residual: exact, unit, with ``ssm`` writes."""

    def __init__(self, n_layer: int = 4):
        super().__init__()
        torch.manual_seed(23)
        self.config = type("JambaConfig", (), {"max_position_embeddings": CTX, "vocab_size": VOCAB})()
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(AttnLayer() if i % 2 else SSMLayer() for i in range(n_layer))
        self.final_layernorm, self.lm_head = nn.RMSNorm(D), nn.Linear(D, VOCAB, bias=False)
        scramble_norms(self, torch.Generator().manual_seed(2323))

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed", self.embed_tokens(idx))
        names = ["embed"]
        for i, layer in enumerate(self.layers):
            kind = "attn" if isinstance(layer, AttnLayer) else "ssm"
            mixer_norm, mixer = (
                (layer.attn_norm, layer.attn) if kind == "attn" else (layer.ssm_norm, layer.ssm)
            )
            for k, norm, f in ((kind, mixer_norm, mixer), ("mlp", layer.ffn_norm, layer.ffn)):
                self.consumer(f"{i}.{k}", x, names, 1.0)
                x = x + self.source(f"{i}.{k}", f(norm(x)))
                names = [*names, f"{i}.{k}"]
        self.consumer("readout", x, names, 1.0)
        return self.lm_head(self.final_layernorm(x))


HYBRID_SPEC = ModelSpec(
    embed=["embed_tokens"],
    writes={"ssm": "layers.*.ssm", "attn": "layers.*.attn", "mlp": "layers.*.ffn"},
    reads={
        "ssm": "layers.*.ssm_norm",
        "attn": "layers.*.attn_norm",
        "mlp": "layers.*.ffn_norm",
        "readout": "final_layernorm",
    },
)


# --- a tiny width ---------------------------------------------------------------------------------

TINY = 8

CASES = [
    Case("DenseFormer DWA over block states", "dwa", lambda: DenseFormer().eval(), DENSEFORMER_SPEC),
    Case("AttnRes softmax over depth", "attnres", lambda: AttnRes().eval(), ATTNRES_SPEC),
    Case("MUDDFormer-like, layer 0's norm under three keys", "mudd", lambda: MUDD().eval(), mudd_spec(False)),
    Case("MUDDFormer-like, layer 0's norm named literally", "mudd", lambda: MUDD().eval(), mudd_spec(True)),
    Case("Jamba-like SSM and attention hybrid", "hybrid", lambda: Hybrid().eval(), HYBRID_SPEC),
    Case(
        "DenseFormer with increments beside the states",
        "spec-mistake",
        lambda: DenseFormerIncrements().eval(),
        DENSEFORMER_INCREMENTS_SPEC,
        expect="refused",
        match=r"not determined|dependent",
    ),
    Case(
        "tiny width: AttnRes with more sources than d",
        "tiny-d",
        lambda: AttnRes(n_layer=6, d=TINY).eval(),
        ATTNRES_SPEC,
        expect="refused",
        match=r"not determined|dependent|width|d_model",
    ),
    Case(
        "tiny width: DenseFormer with more sources than d",
        "tiny-d",
        lambda: DenseFormer(n_layer=8, d=TINY).eval(),
        DENSEFORMER_SPEC,
    ),
]
