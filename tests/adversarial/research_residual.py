"""Research shapes that scale or gate the residual stream itself: parallel blocks, ReZero,
LayerScale, U-Net skips, sandwich norms, residual multipliers, x0 re-injection, value residuals,
highway gates, mixture-of-depths and post-LN DeepNorm. Each model records its own oracle (see
``research_parts``); parameters that a paper initialises to a plain residual are set off it.
"""

from __future__ import annotations

import math

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
    rms_factor,
    scalar,
    scramble_norms,
    token,
    weights_of,
)


def _config(**kw):
    return type("Config", (), {"vocab_size": VOCAB, "max_position_embeddings": CTX, **kw})()


# --- parallel blocks ------------------------------------------------------------------------------


class NeoXLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attention, self.mlp = CausalSelfAttention(), MLP()


class NeoX(Recorder):
    """GPT-NeoX's parallel residual (``use_parallel_residual``, arXiv 2204.06745): x + attn(ln_1(x)) +
    mlp(ln_2(x)), two norms reading the same x. The MLP's norm runs after the attention returned, so
    the attention output is a source before it, with weight 0.
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(1)
        self.config = _config()
        self.embed_in = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(NeoXLayer() for _ in range(n_layer))
        self.final_layer_norm, self.embed_out = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        scramble_norms(self, torch.Generator().manual_seed(11))

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed", self.embed_in(idx))
        names = ["embed"]
        for i, layer in enumerate(self.layers):
            self.consumer(f"{i}.attn", x, names, 1.0)
            a = self.source(f"{i}.attn", layer.attention(layer.input_layernorm(x)))
            self.consumer(f"{i}.mlp", x, [*names, f"{i}.attn"], [1.0] * len(names) + [0.0])
            m = self.source(f"{i}.mlp", layer.mlp(layer.post_attention_layernorm(x)))
            x = m + a + x
            names += [f"{i}.attn", f"{i}.mlp"]
        self.consumer("readout", x, names, 1.0)
        return self.embed_out(self.final_layer_norm(x))


NEOX_SPEC = ModelSpec(
    embed=["embed_in"],
    writes={"attn": "layers.*.attention", "mlp": "layers.*.mlp"},
    reads={
        "attn": "layers.*.input_layernorm",
        "mlp": "layers.*.post_attention_layernorm",
        "readout": "final_layer_norm",
    },
)


# --- ReZero ---------------------------------------------------------------------------------------


class ReZeroBranch(nn.Module):
    """alpha * f(x): ReZero's gated branch as one module (alpha zero at initialisation)."""

    def __init__(self, f: nn.Module):
        super().__init__()
        self.f, self.alpha = f, nn.Parameter(torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        return self.alpha * self.f(x)


class ReZeroLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.ffn = CausalSelfAttention(), MLP()
        self.resweight = nn.Parameter(torch.zeros(()))  # one alpha per layer, for both branches


class ReZero(Recorder):
    """ReZero (arXiv 2003.04887): no norm at all, x = x + alpha_l * F(x) with one alpha per layer
    (the ReZero repository's ``resweight``), zero at initialisation and trained off it here. The
    writes are the branches before alpha; every read is a static combination; the read-out is the
    head's input.
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(2)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.layers = nn.ModuleList(ReZeroLayer() for _ in range(n_layer))
        self.head = nn.Linear(D, VOCAB)
        with torch.no_grad():
            for k, layer in enumerate(self.layers):
                layer.resweight.fill_((-1) ** k * (0.3 + 0.2 * k))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names, coef = ["embed", "embed.wpe"], {"embed": 1.0, "embed.wpe": 1.0}
        for i, layer in enumerate(self.layers):
            alpha = scalar(layer.resweight)
            for kind, f in (("attn", layer.attn), ("mlp", layer.ffn)):
                self.consumer(f"{i}.{kind}", x, names, weights_of(names, coef, x))
                y = self.source(f"{i}.{kind}", f(x))
                x = x + layer.resweight * y
                names, coef = [*names, f"{i}.{kind}"], {**coef, f"{i}.{kind}": alpha}
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.head(x)


REZERO_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "layers.*.attn", "mlp": "layers.*.ffn"},
    reads={"attn": "layers.*.attn", "mlp": "layers.*.ffn", "readout": "head"},
)


class ReZeroAtInit(Recorder):
    """ReZero at initialisation (arXiv 2003.04887), each branch a module computing alpha * f(x) with
    alpha = 0 exactly: every write is zero. Unit weights are still what the model does (x + branch)
    and the identity holds with them; the zero sources contribute nothing.
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(3)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.layers = nn.ModuleList(
            nn.ModuleDict({"attn": ReZeroBranch(CausalSelfAttention()), "mlp": ReZeroBranch(MLP())})
            for _ in range(n_layer)
        )
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names = ["embed", "embed.wpe"]
        for i, layer in enumerate(self.layers):
            for kind in ("attn", "mlp"):
                self.consumer(f"{i}.{kind}", x, names, 1.0)
                x = x + self.source(f"{i}.{kind}", layer[kind](x))
                names = [*names, f"{i}.{kind}"]
        self.consumer("readout", x, names, 1.0)
        return self.head(x)


class ZeroInitScaled(Recorder):
    """A Gemma-style model (embedding scaled by sqrt(d), arXiv 2403.08295) at initialisation with its
    residual projections zero-initialised (as modded-nanogpt and many codebases do): every write is
    exactly zero, while the embedding's weight is sqrt(d), not 1. A static fit's weights on the zero
    sources are not determined by the activations (any value rebuilds the input): refused.
    """

    def __init__(self, n_layer: int = 2):
        super().__init__()
        torch.manual_seed(4)
        self.config = _config()
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(GPTBlock() for _ in range(n_layer))
        for b in self.layers:
            nn.init.zeros_(b.attn.c_proj.weight), nn.init.zeros_(b.attn.c_proj.bias)
            nn.init.zeros_(b.mlp.c_proj.weight), nn.init.zeros_(b.mlp.c_proj.bias)
        self.norm, self.lm_head = nn.RMSNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        scale = math.sqrt(D)
        x = self.source("embed", self.embed_tokens(idx)) * scale
        names, coef = ["embed"], {"embed": scale}
        for i, b in enumerate(self.layers):
            for kind, norm, f in (("attn", b.ln_1, b.attn), ("mlp", b.ln_2, b.mlp)):
                self.consumer(f"{i}.{kind}", x, names, weights_of(names, coef, x))
                x = x + self.source(f"{i}.{kind}", f(norm(x)))
                names, coef = [*names, f"{i}.{kind}"], {**coef, f"{i}.{kind}": 1.0}
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.norm(x))


