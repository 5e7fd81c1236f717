"""Models as research code writes them, from the papers, for the ModelSpec tests: no depthscope
class, no hook points, their own module names. Each records, during its forward, the weights it
really mixed with, in the delta basis of the sources its spec names (``model.mixed[label] =
(sources, weights [batch, pos, n])``): the oracle the tests compare a capture with.

* ``NanoGPT``: Karpathy's nanoGPT layout (wte + wpe(arange(T)) of shape [T, d], blocks with
  ln_1/attn/ln_2/mlp, ln_f, lm_head, forward returning (logits, loss)).
* ``DenseFormer``: nanoGPT blocks, a DWA module after every ``period``-th block averaging the
  states X_j with j = i (mod dilation) (arXiv 2402.02622, Sec. 3: x_i' = sum_j alpha_ij X_j,
  alpha_ii = 1 else 0 at initialisation; random here, so that the test sees weights).
* ``AttnRes``: Full Attention Residuals from the paper's pseudocode (arXiv 2603.15031, Sec. 3.1):
  h_i = sum_n softmax_n(w_i . RMSNorm(v_n)) v_n over [embedding, f_0 .. f_{i-1}], and the same for
  the read-out.
* ``MHC``: manifold-constrained hyper-connections (arXiv 2512.24880): S streams, per-token
  H_pre = sigmoid(.), H_post = 2 sigmoid(.), H_res = Sinkhorn(exp(.)), applied as the papers' code
  applies H_res (its transpose: X'_t = sum_s H_res[s, t] X_s); read-out: the sum of the streams.
* ``MUDD``: MUDDFormer-like multiway dynamic dense connections (arXiv 2502.12170): per-token
  weights over every earlier block output, computed from the current state, separately for the
  query, key, value and residual inputs of each block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from depthscope import ModelSpec

VOCAB, CTX, D, HEADS = 64, 16, 16, 2


@contextlib.contextmanager
def sized(d: int, ctx: int) -> Iterator[None]:
    """Build the models of the block at width ``d`` and context ``ctx`` (the cost benchmark's sizes;
    the tests use the defaults above). The specs' own ``ctx`` stays CTX: replace it with the model's."""
    global D, CTX
    before = D, CTX
    D, CTX = d, ctx
    try:
        yield
    finally:
        D, CTX = before


class SelfAttention(nn.Module):
    """Causal multi-head attention taking separate query, key and value inputs (all x by default)."""

    def __init__(self, d: int | None = None, heads: int = HEADS):
        super().__init__()
        d = d or D
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.heads = heads

    def forward(self, x: Tensor, k_in: Tensor | None = None, v_in: Tensor | None = None) -> Tensor:
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q = split(self.q(x))
        k = split(self.k(x if k_in is None else k_in))
        v = split(self.v(x if v_in is None else v_in))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int | None = None):
        super().__init__()
        d = d or D
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(nn.functional.gelu(self.fc(x)))


class Block(nn.Module):
    """nanoGPT's block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, d: int | None = None):
        super().__init__()
        d = d or D
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(d), SelfAttention(d), nn.LayerNorm(d), MLP(d)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _LM(nn.Module):
    def __init__(self, n_layer: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.n_layer = n_layer
        self.mixed: dict[str, tuple[list[str], Tensor]] = {}

    def embed(self, idx: Tensor) -> Tensor:
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))  # wpe: [T, d]

    def out(self, x: Tensor, targets: Tensor | None):
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def _ones(x: Tensor, n: int) -> Tensor:
    return torch.ones(*x.shape[:2], n, dtype=torch.float64)


class NanoGPT(_LM):
    def __init__(self, n_layer: int = 3):
        super().__init__(n_layer)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layer))

    def forward(self, idx: Tensor, targets: Tensor | None = None):
        x = self.embed(idx)
        names = ["embed", "embed.wpe"]
        for i, block in enumerate(self.blocks):
            self.mixed[f"{i}.attn"] = (list(names), _ones(x, len(names)))
            names.append(f"{i}.attn")
            self.mixed[f"{i}.mlp"] = (list(names), _ones(x, len(names)))
            names.append(f"{i}.mlp")
            x = block(x)
        self.mixed["readout"] = (list(names), _ones(x, len(names)))
        return self.out(x, targets)

    SPEC = ModelSpec(
        embed=["wte", "wpe"],
        writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
        reads={"attn": "blocks.*.ln_1", "mlp": "blocks.*.ln_2", "readout": "ln_f"},
    )


