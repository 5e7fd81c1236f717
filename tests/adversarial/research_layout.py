"""Research shapes that lay out or call their stream unusually: time-first tensors, flattened
tokens, modules returning tuples, a forward that takes more than the ids, a module run several
times, torch's own encoder layers, norms applied without a module, a norm called with a keyword,
embeddings called out of order or normed, and a model with nothing that says its context length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    causal,
    scramble_norms,
    weights_of,
)

# --- time-first streams ---------------------------------------------------------------------------


class TimeFirstAttention(nn.Module):
    """fairseq's MultiheadAttention convention: query [T, B, d] in, [T, B, d] out."""

    def __init__(self):
        super().__init__()
        self.in_proj, self.out_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x: Tensor) -> Tensor:
        t, b, d = x.shape
        q, k, v = (
            y.contiguous().view(t, b * HEADS, d // HEADS).transpose(0, 1)
            for y in self.in_proj(x).chunk(3, -1)
        )
        y = causal(q, k, v)  # [b * heads, t, dh]
        return self.out_proj(y.transpose(0, 1).reshape(t, b, d))


class FairseqLayer(nn.Module):
    """fairseq's pre-norm TransformerDecoderLayer: fc1 / fc2 in the layer, no MLP module."""

    def __init__(self):
        super().__init__()
        self.self_attn_layer_norm, self.self_attn = nn.LayerNorm(D), TimeFirstAttention()
        self.final_layer_norm, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.Linear(4 * D, D)


class LearnedPositions(nn.Embedding):
    """fairseq's LearnedPositionalEmbedding shape: called on the tokens, positions from arange."""

    def forward(self, tokens: Tensor) -> Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        return super().forward(pos)


class Fairseq(Recorder):
    """A fairseq-style decoder (fairseq's TransformerDecoder, arXiv 1904.01038): embeddings
    batch-first, ``embed_scale`` sqrt(d) on the tokens (static weight), learned positions, then
    ``x.transpose(0, 1)``: every layer and the final norm see [T, B, d]. ``all_time_first``:
    the tokens are transposed before the embedding instead, so every module, the embeddings
    included, is time-first (the position embedding [T, d], shared over the batch).
    """

    def __init__(self, all_time_first: bool = False, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(30)
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.embed_positions = nn.Embedding(CTX, D) if all_time_first else LearnedPositions(CTX, D)
        self.layers = nn.ModuleList(FairseqLayer() for _ in range(n_layer))
        self.layer_norm, self.output_projection = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.all_time_first, self.embed_scale = all_time_first, math.sqrt(D)
        scramble_norms(self, torch.Generator().manual_seed(3030))

    def forward(self, prev_output_tokens: Tensor) -> Tensor:
        bf = lambda t: t.transpose(0, 1)  # noqa: E731 - [T, B, d] as the oracle's [B, T, d]
        if self.all_time_first:
            tok = self.embed_tokens(prev_output_tokens.t())  # [T, B, d]
            pos = self.embed_positions(torch.arange(prev_output_tokens.shape[1]))  # [T, d]
            self.source("embed", bf(tok)), self.source("embed.embed_positions", pos)
            x = self.embed_scale * tok + pos[:, None, :]
        else:
            tok = self.embed_tokens(prev_output_tokens)
            pos = self.embed_positions(prev_output_tokens)
            self.source("embed", tok), self.source("embed.embed_positions", pos)
            x = (self.embed_scale * tok + pos).transpose(0, 1)
        names, coef = (
            ["embed", "embed.embed_positions"],
            {"embed": self.embed_scale, "embed.embed_positions": 1.0},
        )
        for i, layer in enumerate(self.layers):
            self.consumer(f"{i}.attn", bf(x), names, weights_of(names, coef, bf(x)))
            x = x + self.source(f"{i}.attn", layer.self_attn(layer.self_attn_layer_norm(x)), tf=True)
            names, coef = [*names, f"{i}.attn"], {**coef, f"{i}.attn": 1.0}
            self.consumer(f"{i}.mlp", bf(x), names, weights_of(names, coef, bf(x)))
            y = layer.fc2(F.relu(layer.fc1(layer.final_layer_norm(x))))
            x = x + self.source(f"{i}.mlp", y, tf=True)
            names, coef = [*names, f"{i}.mlp"], {**coef, f"{i}.mlp": 1.0}
        self.consumer("readout", bf(x), names, weights_of(names, coef, bf(x)))
        return self.output_projection(self.layer_norm(x).transpose(0, 1))

    def source(self, label: str, t: Tensor, tf: bool = False) -> Tensor:
        """Record a time-first write as [B, T, d] (the stream is returned as it is)."""
        super().source(label, t.transpose(0, 1) if tf else t)
        return t


FAIRSEQ_SPEC = ModelSpec(
    embed=["embed_tokens", "embed_positions"],
    writes={"attn": "layers.*.self_attn", "mlp": "layers.*.fc2"},
    reads={
        "attn": "layers.*.self_attn_layer_norm",
        "mlp": "layers.*.final_layer_norm",
        "readout": "layer_norm",
    },
)


# --- flattened tokens -----------------------------------------------------------------------------


class SwitchFFN(nn.Module):
    """A Switch Transformer MoE layer (arXiv 2101.03961) without a capacity: each token to its top-1
    expert, scaled by the router probability; returns ([batch * pos, d], router logits)."""

    def __init__(self, experts: int = 4):
        super().__init__()
        self.router = nn.Linear(D, experts, bias=False)
        self.experts = nn.ModuleList(MLP() for _ in range(experts))
        nn.init.normal_(self.router.weight, std=0.5)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        flat = x.reshape(-1, x.shape[-1])
        logits = self.router(flat)
        gate, expert = logits.softmax(-1).max(-1)
        out = torch.zeros_like(flat)
        for e, f in enumerate(self.experts):
            sel = expert == e
            if sel.any():
                out[sel] = gate[sel, None] * f(flat[sel])
        return out, logits


class SwitchBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.moe = (
            nn.LayerNorm(D),
            CausalSelfAttention(),
            nn.LayerNorm(D),
            SwitchFFN(),
        )


class Switch(Recorder):
    """Pre-norm blocks whose MLP is a Switch MoE returning flattened tokens [batch * pos, d] in a
    tuple with the router logits; the block reshapes it back: exact, unit."""

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(31)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(SwitchBlock() for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        scramble_norms(self, torch.Generator().manual_seed(3131))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names = ["embed", "embed.wpe"]
        for i, b in enumerate(self.blocks):
            self.consumer(f"{i}.attn", x, names, 1.0)
            x = x + self.source(f"{i}.attn", b.attn(b.ln_1(x)))
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", x, names, 1.0)
            y, _ = b.moe(b.ln_2(x))
            x = x + self.source(f"{i}.mlp", y.view_as(x))
            names = [*names, f"{i}.mlp"]
        self.consumer("readout", x, names, 1.0)
        return self.lm_head(self.ln_f(x))


SWITCH_SPEC = ModelSpec(
    embed=["wte", "wpe"],
    writes={"attn": "blocks.*.attn", "mlp": "blocks.*.moe"},
    reads={"attn": "blocks.*.ln_1", "mlp": "blocks.*.ln_2", "readout": "ln_f"},
)


class OPTAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = CausalSelfAttention()

    def forward(self, hidden_states: Tensor) -> tuple[Tensor, None]:
        return self.attn(hidden_states), None  # (attn_output, attn_weights)


class OPTLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn_layer_norm, self.self_attn = nn.LayerNorm(D), OPTAttention()
        self.final_layer_norm, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.Linear(4 * D, D)


class OPTPositions(nn.Embedding):
    """OPT's learned positions: from the attention mask's cumulative sum, offset by 2."""

    offset = 2

    def forward(self, attention_mask: Tensor) -> Tensor:
        positions = (torch.cumsum(attention_mask, 1) * attention_mask).long() - 1
        return super().forward(positions + self.offset)


class OPT(Recorder):
    """OPT's decoder layer (arXiv 2205.01068, transformers' OPTDecoderLayer): the MLP half flattens
    the stream to [batch * pos, d] before ``final_layer_norm``, so that norm reads, and fc2 writes,
    flattened tokens; positions offset by 2 (the embedding has ctx + 2 rows; the config says ctx).
    """

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(32)
        self.config = type("OPTConfig", (), {"max_position_embeddings": CTX, "vocab_size": VOCAB})()
        self.embed_tokens, self.embed_positions = nn.Embedding(VOCAB, D), OPTPositions(CTX + 2, D)
        self.layers = nn.ModuleList(OPTLayer() for _ in range(n_layer))
        self.final_layer_norm, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        scramble_norms(self, torch.Generator().manual_seed(3232))

    def forward(self, input_ids: Tensor) -> Tensor:
        mask = torch.ones_like(input_ids)
        x = self.source("embed", self.embed_tokens(input_ids)) + self.source(
            "embed.embed_positions", self.embed_positions(mask)
        )
        names = ["embed", "embed.embed_positions"]
        for i, layer in enumerate(self.layers):
            self.consumer(f"{i}.attn", x, names, 1.0)
            a, _ = layer.self_attn(layer.self_attn_layer_norm(x))
            x = x + self.source(f"{i}.attn", a)
            names = [*names, f"{i}.attn"]
            shape = x.shape
            x = x.reshape(-1, x.size(-1))
            residual = x
            self.consumer(f"{i}.mlp", x.view(shape), names, 1.0)
            y = layer.fc2(F.relu(layer.fc1(layer.final_layer_norm(x))))
            self.source(f"{i}.mlp", y.view(shape))
            x = (residual + y).view(shape)
            names = [*names, f"{i}.mlp"]
        self.consumer("readout", x, names, 1.0)
        return self.lm_head(self.final_layer_norm(x))


OPT_SPEC = ModelSpec(
    embed=["embed_tokens", "embed_positions"],
    writes={"attn": "layers.*.self_attn", "mlp": "layers.*.fc2"},
    reads={
        "attn": "layers.*.self_attn_layer_norm",
        "mlp": "layers.*.final_layer_norm",
        "readout": "final_layer_norm",
    },
)


# --- a block run several times --------------------------------------------------------------------


class SharedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(D), CausalSelfAttention()
        self.ffn_norm, self.ffn = nn.LayerNorm(D), MLP()


class ALBERT(Recorder):
    """ALBERT's cross-layer parameter sharing (arXiv 1909.11942), in a pre-norm causal layer: a
    factorised embedding (E = 16, projected to d by ``embedding_hidden_mapping_in``) and ONE layer
    applied three times. Its modules run three times a forward: refused."""

    def __init__(self, n_repeat: int = 3):
        super().__init__()
        torch.manual_seed(33)
        self.config = type("AlbertConfig", (), {"vocab_size": VOCAB, "max_position_embeddings": CTX})()
        self.word_embeddings, self.position_embeddings = nn.Embedding(VOCAB, 16), nn.Embedding(CTX, 16)
        self.embedding_hidden_mapping_in = nn.Linear(16, D)
        self.shared = SharedLayer()
        self.n_repeat = n_repeat
        self.norm, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.embedding_hidden_mapping_in(self.word_embeddings(idx) + self.position_embeddings(pos))
        x = self.source("embed", x)
        names = ["embed"]
        for i in range(self.n_repeat):
            layer = self.shared
            self.consumer(f"{i}.attn", x, names, 1.0)
            x = x + self.source(f"{i}.attn", layer.attention(layer.attention_norm(x)))
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", x, names, 1.0)
            x = x + self.source(f"{i}.mlp", layer.ffn(layer.ffn_norm(x)))
            names = [*names, f"{i}.mlp"]
        self.consumer("readout", x, names, 1.0)
        return self.lm_head(self.norm(x))


ALBERT_SPEC = ModelSpec(
    embed=["embedding_hidden_mapping_in"],
    writes={"attn": "shared.attention", "mlp": "shared.ffn"},
    reads={"attn": "shared.attention_norm", "mlp": "shared.ffn_norm", "readout": "norm"},
)


# --- Meta's llama: forward(tokens, start_pos) -----------------------------------------------------


@dataclass
class ModelArgs:
    dim: int = D
    n_layers: int = 3
    n_heads: int = HEADS
    vocab_size: int = VOCAB
    norm_eps: float = 1e-5
    max_batch_size: int = 4
    max_seq_len: int = 32


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def _norm(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: Tensor) -> Tensor:
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end).float()
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs))