# --- LayerScale -----------------------------------------------------------------------------------


class CaiTBlock(nn.Module):
    def __init__(self, init: float = 1e-5):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = (
            nn.LayerNorm(D),
            CausalSelfAttention(),
            nn.LayerNorm(D),
            MLP(),
        )
        self.gamma_1 = nn.Parameter(init * torch.ones(D))
        self.gamma_2 = nn.Parameter(init * torch.ones(D))


class CaiT(Recorder):
    """CaiT's LayerScale (arXiv 2103.17239) as CaiT writes it: x + gamma_1 * attn(norm1(x)), gamma a
    learned per-channel vector (1e-5 at initialisation; trained values here). Named at ``attn`` and
    ``mlp`` (before gamma), the writes reach the stream with per-feature weights: not a scalar
    combination, refused.
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(5)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(CaiTBlock() for _ in range(n_layer))
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB)
        g = torch.Generator().manual_seed(55)
        with torch.no_grad():
            for b in self.blocks:
                b.gamma_1.copy_(0.05 + 0.5 * torch.rand(D, generator=g))
                b.gamma_2.copy_(0.05 + 0.5 * torch.rand(D, generator=g))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names, coef = ["embed", "embed.wpe"], {"embed": 1.0, "embed.wpe": 1.0}
        for i, b in enumerate(self.blocks):
            for kind, norm, f, gamma in (
                ("attn", b.norm1, b.attn, b.gamma_1),
                ("mlp", b.norm2, b.mlp, b.gamma_2),
            ):
                self.consumer(f"{i}.{kind}", x, names, weights_of(names, coef, x))
                x = x + gamma * self.source(f"{i}.{kind}", f(norm(x)))
                names, coef = [*names, f"{i}.{kind}"], {**coef, f"{i}.{kind}": gamma.detach().double()}
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.head(self.norm(x))


CAIT_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
    reads={"attn": "blocks.*.norm1", "mlp": "blocks.*.norm2", "readout": "norm"},
)


class LayerScale(nn.Module):
    """timm's LayerScale: x * gamma, in place when asked (timm's ``inplace``)."""

    def __init__(self, dim: int, init_values: float = 1e-5, inplace: bool = True):
        super().__init__()
        self.inplace, self.gamma = inplace, nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x.mul_(self.gamma) if self.inplace else x * self.gamma


class TimmBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn, self.ls1 = nn.LayerNorm(D), CausalSelfAttention(), LayerScale(D)
        self.norm2, self.mlp, self.ls2 = nn.LayerNorm(D), MLP(), LayerScale(D)

    def forward(self, x: Tensor) -> Tensor:
        a = self.ls1(self.attn(self.norm1(x)))
        h = x + a
        m = self.ls2(self.mlp(self.norm2(h)))
        self.seen = (x, a, h, m)
        return h + m


class TimmLayerScale(Recorder):
    """timm's ViT blocks with LayerScale modules (``ls1``, ``ls2``, in place, as in arXiv 2103.17239),
    made causal. Named at the LayerScale modules, the writes are what the stream adds: exact, unit.
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(6)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(TimmBlock() for _ in range(n_layer))
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB)
        g = torch.Generator().manual_seed(66)
        with torch.no_grad():
            for b in self.blocks:
                b.ls1.gamma.copy_(0.05 + 0.5 * torch.rand(D, generator=g))
                b.ls2.gamma.copy_(0.05 + 0.5 * torch.rand(D, generator=g))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names = ["embed", "embed.wpe"]
        for i, b in enumerate(self.blocks):
            out = b(x)
            x_in, a, h, m = b.seen
            self.consumer(f"{i}.attn", x_in, names, 1.0)
            self.source(f"{i}.attn", a)
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", h, names, 1.0)
            self.source(f"{i}.mlp", m)
            names = [*names, f"{i}.mlp"]
            x = out
        self.consumer("readout", x, names, 1.0)
        return self.head(self.norm(x))