class DWA(nn.Module):
    """DenseFormer's depth-weighted average after block i: alpha over the states it sees."""

    def __init__(self, i: int, dilation: int, generator: torch.Generator):
        super().__init__()
        self.seen = [j for j in range(i + 2) if (i + 1 - j) % dilation == 0]  # X_0 .. X_{i+1}
        alpha = torch.zeros(len(self.seen))
        alpha[-1] = 1.0  # the paper's initialisation: the plain next state
        self.alpha = nn.Parameter(alpha + 0.3 * torch.randn(len(self.seen), generator=generator))

    def forward(self, states: list[Tensor]) -> Tensor:
        return sum(a * states[j] for a, j in zip(self.alpha, self.seen))


class DenseFormer(_LM):
    def __init__(self, n_layer: int = 4, dilation: int = 2, period: int = 1):
        super().__init__(n_layer)
        g = torch.Generator().manual_seed(3)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
        every = [i for i in range(n_layer) if (i + 1) % period == 0]  # a DWA after every period-th block
        self.dwa = nn.ModuleDict({str(i): DWA(i, dilation, g) for i in every})

    def forward(self, idx: Tensor, targets: Tensor | None = None):
        x = self.embed(idx)
        states = [x]
        # the delta basis: X_0 = wte + wpe; X_{i+1} = blocks.i's output (a whole state, a source)
        coef = {"X0": {"embed": 1.0, "embed.wpe": 1.0}}
        current = {"embed": 1.0, "embed.wpe": 1.0}
        names = ["embed", "embed.wpe"]
        for i, block in enumerate(self.blocks):
            self.mixed[f"{i}.block"] = (list(names), torch.tensor([current.get(n, 0.0) for n in names]))
            x = block(x)
            names.append(f"{i}.block")
            states.append(x)
            coef[f"X{i + 1}"] = {f"{i}.block": 1.0}
            if str(i) in self.dwa:
                dwa = self.dwa[str(i)]
                x = dwa(states)
                current = {}
                for a, j in zip(dwa.alpha.detach().double().tolist(), dwa.seen):
                    for n, c in coef[f"X{j}"].items():
                        current[n] = current.get(n, 0.0) + a * c
            else:
                current = {f"{i}.block": 1.0}
        self.mixed["readout"] = (list(names), torch.tensor([current.get(n, 0.0) for n in names]))
        return self.out(x, targets)

    SPEC = ModelSpec(
        embed=["wte", "wpe"],
        writes={"block": "blocks.*"},
        reads={"block": "blocks.*", "readout": "ln_f"},
    )