def apply_rotary_emb(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * f).flatten(3).type_as(xq), torch.view_as_real(xk_ * f).flatten(3).type_as(
        xk
    )


class LlamaAttention(nn.Module):
    """Meta llama's Attention: a key/value cache written at start_pos, rotary embeddings."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.dim // args.n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(args.dim, args.dim, bias=False) for _ in range(4))
        shape = (args.max_batch_size, args.max_seq_len, self.n_heads, self.head_dim)
        self.cache_k, self.cache_v = torch.zeros(shape), torch.zeros(shape)

    def forward(self, x: Tensor, start_pos: int, freqs_cis: Tensor, mask: Tensor | None) -> Tensor:
        bsz, seqlen, _ = x.shape
        xq, xk, xv = (
            w(x).view(bsz, seqlen, self.n_heads, self.head_dim) for w in (self.wq, self.wk, self.wv)
        )
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        self.cache_k, self.cache_v = self.cache_k.to(xq), self.cache_v.to(xq)
        self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
        self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
        keys = self.cache_k[:bsz, : start_pos + seqlen].transpose(1, 2)
        values = self.cache_v[:bsz, : start_pos + seqlen].transpose(1, 2)
        scores = xq.transpose(1, 2) @ keys.transpose(2, 3) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        out = scores.float().softmax(-1).type_as(xq) @ values
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1, self.w2, self.w3 = (
            nn.Linear(dim, hidden_dim, False),
            nn.Linear(hidden_dim, dim, False),
            nn.Linear(dim, hidden_dim, False),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.layer_id = layer_id
        self.attention, self.feed_forward = LlamaAttention(args), FeedForward(args.dim, 3 * args.dim)
        self.attention_norm, self.ffn_norm = (
            RMSNorm(args.dim, args.norm_eps),
            RMSNorm(args.dim, args.norm_eps),
        )


class Llama(Recorder):
    """Meta's llama reference code (arXiv 2302.13971, meta-llama/llama ``model.py``): no config
    object but ``params``, ``forward(tokens, start_pos)`` under ``torch.inference_mode``, a KV cache
    of ``max_batch_size`` rows, rotary positions, RMSNorm in float32 and a float32 output. Captured
    with ``forward=lambda m, t: m(t, 0)``; nothing names the context length but the ids."""

    def __init__(self, params: ModelArgs | None = None):
        super().__init__()
        torch.manual_seed(34)
        self.params = params = params or ModelArgs()
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.layers = nn.ModuleList(TransformerBlock(i, params) for i in range(params.n_layers))
        self.norm = RMSNorm(params.dim, params.norm_eps)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False)
        self.freqs_cis = precompute_freqs_cis(params.dim // params.n_heads, params.max_seq_len * 2)
        g = torch.Generator().manual_seed(3434)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, RMSNorm):
                    m.weight.copy_(1 + 0.3 * torch.randn(params.dim, generator=g))

    @torch.inference_mode()
    def forward(self, tokens: Tensor, start_pos: int) -> Tensor:
        _bsz, seqlen = tokens.shape
        h = self.source("embed", self.tok_embeddings(tokens))
        freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]
        mask = None
        if seqlen > 1:
            mask = torch.triu(torch.full((seqlen, seqlen), float("-inf")), diagonal=1)
            mask = torch.hstack([torch.zeros((seqlen, start_pos)), mask]).type_as(h)
        names = ["embed"]
        for i, layer in enumerate(self.layers):
            self.consumer(f"{i}.attn", h, names, 1.0)
            h = h + self.source(
                f"{i}.attn", layer.attention(layer.attention_norm(h), start_pos, freqs_cis, mask)
            )
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", h, names, 1.0)
            h = h + self.source(f"{i}.mlp", layer.feed_forward(layer.ffn_norm(h)))
            names = [*names, f"{i}.mlp"]
        self.consumer("readout", h, names, 1.0)
        return self.output(self.norm(h)).float()


LLAMA_SPEC = ModelSpec(
    embed=["tok_embeddings"],
    writes={"attn": "layers.*.attention", "mlp": "layers.*.feed_forward"},
    reads={"attn": "layers.*.attention_norm", "mlp": "layers.*.ffn_norm", "readout": "norm"},
)


# --- torch's nn.TransformerEncoderLayer -----------------------------------------------------------


class TorchEncoderStack(Recorder):
    """A causal LM built from ``nn.TransformerEncoderLayer(norm_first=True, batch_first=True)``, as a
    quick research baseline does. In eval under no_grad torch runs such a layer through one fused
    kernel (``torch._transformer_encoder_layer_fwd``), calling none of its submodules, unless a hook
    sits on one of its modules (torch 2.x checks). The record runs the layer's own unfused steps
    (``norm1``, ``self_attn``, ``linear1``/``linear2``: the same arithmetic) so the oracle sees the
    writes. ``states``: the spec reads the layers' inputs and outputs (states) instead of the
    sublayers.
    """

    def __init__(self, states: bool = False, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(35)
        self.embedding, self.pos_embedding = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                D, HEADS, 4 * D, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            for _ in range(n_layer)
        )
        self.norm, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.states = states
        scramble_norms(self, torch.Generator().manual_seed(3535))

    def forward(self, idx: Tensor) -> Tensor:
        t = idx.shape[1]
        x = self.source("embed", self.embedding(idx)) + self.source(
            "embed.pos_embedding", self.pos_embedding(torch.arange(t))
        )
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        names, coef = ["embed", "embed.pos_embedding"], {"embed": 1.0, "embed.pos_embedding": 1.0}
        for i, layer in enumerate(self.layers):
            if not self.recording:
                x = layer(x, src_mask=mask, is_causal=True)
                continue
            n = layer.norm1(x)
            a = layer.self_attn(n, n, n, attn_mask=mask, need_weights=False, is_causal=True)[0]
            h = x + a
            m = layer.linear2(layer.activation(layer.linear1(layer.norm2(h))))
            if self.states:
                self.consumer(f"{i}.block", x, names, weights_of(names, coef, x))
                names, coef = [*names, f"{i}.block"], {f"{i}.block": 1.0}
                x = self.source(f"{i}.block", h + m)
                continue
            self.consumer(f"{i}.attn", x, names, weights_of(names, coef, x))
            names, coef = [*names, f"{i}.attn"], {**coef, f"{i}.attn": 1.0}
            self.source(f"{i}.attn", a)
            self.consumer(f"{i}.mlp", h, names, weights_of(names, coef, h))
            names, coef = [*names, f"{i}.mlp"], {**coef, f"{i}.mlp": 1.0}
            self.source(f"{i}.mlp", m)
            x = h + m
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.norm(x))


TORCH_ENCODER_SPEC = ModelSpec(
    embed=["embedding", "pos_embedding"],
    writes={"attn": "layers.*.self_attn", "mlp": "layers.*.linear2"},
    reads={"attn": "layers.*.norm1", "mlp": "layers.*.norm2", "readout": "norm"},
)
TORCH_ENCODER_STATES_SPEC = ModelSpec(
    embed=["embedding", "pos_embedding"],
    writes={"block": "layers.*"},
    reads={"block": "layers.*", "readout": "norm"},
)


# --- norms without a module, or called with a keyword ---------------------------------------------


class FunctionalLNBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1_weight, self.ln_1_bias = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        self.ln_2_weight, self.ln_2_bias = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        self.attn, self.mlp = CausalSelfAttention(), MLP()

    def forward(self, x: Tensor) -> Tensor:
        a = self.attn(F.layer_norm(x, (D,), self.ln_1_weight, self.ln_1_bias))
        h = x + a
        m = self.mlp(F.layer_norm(h, (D,), self.ln_2_weight, self.ln_2_bias))
        self.seen = (x, a, h, m)
        return h + m


class FunctionalLN(Recorder):
    """A nanoGPT variant whose norms are ``F.layer_norm`` calls on parameters of the block (as
    minimal research code and some JAX ports write them): there is no module whose input is the
    stream before the MLP or the head. ``at``: what the user names as reads: ``"modules"`` the
    attention and MLP modules (whose inputs are the layer-normed stream: no scalar weights exist,
    those reads are not recorded, a trace that gives them numbers is judged wrong) or ``"block"``
    each block's input for its attention (the stream itself: unit), and nothing for the MLPs.
    """

    def __init__(self, at: str = "modules", n_layer: int = 3):
        super().__init__()
        torch.manual_seed(36)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(FunctionalLNBlock() for _ in range(n_layer))
        self.ln_f_weight, self.ln_f_bias = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.at = at
        g = torch.Generator().manual_seed(3636)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "ln_" in name:
                    p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn(D, generator=g))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names = ["embed", "embed.wpe"]
        for i, b in enumerate(self.blocks):
            out = b(x)
            x_in, a, _, m = b.seen
            if self.at == "block":
                self.consumer(f"{i}.attn", x_in, names, 1.0)
            self.source(f"{i}.attn", a), self.source(f"{i}.mlp", m)
            names = [*names, f"{i}.attn", f"{i}.mlp"]
            x = out
        return self.lm_head(F.layer_norm(x, (D,), self.ln_f_weight, self.ln_f_bias))


class LayerNorm(nn.Module):
    """A LayerNorm module whose forward names its argument ``x`` (called as ``ln(x=h)``)."""

    def __init__(self, d: int):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class KeywordBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = LayerNorm(D), CausalSelfAttention(), LayerNorm(D), MLP()


class KeywordNorms(Recorder):
    """A nanoGPT whose norms are called with a keyword argument, ``self.ln_1(x=h)``, as code that
    passes everything by name does: exact, unit."""

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(37)
        self.config = type("GPTConfig", (), {"block_size": CTX})()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(KeywordBlock() for _ in range(n_layer))
        self.ln_f, self.lm_head = LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        g = torch.Generator().manual_seed(3737)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, LayerNorm):
                    m.weight.copy_(1 + 0.3 * torch.randn(D, generator=g))
                    m.bias.copy_(0.1 * torch.randn(D, generator=g))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names = ["embed", "embed.wpe"]
        for i, b in enumerate(self.blocks):
            self.consumer(f"{i}.attn", x, names, 1.0)
            x = x + self.source(f"{i}.attn", b.attn(b.ln_1(x=x)))
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", x, names, 1.0)
            x = x + self.source(f"{i}.mlp", b.mlp(b.ln_2(x=x)))
            names = [*names, f"{i}.mlp"]
        self.consumer("readout", x, names, 1.0)
        return self.lm_head(self.ln_f(x=x))


# --- tuples ---------------------------------------------------------------------------------------


class CachingAttention(CausalSelfAttention):
    """Attention returning (output, present key/value), as HF-style code does."""

    def forward(self, x: Tensor, layer_past=None, use_cache: bool = False):
        out = super().forward(x)
        return out, ((x, x) if use_cache else None)


class StatsMLP(MLP):
    """An MLP returning (output, the fraction of active units): an auxiliary statistic."""

    def forward(self, x: Tensor):
        hid = self.c_fc(x)
        return self.c_proj(F.gelu(hid)), (hid > 0).float().mean()


class TupleBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = (
            nn.LayerNorm(D),
            CachingAttention(),
            nn.LayerNorm(D),
            StatsMLP(),
        )

    def forward(self, x: Tensor, layer_past=None, use_cache: bool = False):
        a, present = self.attn(self.ln_1(x), layer_past=layer_past, use_cache=use_cache)
        h = x + a
        m, active = self.mlp(self.ln_2(h))
        self.seen = (x, a, h, m)
        return h + m, (present, active)


class Tuples(Recorder):
    """Blocks, attention and MLP that all return tuples ((x, (present, stats)), (out, present),
    (out, stats)), called with keyword arguments beside the stream. ``states``: the spec names the
    blocks (their first output a state, their first input the stream) instead of the sublayers."""

    def __init__(self, states: bool = False, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(38)
        self.config = type("Config", (), {"n_positions": CTX})()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.h = nn.ModuleList(TupleBlock() for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.states = states
        scramble_norms(self, torch.Generator().manual_seed(3838))

    def forward(self, idx: Tensor) -> tuple[Tensor, list]:
        pos = torch.arange(idx.shape[1])
        x = self.source("embed", self.wte(idx)) + self.source("embed.wpe", self.wpe(pos))
        names, coef = ["embed", "embed.wpe"], {"embed": 1.0, "embed.wpe": 1.0}
        presents = []
        for i, block in enumerate(self.h):
            x_new, present = block(x, layer_past=None, use_cache=True)
            presents.append(present)
            x_in, a, h, m = block.seen
            if self.states:
                self.consumer(f"{i}.block", x_in, names, weights_of(names, coef, x_in))
                names, coef = [*names, f"{i}.block"], {f"{i}.block": 1.0}
                self.source(f"{i}.block", x_new)
            else:
                self.consumer(f"{i}.attn", x_in, names, 1.0)
                names = [*names, f"{i}.attn"]
                self.source(f"{i}.attn", a)
                self.consumer(f"{i}.mlp", h, names, 1.0)
                names = [*names, f"{i}.mlp"]
                self.source(f"{i}.mlp", m)
                coef = dict.fromkeys(names, 1.0)
            x = x_new
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.ln_f(x)), presents


# --- embeddings: called out of order, normed, alone -----------------------------------------------


class PositionsFirst(Recorder):
    """A nanoGPT whose forward calls the position embedding before the token embedding,
    ``x = self.wpe(pos); x = x + self.wte(idx)``; the spec still lists the token embedding first."""

    def __init__(self, n_layer: int = 2):
        super().__init__()
        torch.manual_seed(39)
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln_1": nn.LayerNorm(D),
                    "attn": CausalSelfAttention(),
                    "ln_2": nn.LayerNorm(D),
                    "mlp": MLP(),
                }
            )
            for _ in range(n_layer)
        )
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        scramble_norms(self, torch.Generator().manual_seed(3939))

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed.wpe", self.wpe(torch.arange(idx.shape[1])))
        x = x + self.source("embed", self.wte(idx))
        names = ["embed", "embed.wpe"]
        for i, b in enumerate(self.blocks):
            self.consumer(f"{i}.attn", x, names, 1.0)
            x = x + self.source(f"{i}.attn", b["attn"](b["ln_1"](x)))
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", x, names, 1.0)
            x = x + self.source(f"{i}.mlp", b["mlp"](b["ln_2"](x)))
            names = [*names, f"{i}.mlp"]
        self.consumer("readout", x, names, 1.0)
        return self.lm_head(self.ln_f(x))


class NoPE(Recorder):
    """A decoder with no position embedding at all (NoPE, arXiv 2305.19466) and no config: nothing
    but the token ids says the context length."""

    def __init__(self, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(40)
        self.wte = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln_1": nn.LayerNorm(D),
                    "attn": CausalSelfAttention(),
                    "ln_2": nn.LayerNorm(D),
                    "mlp": MLP(),
                }
            )
            for _ in range(n_layer)
        )
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        scramble_norms(self, torch.Generator().manual_seed(4040))

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed", self.wte(idx))
        names = ["embed"]
        for i, b in enumerate(self.blocks):
            self.consumer(f"{i}.attn", x, names, 1.0)
            x = x + self.source(f"{i}.attn", b["attn"](b["ln_1"](x)))
            names = [*names, f"{i}.attn"]
            self.consumer(f"{i}.mlp", x, names, 1.0)
            x = x + self.source(f"{i}.mlp", b["mlp"](b["ln_2"](x)))
            names = [*names, f"{i}.mlp"]
        self.consumer("readout", x, names, 1.0)
        return self.lm_head(self.ln_f(x))


def blocks_spec(embed, **kw) -> ModelSpec:
    return ModelSpec(
        embed=embed,
        writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
        reads={"attn": "blocks.*.ln_1", "mlp": "blocks.*.ln_2", "readout": "ln_f"},
        **kw,
    )


class AlibiAttention(CausalSelfAttention):
    """Causal attention with ALiBi biases (arXiv 2108.12409)."""

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = (
            y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in self.c_attn(x).split(d, -1)
        )
        slopes = 2.0 ** (-8.0 * torch.arange(1, self.heads + 1) / self.heads)
        dist = torch.arange(t)[None, :] - torch.arange(t)[:, None]  # key - query
        bias = slopes[:, None, None] * dist.clamp(max=0)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads) + bias
        y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class BloomBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.self_attention = nn.LayerNorm(D), AlibiAttention()
        self.post_attention_layernorm, self.mlp = nn.LayerNorm(D), MLP()


class Bloom(Recorder):
    """BLOOM (arXiv 2211.05100): ALiBi, no position embedding, and a LayerNorm right after the word
    embedding (``word_embeddings_layernorm``) before the first block. ``embed_at_norm``: the spec
    names that norm as the embedding (its output is the first source: exact); else the word
    embedding itself, whose normed output is no scalar combination of it (refused; those reads are
    not recorded, a trace that gives them numbers is judged wrong)."""

    def __init__(self, embed_at_norm: bool = True, n_layer: int = 3):
        super().__init__()
        torch.manual_seed(41)
        self.config = type("BloomConfig", (), {"vocab_size": VOCAB})()
        self.word_embeddings, self.word_embeddings_layernorm = nn.Embedding(VOCAB, D), nn.LayerNorm(D)
        self.h = nn.ModuleList(BloomBlock() for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.embed_at_norm = embed_at_norm
        scramble_norms(self, torch.Generator().manual_seed(4141))

    def forward(self, input_ids: Tensor) -> Tensor:
        e = self.word_embeddings(input_ids)
        x = self.word_embeddings_layernorm(e)
        if not self.embed_at_norm:  # no read is a scalar combination of the word embedding and writes
            self.source("embed", e)
            return self.lm_head(self.ln_f(self._blocks(x, None)))
        self.source("embed", x)
        return self.lm_head(self.ln_f(self._blocks(x, ["embed"])))

    def _blocks(self, x: Tensor, names: list[str] | None) -> Tensor:
        for i, b in enumerate(self.h):
            for kind, norm, f in (
                ("attn", b.input_layernorm, b.self_attention),
                ("mlp", b.post_attention_layernorm, b.mlp),
            ):
                if names is not None:
                    self.consumer(f"{i}.{kind}", x, names, 1.0)
                    names = [*names, f"{i}.{kind}"]
                x = x + self.source(f"{i}.{kind}", f(norm(x)))
        if names is not None:
            self.consumer("readout", x, names, 1.0)
        return x


def bloom_spec(embed: str) -> ModelSpec:
    return ModelSpec(
        embed=[embed],
        writes={"attn": "h.*.self_attention", "mlp": "h.*.mlp"},
        reads={"attn": "h.*.input_layernorm", "mlp": "h.*.post_attention_layernorm", "readout": "ln_f"},
        ctx=CTX,
    )


class MinGPT(Recorder):
    """Karpathy's original minGPT: the position embedding is a parameter added to the stream,
    ``x = tok_emb(idx) + self.pos_emb[:, :t]``, not a module; no module writes it, so no spec can
    name it and the reads are no combination of the named writes: refused."""

    def __init__(self, n_layer: int = 2):
        super().__init__()
        torch.manual_seed(42)
        self.block_size = CTX
        self.tok_emb = nn.Embedding(VOCAB, D)
        self.pos_emb = nn.Parameter(0.5 * torch.randn(1, CTX, D))
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln_1": nn.LayerNorm(D),
                    "attn": CausalSelfAttention(),
                    "ln_2": nn.LayerNorm(D),
                    "mlp": MLP(),
                }
            )
            for _ in range(n_layer)
        )
        self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.source("embed", self.tok_emb(idx)) + self.pos_emb[:, : idx.shape[1]]
        for i, b in enumerate(self.blocks):  # no read is a combination of the sources: none recorded
            x = x + self.source(f"{i}.attn", b["attn"](b["ln_1"](x)))
            x = x + self.source(f"{i}.mlp", b["mlp"](b["ln_2"](x)))
        return self.head(self.ln_f(x))


class MemoryTokens(Recorder):
    """Memory tokens (Memory Transformer, arXiv 2006.11527; registers, arXiv 2309.16588): M learned
    vectors prepended to the sequence, so every layer sees pos + M positions, dropped before the
    head. The stream is no view of the token positions and the memory no module's output: refused
    (no read is recorded)."""

    def __init__(self, n_layer: int = 2, memory: int = 2):
        super().__init__()
        torch.manual_seed(43)
        self.config = type("Config", (), {"block_size": CTX})()
        self.wte = nn.Embedding(VOCAB, D)
        self.memory = nn.Parameter(torch.randn(memory, D))
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln_1": nn.LayerNorm(D),
                    "attn": CausalSelfAttention(),
                    "ln_2": nn.LayerNorm(D),
                    "mlp": MLP(),
                }
            )
            for _ in range(n_layer)
        )
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        m = self.memory.shape[0]
        x = torch.cat([self.memory.expand(idx.shape[0], -1, -1), self.source("embed", self.wte(idx))], 1)
        for b in self.blocks:
            x = x + b["attn"](b["ln_1"](x))
            x = x + b["mlp"](b["ln_2"](x))
        return self.lm_head(self.ln_f(x[:, m:]))


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), in float32, weight zero at initialisation."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class WindowAttention(CausalSelfAttention):
    """Causal attention, limited to the last ``window`` positions when ``window`` is set."""

    def __init__(self, window: int | None):
        super().__init__(bias=False)
        self.window = window

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = (
            y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in self.c_attn(x).split(d, -1)
        )
        i = torch.arange(t)
        mask = (i[None, :] <= i[:, None]) & ((i[:, None] - i[None, :] < self.window) if self.window else True)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class Gemma2Layer(nn.Module):
    def __init__(self, sliding: bool):
        super().__init__()
        self.input_layernorm, self.self_attn = GemmaRMSNorm(D), WindowAttention(4 if sliding else None)
        self.post_attention_layernorm = GemmaRMSNorm(D)
        self.pre_feedforward_layernorm, self.mlp, self.post_feedforward_layernorm = (
            GemmaRMSNorm(D),
            MLP(bias=False),
            GemmaRMSNorm(D),
        )


class Gemma2(Recorder):
    """Gemma 2's layout (arXiv 2408.00118): the embedding times sqrt(d) (a static weight), sandwich
    norms (the writes are the post norms' outputs), and sliding-window layers alternating with
    global ones under the same module names, so the spec tells them apart by literal paths
    (``layers.0.self_attn`` ... under ``swa``, the others under ``attn``)."""

    def __init__(self, n_layer: int = 4):
        super().__init__()
        torch.manual_seed(44)
        self.config = type("Gemma2Config", (), {"max_position_embeddings": CTX, "vocab_size": VOCAB})()
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Gemma2Layer(sliding=i % 2 == 0) for i in range(n_layer))
        self.norm, self.lm_head = GemmaRMSNorm(D), nn.Linear(D, VOCAB, bias=False)
        g = torch.Generator().manual_seed(4444)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, GemmaRMSNorm):
                    m.weight.copy_(0.3 * torch.randn(D, generator=g))

    def forward(self, input_ids: Tensor) -> Tensor:
        e = self.source("embed", self.embed_tokens(input_ids))
        normalizer = torch.tensor(D**0.5, dtype=e.dtype)
        x = e * normalizer
        names, coef = ["embed"], {"embed": float(normalizer)}
        for i, layer in enumerate(self.layers):
            kind = "swa" if layer.self_attn.window else "attn"
            for k, pre, f, post in (
                (kind, layer.input_layernorm, layer.self_attn, layer.post_attention_layernorm),
                ("mlp", layer.pre_feedforward_layernorm, layer.mlp, layer.post_feedforward_layernorm),
            ):
                self.consumer(f"{i}.{k}", x, names, weights_of(names, coef, x))
                x = x + self.source(f"{i}.{k}", post(f(pre(x))))
                names, coef = [*names, f"{i}.{k}"], {**coef, f"{i}.{k}": 1.0}
        self.consumer("readout", x, names, weights_of(names, coef, x))
        return self.lm_head(self.norm(x))


GEMMA2_SPEC = ModelSpec(
    embed=["embed_tokens"],
    writes={
        "swa": ["layers.0.post_attention_layernorm", "layers.2.post_attention_layernorm"],
        "attn": ["layers.1.post_attention_layernorm", "layers.3.post_attention_layernorm"],
        "mlp": "layers.*.post_feedforward_layernorm",
    },
    reads={
        "swa": ["layers.0.input_layernorm", "layers.2.input_layernorm"],
        "attn": ["layers.1.input_layernorm", "layers.3.input_layernorm"],
        "mlp": "layers.*.pre_feedforward_layernorm",
        "readout": "norm",
    },
)


NOT_SCALAR = r"not a scalar combination"

CASES = [
    Case(
        "fairseq: batch-first embeddings, time-first layers",
        "time-first",
        lambda: Fairseq().eval(),
        FAIRSEQ_SPEC,
    ),
    Case(
        "fairseq: every module time-first",
        "time-first",
        lambda: Fairseq(all_time_first=True).eval(),
        FAIRSEQ_SPEC,
    ),
    Case("Switch MoE returning flattened tokens", "moe", lambda: Switch().eval(), SWITCH_SPEC),
    Case("OPT: the MLP norm reads flattened tokens", "moe", lambda: OPT().eval(), OPT_SPEC),
    Case(
        "ALBERT: one layer applied three times",
        "shared",
        lambda: ALBERT().eval(),
        ALBERT_SPEC,
        "refused",
        r"runs 3 times",
    ),
    Case(
        "Meta llama forward(tokens, start_pos)",
        "llama",
        lambda: Llama().eval(),
        LLAMA_SPEC,
        forward=lambda m, t: m(t, 0),
    ),
    Case(
        "nn.TransformerEncoderLayer stack, sublayers",
        "torch-encoder",
        lambda: TorchEncoderStack().eval(),
        TORCH_ENCODER_SPEC,
    ),
    Case(
        "nn.TransformerEncoderLayer stack, layer states",
        "torch-encoder",
        lambda: TorchEncoderStack(states=True).eval(),
        TORCH_ENCODER_STATES_SPEC,
    ),
    Case(
        "F.layer_norm without a module, sublayer inputs read",
        "functional-norm",
        lambda: FunctionalLN("modules").eval(),
        ModelSpec(
            embed=["wte", "wpe"],
            writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
            reads={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp", "readout": "lm_head"},
        ),
        expect="refused",
        match=NOT_SCALAR,
    ),
    Case(
        "F.layer_norm without a module, block inputs read",
        "functional-norm",
        lambda: FunctionalLN("block").eval(),
        ModelSpec(
            embed=["wte", "wpe"],
            writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
            reads={"attn": "blocks.*"},
        ),
    ),
    Case(
        "tuples from sublayers and blocks, sublayers named",
        "tuple",
        lambda: Tuples().eval(),
        ModelSpec(
            embed=["wte", "wpe"],
            writes={"attn": "h.*.attn", "mlp": "h.*.mlp"},
            reads={"attn": "h.*.ln_1", "mlp": "h.*.ln_2", "readout": "ln_f"},
        ),
    ),
    Case(
        "tuples from sublayers and blocks, blocks named",
        "tuple",
        lambda: Tuples(states=True).eval(),
        ModelSpec(embed=["wte", "wpe"], writes={"block": "h.*"}, reads={"block": "h.*", "readout": "ln_f"}),
    ),
    Case(
        "norms called with a keyword argument",
        "kwarg-read",
        lambda: KeywordNorms().eval(),
        blocks_spec(["wte", "wpe"]),
    ),
    Case(
        "position embedding called before the token embedding",
        "embed-order",
        lambda: PositionsFirst().eval(),
        blocks_spec(["wte", "wpe"]),
    ),
    Case("no config, no position embedding", "no-ctx", lambda: NoPE().eval(), blocks_spec(["wte"])),
    Case(
        "ModelSpec(embed='wte') as one string",
        "spec-string",
        lambda: NoPE().eval(),
        blocks_spec("wte", ctx=CTX),
    ),
    Case(
        "BLOOM embedding LayerNorm named as the embedding",
        "embed-norm",
        lambda: Bloom().eval(),
        bloom_spec("word_embeddings_layernorm"),
    ),
    Case(
        "BLOOM word embedding named before its LayerNorm",
        "embed-norm",
        lambda: Bloom(embed_at_norm=False).eval(),
        bloom_spec("word_embeddings"),
        expect="refused",
        match=NOT_SCALAR,
    ),
    Case(
        "minGPT: a position parameter, no module writes it",
        "embed-norm",
        lambda: MinGPT().eval(),
        ModelSpec(
            embed=["tok_emb"],
            writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
            reads={"attn": "blocks.*.ln_1", "mlp": "blocks.*.ln_2", "readout": "ln_f"},
        ),
        expect="refused",
        match=NOT_SCALAR,
    ),
    Case(
        "memory tokens prepended to the stream",
        "time-first",
        lambda: MemoryTokens().eval(),
        ModelSpec(
            embed=["wte"],
            writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
            reads={"attn": "blocks.*.ln_1", "mlp": "blocks.*.ln_2", "readout": "ln_f"},
        ),
        expect="refused",
        match=r"shape|\b10\b",
    ),
    Case(
        "Gemma 2: sliding and global layers named by literal paths",
        "sandwich",
        lambda: Gemma2().eval(),
        GEMMA2_SPEC,
    ),
    Case(
        "fairseq time-first, a batch of one",
        "batch-1",
        lambda: Fairseq().eval(),
        FAIRSEQ_SPEC,
        shape=(1, 16),
    ),
    Case(
        "Switch MoE flattened tokens, a batch of one",
        "batch-1",
        lambda: Switch().eval(),
        SWITCH_SPEC,
        shape=(1, 16),
    ),
]