TIMM_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "blocks.*.ls1", "mlp": "blocks.*.ls2"},
    reads={"attn": "blocks.*.norm1", "mlp": "blocks.*.norm2", "readout": "norm"},
)


# --- U-Net skips (modded-nanogpt) -----------------------------------------------------------------


class RMSBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = (
            nn.RMSNorm(D),
            CausalSelfAttention(),
            nn.RMSNorm(D),
            MLP(),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class UNetSkips(Recorder):
    """modded-nanogpt's U-Net skips (KellerJordan/modded-nanogpt): the first half's block outputs
    are pushed on a stack and re-added, popped, with learned ``skip_weights`` before each block of
    the second half (ones at initialisation; trained values here). Read over the sublayer writes
    (norm modules in place of modded-nanogpt's functional norm): static weights, 1 + w on the
    writes a skip carries again.
    """

    def __init__(self, n_layer: int = 6):
        super().__init__()
        torch.manual_seed(7)
        self.embed = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(RMSBlock() for _ in range(n_layer))
        self.skip_weights = nn.Parameter(torch.ones(n_layer // 2))
        self.norm, self.lm_head = nn.RMSNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.ctx = CTX
        g = torch.Generator().manual_seed(77)
        scramble_norms(self, g)
        with torch.no_grad():
            self.skip_weights.copy_(1 + 0.4 * torch.randn(n_layer // 2, generator=g))

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed", self.embed(idx))
        names, coef = ["embed"], {"embed": 1.0}
        half = len(self.blocks) // 2
        skips: list[tuple[Tensor, dict]] = []
        for i, b in enumerate(self.blocks):
            if i >= half:
                s, s_coef = skips.pop()
                w = self.skip_weights[i - half]
                x = x + w * s
                coef = combine((1.0, coef), (scalar(w), s_coef))
            for kind, norm, f in (("attn", b.norm1, b.attn), ("mlp", b.norm2, b.mlp)):
                self.consumer(f"{i}.{kind}", x, names, weights_of(names, coef, x))
                x = x + self.source(f"{i}.{kind}", f(norm(x)))
                names, coef = [*names, f"{i}.{kind}"], {**coef, f"{i}.{kind}": 1.0}
            if i < half:
                skips.append((x, dict(coef)))
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.norm(x))


UNET_SPEC = ModelSpec(
    embed=["embed"],
    writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
    reads={"attn": "blocks.*.norm1", "mlp": "blocks.*.norm2", "readout": "norm"},
)


class UNetStates(UNetSkips):
    """The same U-Net model read by its block states: each block's output is a source (a state) and
    each block's input, the previous state plus a weighted earlier one, a static combination.
    """

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed", self.embed(idx))
        names, coef = ["embed"], {"embed": 1.0}
        half = len(self.blocks) // 2
        skips: list[tuple[Tensor, dict]] = []
        for i, b in enumerate(self.blocks):
            if i >= half:
                s, s_coef = skips.pop()
                w = self.skip_weights[i - half]
                x = x + w * s
                coef = combine((1.0, coef), (scalar(w), s_coef))
            self.consumer(f"{i}.block", x, names, weights_of(names, coef, x))
            x = self.source(f"{i}.block", b(x))
            names, coef = [*names, f"{i}.block"], {f"{i}.block": 1.0}
            if i < half:
                skips.append((x, dict(coef)))
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.norm(x))


UNET_STATES_SPEC = ModelSpec(
    embed=["embed"], writes={"block": "blocks.*"}, reads={"block": "blocks.*", "readout": "norm"}
)


# --- sandwich norms -------------------------------------------------------------------------------


class SandwichBlock(nn.Module):
    def __init__(self, post: str):
        super().__init__()

        def norm():
            if post == "layernorm":
                return nn.LayerNorm(D)
            return nn.RMSNorm(D, eps=1e-6, elementwise_affine=post == "rmsnorm")

        self.pre_attn_norm, self.attn, self.post_attn_norm = nn.LayerNorm(D), CausalSelfAttention(), norm()
        self.pre_mlp_norm, self.mlp, self.post_mlp_norm = nn.LayerNorm(D), MLP(), norm()


class Sandwich(Recorder):
    """Sandwich norms (CogView, arXiv 2105.13290; Gemma 2's post-norms, arXiv 2408.00118): a norm on
    each branch's output before it is added, x + post_norm(f(pre_norm(x))). ``post``: the post
    norm's kind (``layernorm`` or ``rmsnorm`` with a learned weight, ``rms`` without one);
    ``named_after``: whether the spec names the post norm (the write as added) or the branch ``f``
    before it. Named before it, the post norm's scale is the branch's weight: per feature and per
    token with a weight, per token only for an RMS norm without one (1 / rms(f) at each token).
    """

    def __init__(self, post: str = "layernorm", named_after: bool = True, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(8)
        self.config = _config()
        self.wte = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(SandwichBlock(post) for _ in range(n_layer))
        self.final_norm, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.post, self.named_after = post, named_after
        scramble_norms(self, torch.Generator().manual_seed(88))

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed", self.wte(idx))
        names, coef = ["embed"], {"embed": 1.0}
        for i, b in enumerate(self.blocks):
            for kind, pre, f, post in (
                ("attn", b.pre_attn_norm, b.attn, b.post_attn_norm),
                ("mlp", b.pre_mlp_norm, b.mlp, b.post_mlp_norm),
            ):
                self.consumer(f"{i}.{kind}", x, names, weights_of(names, coef, x))
                y = f(pre(x))
                z = post(y)
                x = x + z
                if self.named_after:
                    self.source(f"{i}.{kind}", z)
                    w = 1.0
                else:
                    self.source(f"{i}.{kind}", y)
                    w = token(rms_factor(y, 1e-6))  # the post norm's scale of y, per token ...
                    if post.weight is not None:  # ... times its weight, per feature
                        w = w * post.weight.detach().double()
                names, coef = [*names, f"{i}.{kind}"], {**coef, f"{i}.{kind}": w}
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.final_norm(x))


def sandwich_spec(named_after: bool) -> ModelSpec:
    at = "post_{}_norm" if named_after else "{}"
    return ModelSpec(
        embed=["wte"],
        writes={"attn": "blocks.*." + at.format("attn"), "mlp": "blocks.*." + at.format("mlp")},
        reads={"attn": "blocks.*.pre_attn_norm", "mlp": "blocks.*.pre_mlp_norm", "readout": "final_norm"},
    )


# --- residual multipliers, x0 re-injection --------------------------------------------------------


class GraniteLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.self_attn = nn.RMSNorm(D), CausalSelfAttention(bias=False)
        self.post_attention_layernorm, self.mlp = nn.RMSNorm(D), MLP(bias=False)


class Granite(Recorder):
    """IBM Granite's multipliers (transformers' ``GraniteModel`` and ``GraniteConfig``): the embedding
    times ``embedding_multiplier`` and every branch times ``residual_multiplier`` before it is added,
    x = x + m * f(norm(x)): static weights (12 on the embedding, 0.22 on each write).
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(9)
        self.config = _config(embedding_multiplier=12.0, residual_multiplier=0.22)
        self.embed_tokens = nn.Embedding(VOCAB, D)
        with torch.no_grad():
            self.embed_tokens.weight.mul_(0.05)
        self.layers = nn.ModuleList(GraniteLayer() for _ in range(n_layer))
        self.norm, self.lm_head = nn.RMSNorm(D), nn.Linear(D, VOCAB, bias=False)
        scramble_norms(self, torch.Generator().manual_seed(99))

    def forward(self, idx: Tensor) -> Tensor:
        em, rm = self.config.embedding_multiplier, self.config.residual_multiplier
        x = self.source("embed", self.embed_tokens(idx)) * em
        names, coef = ["embed"], {"embed": em}
        for i, layer in enumerate(self.layers):
            for kind, norm, f in (
                ("attn", layer.input_layernorm, layer.self_attn),
                ("mlp", layer.post_attention_layernorm, layer.mlp),
            ):
                self.consumer(f"{i}.{kind}", x, names, weights_of(names, coef, x))
                x = x + self.source(f"{i}.{kind}", f(norm(x))) * rm
                names, coef = [*names, f"{i}.{kind}"], {**coef, f"{i}.{kind}": rm}
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.norm(x))


GRANITE_SPEC = ModelSpec(
    embed=["embed_tokens"],
    writes={"attn": "layers.*.self_attn", "mlp": "layers.*.mlp"},
    reads={"attn": "layers.*.input_layernorm", "mlp": "layers.*.post_attention_layernorm", "readout": "norm"},
)


class X0Block(RMSBlock):
    def __init__(self):
        super().__init__()
        self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0]))


class X0Lambdas(Recorder):
    """modded-nanogpt's x0 re-injection (KellerJordan/modded-nanogpt): before each block
    x = lambdas[0] * x + lambdas[1] * x0, x0 the embedding, lambdas learned ([1, 0] at
    initialisation; trained values here): static weights over the embedding and the writes.
    """

    def __init__(self, n_layer: int = 4):
        super().__init__()
        torch.manual_seed(10)
        self.embed = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(X0Block() for _ in range(n_layer))
        self.norm, self.lm_head = nn.RMSNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.ctx = CTX
        g = torch.Generator().manual_seed(1010)
        scramble_norms(self, g)
        with torch.no_grad():
            for b in self.blocks:
                b.lambdas.copy_(torch.tensor([0.9, 0.25]) + 0.1 * torch.randn(2, generator=g))

    def forward(self, idx: Tensor) -> Tensor:
        x = x0 = self.source("embed", self.embed(idx))
        names, coef = ["embed"], {"embed": 1.0}
        for i, b in enumerate(self.blocks):
            l0, l1 = b.lambdas
            x = l0 * x + l1 * x0
            coef = combine((scalar(l0), coef), (scalar(l1), {"embed": 1.0}))
            for kind, norm, f in (("attn", b.norm1, b.attn), ("mlp", b.norm2, b.mlp)):
                self.consumer(f"{i}.{kind}", x, names, weights_of(names, coef, x))
                x = x + self.source(f"{i}.{kind}", f(norm(x)))
                names, coef = [*names, f"{i}.{kind}"], {**coef, f"{i}.{kind}": 1.0}
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.norm(x))


X0_SPEC = ModelSpec(
    embed=["embed"],
    writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
    reads={"attn": "blocks.*.norm1", "mlp": "blocks.*.norm2", "readout": "norm"},
)


def norm(x: Tensor) -> Tensor:
    """modded-nanogpt's norm: a functional RMS norm without weight."""
    return F.rms_norm(x, (x.size(-1),))


class FunctionalBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.mlp = CausalSelfAttention(bias=False), MLP(bias=False)
        self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0]))


