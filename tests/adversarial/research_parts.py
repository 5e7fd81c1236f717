"""What the research-shaped models (``research*.py``) share: causal attention and an MLP written the
way nanoGPT-style code writes them, a plain nanoGPT (for the cases about a spec rather than a
model), and the bookkeeping of a model's own oracle.

The oracle's bookkeeping: a model keeps, next to its stream ``x``, the weights ``x`` has over the
sources written so far (``Coef``: label -> a float for a static weight, a [batch, pos, 1] tensor
for a per-token one, a [d] or [batch, pos, d] tensor for a per-feature one), updated with the
same parameters and the same gates as ``x`` itself; ``weights_of`` turns it into the tensor
``Recorder.consumer`` takes. None of it is depthscope's code.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from tests.adversarial.harness import Recorder

VOCAB, CTX, D, HEADS = 64, 16, 32, 2

Coef = dict[str, "float | Tensor"]


def combine(*terms: tuple[float | Tensor, Coef]) -> Coef:
    """sum_k a_k * coef_k, label by label (``a_k`` a float or a tensor broadcast like a weight)."""
    out: Coef = {}
    for a, coef in terms:
        for label, w in coef.items():
            out[label] = out.get(label, 0.0) + a * w
    return out


def weights_of(names: list[str], coef: Coef, h: Tensor) -> Tensor:
    """The weights of a consumer reading ``h`` [batch, pos, d] over ``names``: [n] where every weight
    is static, [batch, pos, n] where some is per token, [batch, pos, n, d] where some is per feature.
    """
    vals = [coef.get(n, 0.0) for n in names]
    if not any(isinstance(v, Tensor) for v in vals):
        return torch.tensor([float(v) for v in vals], dtype=torch.float64)
    b, t, d = h.shape
    ts = [torch.as_tensor(v, dtype=torch.float64) for v in vals]
    if all(x.ndim == 0 or x.shape[-1] == 1 for x in ts):
        return torch.stack([x.expand(b, t, 1)[..., 0] for x in ts], -1)
    return torch.stack([x.expand(b, t, d) for x in ts], 2)


def scalar(p: Tensor) -> float:
    """A 0-d parameter's value as the model holds it (its own dtype's rounding included)."""
    return float(p.detach().double())


def token(g: Tensor) -> Tensor:
    """A per-token factor [batch, pos, 1] as the model holds it, in float64, for a ``Coef``."""
    return g.detach().to(torch.float64, copy=True)


def rms_factor(x: Tensor, eps: float | None = None) -> Tensor:
    """1 / rms(x) per token, [batch, pos, 1], as an RMS norm without weight scales ``x`` (eps as
    ``F.rms_norm``'s default: the dtype's machine epsilon)."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return torch.rsqrt(x.detach().double().pow(2).mean(-1, keepdim=True) + eps)


def causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax attention over [batch, heads, pos, dh], written out (no fused kernel)."""
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    return att.masked_fill(~mask, float("-inf")).softmax(-1) @ v


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: one qkv projection, heads, causal softmax, an output projection."""

    def __init__(self, d: int = D, heads: int = HEADS, bias: bool = True):
        super().__init__()
        self.c_attn, self.c_proj, self.heads = (
            nn.Linear(d, 3 * d, bias=bias),
            nn.Linear(d, d, bias=bias),
            heads,
        )

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = (
            y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in self.c_attn(x).split(d, -1)
        )
        y = causal(q, k, v)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int = D, bias: bool = True):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(d, 4 * d, bias=bias), nn.Linear(4 * d, d, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class GPTBlock(nn.Module):
    """nanoGPT's pre-norm block; it keeps what it read and wrote (``seen``) for its model's record."""

    def __init__(self, d: int = D):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = (
            nn.LayerNorm(d),
            CausalSelfAttention(d),
            nn.LayerNorm(d),
            MLP(d),
        )

    def forward(self, x: Tensor) -> Tensor:
        a = self.attn(self.ln_1(x))
        h = x + a
        m = self.mlp(self.ln_2(h))
        self.seen = (x, a, h, m)
        return h + m


def scramble_norms(model: nn.Module, generator: torch.Generator) -> None:
    """Norm weights and biases off their initialisation (ones, zeros), as a trained model has them."""
    for m in model.modules():
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm)) and m.weight is not None:
            with torch.no_grad():
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=generator))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=generator))


class NanoGPT(Recorder):
    """Karpathy's nanoGPT: wte + wpe(arange(T)) (shared over the batch), pre-norm blocks ln_1/attn/
    ln_2/mlp, ln_f, lm_head. With ``states``, each block's output is recorded too (``{i}.block``,
    weight 0 beside the writes inside it), for specs that name a block beside its increments; with
    ``duplicate``, each attention output a second time as ``{i}.swa`` (weight 0 beside ``{i}.attn``),
    for specs that name a module and a wrapper around it.
    """

    def __init__(
        self, n_layer: int = 3, d: int = D, states: bool = False, seed: int = 0, duplicate: bool = False
    ):
        super().__init__()
        torch.manual_seed(seed)
        self.config = type("GPTConfig", (), {"block_size": CTX, "vocab_size": VOCAB, "n_embd": d})()
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(CTX, d)
        self.h = nn.ModuleList(GPTBlock(d) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, VOCAB, bias=False)
        self.states, self.duplicate = states, duplicate
        scramble_norms(self, torch.Generator().manual_seed(seed + 100))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names, coef = ["embed", "embed.wpe"], {"embed": 1.0, "embed.wpe": 1.0}
        for i, block in enumerate(self.h):
            out = block(x)
            x_in, a, h, m = block.seen
            self.consumer(f"{i}.attn", x_in, names, weights_of(names, coef, x_in))
            if self.duplicate:  # the same tensor, written by the inner module and its wrapper
                names = [*names, f"{i}.swa"]
                self.source(f"{i}.swa", a)
            names, coef = [*names, f"{i}.attn"], {**coef, f"{i}.attn": 1.0}
            self.source(f"{i}.attn", a)
            self.consumer(f"{i}.mlp", h, names, weights_of(names, coef, h))
            names, coef = [*names, f"{i}.mlp"], {**coef, f"{i}.mlp": 1.0}
            self.source(f"{i}.mlp", m)
            if self.states:  # the state is the sum of the writes before it: weight 0 beside them
                names = [*names, f"{i}.block"]
                self.source(f"{i}.block", out)
            x = out
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.ln_f(x))