def rms(x: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Sublayer(nn.Module):
    """A pre-norm sublayer: norm (the consumer's module) then attention or MLP."""

    def __init__(self, attn: bool):
        super().__init__()
        self.norm = nn.RMSNorm(D)
        self.f = SelfAttention() if attn else MLP()

    def forward(self, h: Tensor) -> Tensor:
        return self.f(self.norm(h))


def _pair(make) -> nn.ModuleDict:
    return nn.ModuleDict({"attn": make(True), "mlp": make(False)})


class AttnRes(_LM):
    def __init__(self, n_layer: int = 2):
        super().__init__(n_layer)
        g = torch.Generator().manual_seed(4)
        self.blocks = nn.ModuleList(_pair(Sublayer) for _ in range(n_layer))
        # pseudo-queries (zero at initialisation in the paper: uniform weights; random here)
        self.queries = nn.Parameter(torch.randn(2 * n_layer + 1, D, generator=g))

    def forward(self, idx: Tensor, targets: Tensor | None = None):
        values = [self.wte(idx)]
        names = ["embed"]
        subs = [(f"{b}.{k}", blk[k]) for b, blk in enumerate(self.blocks) for k in ("attn", "mlp")]
        for i, (label, layer) in enumerate([*subs, ("readout", self.ln_f)]):
            v = torch.stack(values)  # [n, b, t, d]
            alpha = torch.einsum("d,nbtd->btn", self.queries[i], rms(v)).softmax(-1)
            h = torch.einsum("btn,nbtd->btd", alpha, v)
            self.mixed[label] = (list(names), alpha.detach().double())
            if label == "readout":
                return self.lm_head(layer(h)), None
            values.append(layer(h))
            names.append(label)
        raise AssertionError

    SPEC = ModelSpec(
        embed=["wte"],
        writes={"attn": "blocks.*.attn.f", "mlp": "blocks.*.mlp.f"},
        reads={"attn": "blocks.*.attn.norm", "mlp": "blocks.*.mlp.norm", "readout": "ln_f"},
        ctx=CTX,
    )


def sinkhorn(logits: Tensor, iters: int = 8) -> Tensor:
    m = logits.exp()
    for _ in range(iters):
        m = m / m.sum(-1, keepdim=True)
        m = m / m.sum(-2, keepdim=True)
    return m


class MHCLayer(nn.Module):
    """One mHC sublayer over S streams X [b, t, S, d]: input sum_s H_pre[s] X_s, output
    X'_t = sum_s H_res[s, t] X_s + H_post[t] f(input)."""

    def __init__(self, attn: bool, streams: int):
        super().__init__()
        self.S = streams
        self.sub = Sublayer(attn)
        self.to_h = nn.Linear(streams * D, streams + streams + streams * streams)
        nn.init.normal_(self.to_h.weight, std=0.3)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        b, t, s, d = x.shape
        raw = self.to_h(rms(x.flatten(2)))
        pre = torch.sigmoid(raw[..., :s])
        post = 2 * torch.sigmoid(raw[..., s : 2 * s])
        res = sinkhorn(raw[..., 2 * s :].view(b, t, s, s))
        y = self.sub(torch.einsum("bts,btsd->btd", pre, x))
        out = torch.einsum("btsu,btsd->btud", res, x)  # H_res applied transposed, as the papers' code
        return out + post.unsqueeze(-1) * y.unsqueeze(2), (pre, res, post)


class MHC(_LM):
    def __init__(self, n_layer: int = 2, streams: int = 3):
        super().__init__(n_layer)
        self.blocks = nn.ModuleList(_pair(lambda attn: MHCLayer(attn, streams)) for _ in range(n_layer))
        self.S = streams

    def forward(self, idx: Tensor, targets: Tensor | None = None):
        e = self.wte(idx)
        x = e.unsqueeze(2).expand(-1, -1, self.S, -1)
        b, t = idx.shape
        coef = torch.zeros(b, t, self.S, 1, dtype=torch.float64)
        coef[..., 0] = 1.0  # every stream starts as the embedding
        names = ["embed"]
        for i, blk in enumerate(self.blocks):
            for kind in ("attn", "mlp"):
                x, (pre, res, post) = blk[kind](x)
                label = f"{i}.{kind}"
                self.mixed[label] = (list(names), torch.einsum("bts,btsn->btn", pre.double(), coef))
                coef = torch.einsum("btsu,btsn->btun", res.double(), coef)
                coef = torch.cat([coef, post.double().unsqueeze(-1)], -1)
                names.append(label)
        self.mixed["readout"] = (list(names), coef.sum(2))
        return self.lm_head(self.ln_f(x.sum(2))), None

    SPEC = ModelSpec(
        embed=["wte"],
        writes={"attn": "blocks.*.attn.sub.f", "mlp": "blocks.*.mlp.sub.f"},
        reads={"attn": "blocks.*.attn.sub.norm", "mlp": "blocks.*.mlp.sub.norm", "readout": "ln_f"},
        ctx=CTX,
    )


class MUDDBlock(nn.Module):
    """A block reading four inputs: x_q, x_k, x_v and the residual x_r, each its own combination of
    the earlier states; out = x_r + attn(q_norm(x_q), k_norm(x_k), v_norm(x_v)), then + mlp."""

    def __init__(self):
        super().__init__()
        self.q_norm, self.k_norm, self.v_norm = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn, self.ln_2, self.mlp = SelfAttention(), nn.LayerNorm(D), MLP()

    def forward(self, xq: Tensor, xk: Tensor, xv: Tensor, xr: Tensor) -> Tensor:
        x = xr + self.attn(self.q_norm(xq), self.k_norm(xk), self.v_norm(xv))
        return x + self.mlp(self.ln_2(x))


class MUDD(_LM):
    def __init__(self, n_layer: int = 3):
        super().__init__(n_layer)
        self.blocks = nn.ModuleList(MUDDBlock() for _ in range(n_layer))
        # dynamic dense weights: from RMSNorm(X_i), 4 ways x (i + 1) states, a static part (the bias:
        # one-hot on the latest state, the scheme's initialisation) + a token part of size ~0.5 at any
        # width (larger per-token weights make the states grow with depth until they are near collinear)
        self.dyn = nn.ModuleList(nn.Linear(D, 4 * (i + 1)) for i in range(n_layer))
        for i, lin in enumerate(self.dyn):
            nn.init.normal_(lin.weight, std=0.5 / D**0.5)
            nn.init.zeros_(lin.bias)
            with torch.no_grad():
                lin.bias.view(4, i + 1)[:, i] = 1.0

    def forward(self, idx: Tensor, targets: Tensor | None = None):
        states = [self.wte(idx)]
        names = ["embed"]
        for i, block in enumerate(self.blocks):
            a = self.dyn[i](rms(states[-1])).view(*idx.shape, 4, i + 1)  # [b, t, way, state]
            s = torch.stack(states)  # [state, b, t, d]
            q, k, v, r = (torch.einsum("btn,nbtd->btd", a[:, :, w], s) for w in range(4))
            # delta basis: the states (embed, j.block) and the attention outputs (j.attn, weight 0
            # in every read but the MLP's, which reads x_r plus its own block's attention output)
            at = [k for k, n in enumerate(names) if not n.endswith(".attn")]

            def spread(w: Tensor, n: int = len(names), at: list[int] = at) -> Tensor:
                full = torch.zeros(*w.shape[:2], n, dtype=torch.float64)
                full[..., at] = w.detach().double()
                return full

            for way, view in enumerate(("q", "k", "v")):
                self.mixed[f"{i}.attn.{view}"] = (list(names), spread(a[:, :, way]))
            mlp_w = spread(a[:, :, 3], len(names) + 1)
            mlp_w[..., -1] = 1.0
            self.mixed[f"{i}.mlp"] = ([*names, f"{i}.attn"], mlp_w)
            states.append(block(q, k, v, r))
            names += [f"{i}.attn", f"{i}.block"]
        last = torch.zeros(*idx.shape, len(names), dtype=torch.float64)
        last[..., -1] = 1.0
        self.mixed["readout"] = (list(names), last)
        return self.lm_head(self.ln_f(states[-1])), None

    SPEC = ModelSpec(
        embed=["wte"],
        writes={"attn": "blocks.*.attn", "block": "blocks.*"},
        reads={
            "attn.q": "blocks.*.q_norm",
            "attn.k": "blocks.*.k_norm",
            "attn.v": "blocks.*.v_norm",
            "mlp": "blocks.*.ln_2",
            "readout": "ln_f",
        },
        ctx=CTX,
    )


MODELS = {"nanogpt": NanoGPT, "denseformer": DenseFormer, "attnres": AttnRes, "mhc": MHC, "mudd": MUDD}


def seeded(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = MODELS[name]()
    return model.eval()


class PerFeature(_LM):
    """Static per-feature weights over the states, as DCA's GRN-v1 has them (arXiv 2502.06785):
    block i reads sum_j b_ij (.) X_j with b_ij in R^d; the read-out reads the last state."""

    def __init__(self, n_layer: int = 3):
        super().__init__(n_layer)
        g = torch.Generator().manual_seed(5)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
        self.b = nn.ParameterList(
            nn.Parameter(1 + 0.5 * torch.randn(i + 1, D, generator=g)) for i in range(n_layer)
        )

    def forward(self, idx: Tensor, targets: Tensor | None = None):
        states = [self.embed(idx)]
        for i, block in enumerate(self.blocks):
            x = sum(b * s for b, s in zip(self.b[i], states))
            states.append(block(x))
        return self.out(states[-1], targets)
