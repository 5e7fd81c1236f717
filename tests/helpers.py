"""Helpers shared by the tests: tiny configs, weight sharing, delta-basis reconstruction."""

from __future__ import annotations

import torch

from depthscope.schemes import DepthModel, ModelConfig, consumers, sources

TINY = dict(n_layers=3, d_model=16, n_heads=2, ctx=32)


def tiny(scheme: str = "standard", options: dict | None = None, **size) -> ModelConfig:
    """A tiny model config (3 blocks, d_model 16) for fast tests."""
    return ModelConfig(scheme=scheme, options=options, **{**TINY, **size})


def build(cfg: ModelConfig, seed: int = 0, dtype=torch.float32) -> DepthModel:
    torch.manual_seed(seed)
    return DepthModel(cfg).to(dtype).eval()


def share_weights(src: DepthModel, dst: DepthModel) -> DepthModel:
    """Copy every tensor whose name and shape match (embedding, sublayers, unembedding)."""
    theirs = dst.state_dict()
    shared = {k: v for k, v in src.state_dict().items() if k in theirs and theirs[k].shape == v.shape}
    dst.load_state_dict(shared, strict=False)
    return dst


def assert_standard_at_init(model: DepthModel) -> None:
    """``model``, at its initialisation, computes exactly the standard model that holds its shared
    weights (embedding, sublayers, final norm, unembedding): the same logits bit for bit."""
    standard = build(tiny("standard", **{k: getattr(model.cfg, k) for k in TINY}))
    shared = {k: v for k, v in model.state_dict().items() if k in standard.state_dict()}
    assert len(shared) == len(standard.state_dict())
    standard.load_state_dict(shared)
    tokens = random_tokens(standard.cfg)
    torch.testing.assert_close(model(tokens), standard(tokens), rtol=0, atol=0)


def random_tokens(cfg: ModelConfig, batch: int = 2, pos: int | None = None, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, pos or cfg.ctx), generator=g)


def reconstruct(model: DepthModel, tokens: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """For every consumer: (hook_in, sum_s weights_s * v_s) from one run_with_cache."""
    _, cache = model.run_with_cache(tokens)
    srcs = torch.stack([cache[s.hook] for s in sources(model.cfg)], dim=-2)  # [batch, pos, source, d_model]
    out = {}
    for c in consumers(model.cfg):
        w = cache[c.hook_weights]
        if w.ndim == 5:  # block weights [batch, pos, frac, source, frac]: fraction by fraction
            m, n = w.shape[2], w.shape[3]
            v = srcs[..., :n, :].unflatten(-1, (m, -1))  # [batch, pos, source, frac, d/m]
            fracs = [sum(w[:, :, f, :, g, None] * v[:, :, :, g] for g in range(m)).sum(2) for f in range(m)]
            out[c.label] = (cache[c.hook_in], torch.cat(fracs, dim=-1))
            continue
        n = w.shape[2]
        w = w if w.ndim == 4 else w[..., None]
        out[c.label] = (cache[c.hook_in], (w * srcs[..., :n, :]).sum(-2))
    return out


def perturb(
    model: DepthModel, scale: float = 0.3, seed: int = 0, match: str = "_mix", others: float = 0.0
) -> DepthModel:
    """Add seeded Gaussian noise to every parameter whose name contains ``match`` (by default the
    depth mixers; ``others`` scales noise on the rest), moving a model off its initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            s = scale if match in name else others
            if s:
                p.add_(s * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def tiny_llama(seed: int = 0):
    """A one-layer random Llama of width 16 (vocabulary 256: read as bytes, context 256): the Hugging
    Face model the tests save as a directory, a hub snapshot or a custom-code model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config)


def load_bridge(directory):
    """A local Hugging Face model directory wrapped in a TransformerLens TransformerBridge, offline."""
    from pathlib import Path

    from transformer_lens import TransformerBridge

    from depthscope.probes.load import _offline

    path = Path(directory)
    _offline()
    return TransformerBridge.boot_transformers(str(path))
