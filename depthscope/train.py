"""Byte-level language-model training: AdamW, linear warm-up, cosine decay, seeded and repeatable.

The same seed gives bit-identical weights on CPU (same torch build and thread count): the model is
initialised from ``torch.manual_seed(seed)`` and batches come from a generator seeded with it.
Weight decay applies to the matrices of the embedding, sublayers and unembedding; depth-mixing
parameters (``*_mix.*``) and gains are not decayed, so their initialisation (ones, identities)
is not pulled towards zero.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from depthscope.corpus import Corpus, eval_windows, sample_batch
from depthscope.errors import ConfigError
from depthscope.progress import bar
from depthscope.schemes import DepthModel, ModelConfig


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings."""

    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    warmup: float = 0.05  # fraction of steps spent in linear warm-up
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_tokens: int = 16384  # validation tokens for the final loss

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ConfigError(f"steps must be >= 0, got {self.steps}")
        if self.batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ConfigError(f"learning rate must be positive, got {self.lr}")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr`` then cosine decay to 10% of it."""
    warm = max(1, int(cfg.warmup * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    t = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def _param_groups(model: DepthModel, weight_decay: float) -> list[dict]:
    decay, keep = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "_mix." not in name else keep).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model: DepthModel, corpus: Corpus, n_tokens: int = 16384, batch_size: int = 16) -> float:
    """Mean next-byte cross-entropy (nats) on deterministic validation windows."""
    ctx = model.cfg.ctx
    windows = eval_windows(corpus.val, n_tokens, ctx + 1, seed=1234)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for chunk in windows.split(batch_size):
        logits = model(chunk[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
        count += chunk[:, 1:].numel()
    model.train(was_training)
    return total / count


def train(
    model_cfg: ModelConfig, cfg: TrainConfig, corpus: Corpus, *, progress: bool = True, label: str | None = None
) -> DepthModel:
    """Train a fresh model; its ``training_summary`` records settings, losses and throughput."""
    corpus.require(model_cfg.ctx + 1)
    torch.manual_seed(cfg.seed)
    model = DepthModel(model_cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95))
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    tokens = 0
    info = "loss {task.fields[loss]:.3f}  {task.fields[tps]:.0f} tok/s"
    with bar(label or f"train {model_cfg.scheme}", cfg.steps, enabled=progress, info=info, loss=float("nan"), tps=0.0) as pb:
        for step in range(cfg.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            x, y = sample_batch(corpus.train, cfg.batch_size, model_cfg.ctx, gen)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            losses.append(loss.item())
            tokens += x.numel()
            pb.advance(1, loss=losses[-1], tps=tokens / (time.perf_counter() - start))
    wall = time.perf_counter() - start
    model.eval()
    tail = losses[-10:]
    model.training_summary = {
        **asdict(cfg),
        "corpus": corpus.name,
        "final_loss": sum(tail) / len(tail) if tail else None,
        "val_loss": evaluate(model, corpus, cfg.eval_tokens),
        "tokens_per_s": tokens / wall if cfg.steps else None,
        "train_tokens": tokens,
    }
    return model