class X0Functional(Recorder):
    """modded-nanogpt as it is written (KellerJordan/modded-nanogpt): no norm module at all,
    ``x = x0 = norm(embed(idx))`` with a functional RMS norm, x = l0 * x + l1 * x0 before each block,
    ``x + attn(norm(x))``, ``x + mlp(norm(x))``, ``lm_head(norm(x))``. There is no norm module to
    read, so the user names the modules that receive the normed stream (the attention, the MLP,
    the head): their inputs are the stream scaled by 1 / rms per token, a per-token combination of
    the embedding (itself scaled by 1 / rms of it in x0) and the writes.
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(12)
        self.embed = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(FunctionalBlock() for _ in range(n_layer))
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.ctx = CTX
        g = torch.Generator().manual_seed(1212)
        with torch.no_grad():
            for b in self.blocks:
                b.lambdas.copy_(torch.tensor([0.85, 0.3]) + 0.1 * torch.randn(2, generator=g))

    def forward(self, idx: Tensor) -> Tensor:
        e = self.source("embed", self.embed(idx))
        x = x0 = norm(e)
        coef = x0_coef = {"embed": token(rms_factor(e))}
        names = ["embed"]
        for i, b in enumerate(self.blocks):
            l0, l1 = b.lambdas
            x = l0 * x + l1 * x0
            coef = combine((scalar(l0), coef), (scalar(l1), x0_coef))
            for kind, f in (("attn", b.attn), ("mlp", b.mlp)):
                h = norm(x)
                self.consumer(
                    f"{i}.{kind}", h, names, weights_of(names, combine((token(rms_factor(x)), coef)), h)
                )
                x = x + self.source(f"{i}.{kind}", f(h))
                names, coef = [*names, f"{i}.{kind}"], {**coef, f"{i}.{kind}": 1.0}
        h = norm(x)
        self.consumer("readout", h, names, weights_of(names, combine((token(rms_factor(x)), coef)), h))
        return self.lm_head(h)


X0_FUNCTIONAL_SPEC = ModelSpec(
    embed=["embed"],
    writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
    reads={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp", "readout": "lm_head"},
)


# --- value residual -------------------------------------------------------------------------------


class ValueResidualAttention(nn.Module):
    """Attention whose values are mixed with the first layer's: v = lam * v + (1 - lam) * v1."""

    def __init__(self, first: bool):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.lamb = None if first else nn.Parameter(torch.tensor(0.5))

    def forward(self, x: Tensor, v1: Tensor | None = None) -> tuple[Tensor, Tensor]:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, HEADS, d // HEADS).transpose(1, 2) for y in self.c_attn(x).split(d, -1))
        if v1 is None:
            v1 = v
        else:
            v = self.lamb * v + (1 - self.lamb) * v1
        y = causal(q, k, v)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d)), v1


