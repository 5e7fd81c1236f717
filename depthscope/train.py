"""Byte-level language-model training: AdamW, linear warm-up, cosine decay, seeded and repeatable.

The same seed gives bit-identical weights on CPU (same torch build and thread count): the model is
initialised from ``torch.manual_seed(seed)`` and batches come from a generator seeded with it.

Weight decay (``decayed_parameters``) applies to the matrices of the embedding, sublayers and
unembedding, and to the dynamic projections each scheme names in its modules' ``decayed``
(HC's W_m, W_r, W_b as its paper says; mHC's phi, DCA's gate w, DDL's gate w, ShortSWA's W_Q and
W_K by the same rule). Static depth-mixing parameters (DenseFormer's alpha, DCA's b, AttnRes'
queries, HC's A_m, A_r, B, scales and biases) and gains are not decayed: their initialisation
(ones, identities, uniform softmaxes) is meaningful.

Validation along training: with ``eval_every = k`` the validation loss is measured after every
k-th optimiser step (and at the end) on the same deterministic windows as the final loss, and
recorded as ``val_curve`` ([[step, loss], ...]) in the summary, so that the steps a run needs to
reach a given loss are read off the record, not guessed. The evaluations use their own windows and
no random numbers of the run, so the weights are the same with or without them; their time is not
counted in the run's throughput (``tokens_per_s``, ``step_seconds``: training steps only).

Snapshots: ``train(..., snapshots=[250, 500], on_snapshot=fn)`` calls ``fn(model, step)`` after
those optimiser steps, with ``model.training_summary`` describing the run so far (``step``,
``train_tokens``, ``val_loss`` at that step), so intermediate checkpoints carry their place in
the run. Evaluating a snapshot uses its own generator: the run's weights are the same with or
without snapshots.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from depthscope.corpus import Corpus, eval_windows, sample_batch
from depthscope.errors import ConfigError
from depthscope.progress import bar
from depthscope.schemes import DepthModel, ModelConfig
from depthscope.schemes.base import MixerBase, Port

MAX_LR = 1e3  # far above any useful AdamW step; larger ones overflow float32 in the update itself


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
    eval_every: int = 0  # validation loss every this many steps (0: only at the end)

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ConfigError(f"steps must be >= 0, got {self.steps}")
        if self.batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.batch_size}")
        if self.eval_every < 0:
            raise ConfigError(f"eval_every must be >= 0 (0: at the end only), got {self.eval_every}")
        if not 0 < self.lr <= MAX_LR:
            raise ConfigError(f"learning rate must be positive and at most {MAX_LR:g}, got {self.lr:g}")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr`` then cosine decay to 10% of it."""
    warm = max(1, int(cfg.warmup * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    t = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def decayed_parameters(model: nn.Module) -> set[str]:
    """Names of the parameters that get weight decay (see the module docstring)."""
    out = set()
    for prefix, module in model.named_modules():
        declared = getattr(module, "decayed", ())
        mixing = isinstance(module, (MixerBase, Port)) or "_mix." in f"{prefix}."
        for local, p in module.named_parameters(recurse=False):
            if local in declared or (p.ndim >= 2 and not mixing):
                out.add(f"{prefix}.{local}" if prefix else local)
    return out


def _param_groups(model: DepthModel, weight_decay: float) -> list[dict]:
    decayed = decayed_parameters(model)
    decay, keep = [], []
    for name, p in model.named_parameters():
        (decay if name in decayed else keep).append(p)
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
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    corpus: Corpus,
    *,
    progress: bool = True,
    label: str | None = None,
    snapshots: Collection[int] = (),
    on_snapshot: Callable[[DepthModel, int], None] | None = None,
) -> DepthModel:
    """Train a fresh model; its ``training_summary`` records settings, losses and throughput.

    ``on_snapshot(model, step)`` is called after each step count in ``snapshots`` (0 < step <
    ``cfg.steps``; the final model is the caller's), with the summary of the run so far.
    """
    corpus.require(model_cfg.ctx + 1)
    bad = [s for s in snapshots if not 0 < s < cfg.steps]
    if bad:
        raise ConfigError(f"snapshot steps must lie strictly between 0 and {cfg.steps}, got {bad[0]}")
    torch.manual_seed(cfg.seed)
    model = DepthModel(model_cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95))
    model.train()
    losses: list[float] = []
    curve: list[list[float]] = []  # [step, validation loss] every cfg.eval_every steps
    start = time.perf_counter()
    paused = 0.0  # seconds spent evaluating and snapshotting, not training
    tokens = 0
    info = "loss {task.fields[loss]:.3f}  {task.fields[tps]:.0f} tok/s"
    with bar(
        label or f"train {model_cfg.scheme}",
        cfg.steps,
        enabled=progress,
        info=info,
        loss=float("nan"),
        tps=0.0,
    ) as pb:
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
            if not math.isfinite(losses[-1]):  # nothing trained from here on would mean anything
                raise ConfigError(f"training diverged at step {step}: the loss is {losses[-1]}; lower --lr")
            tokens += x.numel()
            pb.advance(1, loss=losses[-1], tps=tokens / (time.perf_counter() - start - paused))
            t0 = time.perf_counter()
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                curve.append([step + 1, evaluate(model, corpus, cfg.eval_tokens)])
            if step + 1 in snapshots and on_snapshot is not None:
                model.training_summary = _summary(
                    model, cfg, corpus, losses, tokens, time.perf_counter() - start - paused, curve
                )
                on_snapshot(model, step + 1)
                model.train()
            paused += time.perf_counter() - t0
    model.training_summary = _summary(
        model, cfg, corpus, losses, tokens, time.perf_counter() - start - paused, curve
    )
    model.eval()
    return model


def _summary(
    model: DepthModel,
    cfg: TrainConfig,
    corpus: Corpus,
    losses: list[float],
    tokens: int,
    wall: float,
    curve: list[list[float]] = (),
) -> dict:
    """The training summary after ``len(losses)`` steps (the checkpoint metadata's ``training``)."""
    tail = losses[-10:]
    val = evaluate(model, corpus, cfg.eval_tokens)
    out = {
        **asdict(cfg),
        "step": len(losses),
        "corpus": corpus.name,
        "final_loss": sum(tail) / len(tail) if tail else None,
        "val_loss": val,
        "tokens_per_s": tokens / wall if tokens else None,
        "step_seconds": wall / len(losses) if losses else None,
        "train_tokens": tokens,
    }
    if cfg.eval_every:
        out["val_curve"] = [*[list(p) for p in curve if p[0] < len(losses)], [len(losses), val]]
    return out