class ValueResidual(Recorder):
    """ResFormer's value residual (arXiv 2410.17897): every layer's attention mixes its values with
    the first layer's, passed along beside the stream; the attention returns (output, v1). The
    residual stream itself stays a plain sum of the writes: exact, unit.
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(13)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln_1": nn.LayerNorm(D),
                    "attn": ValueResidualAttention(i == 0),
                    "ln_2": nn.LayerNorm(D),
                    "mlp": MLP(),
                }
            )
            for i in range(n_layer)
        )
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        g = torch.Generator().manual_seed(1313)
        scramble_norms(self, g)
        with torch.no_grad():
            for b in self.blocks[1:]:
                b["attn"].lamb.fill_(float(0.2 + 0.6 * torch.rand((), generator=g)))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names, v1 = ["embed", "embed.wpe"], None
        for i, b in enumerate(self.blocks):
            self.consumer(f"{i}.attn", x, names, 1.0)
            a, v1 = b["attn"](b["ln_1"](x), v1)
            x = x + self.source(f"{i}.attn", a)
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", x, names, 1.0)
            x = x + self.source(f"{i}.mlp", b["mlp"](b["ln_2"](x)))
            names = [*names, f"{i}.mlp"]
        self.consumer("readout", x, names, 1.0)
        return self.lm_head(self.ln_f(x))


GPT_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
    reads={"attn": "blocks.*.ln_1", "mlp": "blocks.*.ln_2", "readout": "ln_f"},
)


# --- highway gates, mixture-of-depths -------------------------------------------------------------


class HighwayBlock(nn.Module):
    def __init__(self, per_feature: bool):
        super().__init__()
        width = D if per_feature else 1
        self.attn_norm, self.attn, self.attn_gate = (
            nn.LayerNorm(D),
            CausalSelfAttention(),
            nn.Linear(D, width),
        )
        self.mlp_norm, self.mlp, self.mlp_gate = nn.LayerNorm(D), MLP(), nn.Linear(D, width)


class Highway(Recorder):
    """Highway connections (arXiv 1505.00387) around each sublayer: x = g * f(norm(x)) + (1 - g) * x,
    g = sigmoid(W x + b). ``per_feature``: g a vector as in the paper (per-feature weights:
    refused); else one gate per token (per-token weights: exact). ``inplace``: the embedding is
    built as ``x = wte(idx); x += wpe(pos)``, adding in place into the token embedding's output
    after it was written. ``padded_positions``: the position embedding has ``padding_idx=0``, so its
    row for position 0 is zero: on those tokens a per-token weight of it is not determined.
    """

    def __init__(
        self,
        per_feature: bool = False,
        n_layer: int = 3,
        inplace: bool = False,
        seed: int = 14,
        padded_positions: bool = False,
    ):
        super().__init__()
        torch.manual_seed(seed)
        self.wte, self.wpe = (
            nn.Embedding(VOCAB, D),
            nn.Embedding(CTX, D, padding_idx=0 if padded_positions else None),
        )
        self.blocks = nn.ModuleList(HighwayBlock(per_feature) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.inplace = inplace
        scramble_norms(self, torch.Generator().manual_seed(seed + 1000))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        if self.inplace:
            x = self.source("embed", self.wte(idx))
            x += self.source("embed.wpe", self.wpe(pos))
        else:
            x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names, coef = ["embed", "embed.wpe"], {"embed": 1.0, "embed.wpe": 1.0}
        for i, b in enumerate(self.blocks):
            for kind, nrm, f, gate in (
                ("attn", b.attn_norm, b.attn, b.attn_gate),
                ("mlp", b.mlp_norm, b.mlp, b.mlp_gate),
            ):
                self.consumer(f"{i}.{kind}", x, names, weights_of(names, coef, x))
                y = self.source(f"{i}.{kind}", f(nrm(x)))
                g = torch.sigmoid(gate(x))
                x = g * y + (1 - g) * x
                gd = token(g)
                names, coef = [*names, f"{i}.{kind}"], combine((1 - gd, coef), (gd, {f"{i}.{kind}": 1.0}))
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.ln_f(x))


HIGHWAY_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
    reads={"attn": "blocks.*.attn_norm", "mlp": "blocks.*.mlp_norm", "readout": "ln_f"},
)


class MoDBlock(GPTBlock):
    """A block behind a mixture-of-depths router: the top half of each sequence's tokens by router
    score get x + sigmoid(r) * (a + m); the others pass through (weight 0 on the block's writes)."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D, 1)

    def forward(self, x: Tensor) -> Tensor:
        r = self.router(x)  # [b, t, 1]
        k = x.shape[1] // 2
        chosen = torch.zeros_like(r).scatter_(1, r.topk(k, dim=1).indices, 1.0)
        gate = torch.sigmoid(r) * chosen
        a = self.attn(self.ln_1(x))
        h = x + a
        m = self.mlp(self.ln_2(h))
        self.seen = (x, a, h, m, gate)
        return x + gate * (a + m)


class MixtureOfDepths(Recorder):
    """Mixture-of-depths (arXiv 2404.02258), simulated densely: a router picks half of each
    sequence's tokens per block; a chosen token adds the block's writes times its router weight,
    the others skip the block. Per-token weights, exactly zero on skipped tokens.
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(15)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(MoDBlock() for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        scramble_norms(self, torch.Generator().manual_seed(1515))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names, coef = ["embed", "embed.wpe"], {"embed": 1.0, "embed.wpe": 1.0}
        for i, b in enumerate(self.blocks):
            out = b(x)
            x_in, a, h, m, gate = b.seen
            self.consumer(f"{i}.attn", x_in, names, weights_of(names, coef, x_in))
            self.source(f"{i}.attn", a)
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", h, names, weights_of(names, {**coef, f"{i}.attn": 1.0}, h))
            self.source(f"{i}.mlp", m)
            names = [*names, f"{i}.mlp"]
            coef = combine((1.0, coef), (token(gate), {f"{i}.attn": 1.0, f"{i}.mlp": 1.0}))
            x = out
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.ln_f(x))


MOD_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
    reads={"attn": "blocks.*.ln_1", "mlp": "blocks.*.ln_2", "readout": "ln_f"},
)


# --- post-LN DeepNorm -----------------------------------------------------------------------------


class DeepNormLayer(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.attn, self.attn_ln, self.ffn, self.ffn_ln = (
            CausalSelfAttention(),
            nn.LayerNorm(D),
            MLP(),
            nn.LayerNorm(D),
        )
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        a = self.attn(x)
        h = self.attn_ln(self.alpha * x + a)
        m = self.ffn(h)
        self.seen = (x, a, h, m)
        return self.ffn_ln(self.alpha * h + m)


class DeepNorm(Recorder):
    """DeepNet's DeepNorm (arXiv 2203.00555): post-LN with the residual up-weighted,
    x = LN(alpha * x + f(x)), alpha = (2N)^(1/4). ``states``: the spec names each layer's output
    (a state) and reads each layer's input: a static combination (the previous state alone).
    Otherwise the natural spec (the sublayers' outputs as writes, their inputs as reads): each
    sublayer after the first reads a LayerNorm's output, not a combination of the writes (no
    scalar weights exist: those reads are not recorded, so a trace that gives them numbers is
    judged wrong): refused.
    """

    def __init__(self, states: bool = False, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(16)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        alpha = (2 * n_layer) ** 0.25
        self.layers = nn.ModuleList(DeepNormLayer(alpha) for _ in range(n_layer))
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.states = states
        scramble_norms(self, torch.Generator().manual_seed(1616))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names, coef = ["embed", "embed.wpe"], {"embed": 1.0, "embed.wpe": 1.0}
        for i, layer in enumerate(self.layers):
            out = layer(x)
            x_in, a, h, m = layer.seen
            if self.states:
                self.consumer(f"{i}.block", x_in, names, weights_of(names, coef, x_in))
                names, coef = [*names, f"{i}.block"], {f"{i}.block": 1.0}
                self.source(f"{i}.block", out)
            else:
                if i == 0:  # the only read that is a combination of the writes: the embedding
                    self.consumer("0.attn", x_in, names, 1.0)
                self.source(f"{i}.attn", a)
                self.source(f"{i}.mlp", m)
                names = [*names, f"{i}.attn", f"{i}.mlp"]
            x = out
        if self.states:
            self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(x)


DEEPNORM_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "layers.*.attn", "mlp": "layers.*.ffn"},
    reads={"attn": "layers.*.attn", "mlp": "layers.*.ffn", "readout": "lm_head"},
)
DEEPNORM_STATES_SPEC = ModelSpec(
    embed=["wte", "wpe"], writes={"block": "layers.*"}, reads={"block": "layers.*", "readout": "lm_head"}
)

NOT_SCALAR = r"not a scalar combination"
UNDETERMINED = r"not determined|dependent"

CASES = [
    Case("GPT-NeoX parallel residual, two norms", "parallel", lambda: NeoX().eval(), NEOX_SPEC),
    Case("ReZero, alpha trained off zero", "rezero", lambda: ReZero().eval(), REZERO_SPEC),
    Case(
        "ReZero at init: zero writes under unit weights",
        "zero-write",
        lambda: ReZeroAtInit().eval(),
        ModelSpec(
            embed=["wte", "wpe"],
            writes={"attn": "layers.*.attn", "mlp": "layers.*.mlp"},
            reads={"attn": "layers.*.attn", "mlp": "layers.*.mlp", "readout": "head"},
        ),
    ),
    Case(
        "zero-init projections under a scaled embedding",
        "zero-write",
        lambda: ZeroInitScaled().eval(),
        ModelSpec(
            embed=["embed_tokens"],
            writes={"attn": "layers.*.attn", "mlp": "layers.*.mlp"},
            reads={"attn": "layers.*.ln_1", "mlp": "layers.*.ln_2", "readout": "norm"},
        ),
        expect="refused",
        match=UNDETERMINED,
    ),
    Case(
        "CaiT LayerScale, named before gamma",
        "layerscale",
        lambda: CaiT().eval(),
        CAIT_SPEC,
        "refused",
        NOT_SCALAR,
    ),
    Case(
        "timm LayerScale modules named as the writes",
        "layerscale",
        lambda: TimmLayerScale().eval(),
        TIMM_SPEC,
    ),
    Case("modded-nanogpt U-Net skips over the writes", "unet", lambda: UNetSkips().eval(), UNET_SPEC),
    Case(
        "modded-nanogpt U-Net skips over block states", "unet", lambda: UNetStates().eval(), UNET_STATES_SPEC
    ),
    Case("sandwich norms, the post-norm named", "sandwich", lambda: Sandwich().eval(), sandwich_spec(True)),
    Case(
        "sandwich norms, weighted RMS post-norm, branch named",
        "sandwich",
        lambda: Sandwich("rmsnorm", named_after=False).eval(),
        sandwich_spec(False),
        expect="refused",
        match=NOT_SCALAR,
    ),
    Case(
        "sandwich norms, weightless RMS post-norm, branch named",
        "sandwich",
        lambda: Sandwich("rms", named_after=False).eval(),
        sandwich_spec(False),
    ),
    Case("Granite embedding and residual multipliers", "multiplier", lambda: Granite().eval(), GRANITE_SPEC),
    Case("modded-nanogpt x0 lambdas", "x0", lambda: X0Lambdas().eval(), X0_SPEC),
    Case(
        "modded-nanogpt functional rms_norm, x0 lambdas",
        "functional-norm",
        lambda: X0Functional().eval(),
        X0_FUNCTIONAL_SPEC,
    ),
    Case("ResFormer value residual", "value-residual", lambda: ValueResidual().eval(), GPT_SPEC),
    Case("highway gates, one per token", "highway", lambda: Highway().eval(), HIGHWAY_SPEC),
    Case(
        "highway gates, per feature",
        "highway",
        lambda: Highway(per_feature=True).eval(),
        HIGHWAY_SPEC,
        expect="refused",
        match=NOT_SCALAR,
    ),
    Case("mixture-of-depths routing", "highway", lambda: MixtureOfDepths().eval(), MOD_SPEC),
    Case(
        "DeepNorm post-LN, natural spec",
        "post-ln",
        lambda: DeepNorm().eval(),
        DEEPNORM_SPEC,
        "refused",
        NOT_SCALAR,
    ),
    Case(
        "DeepNorm post-LN read by its states",
        "post-ln",
        lambda: DeepNorm(states=True).eval(),
        DEEPNORM_STATES_SPEC,
    ),
]
