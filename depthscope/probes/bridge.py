"""Standard models that are not ours: TransformerLens ``TransformerBridge`` (GPT-2/Llama style).

Sources map to ``hook_embed`` (+ ``hook_pos_embed`` when the model has learned positions) and
``blocks.{i}.hook_attn_out`` / ``hook_mlp_out``; consumers to ``blocks.{i}.hook_resid_pre``
(attention input), ``blocks.{i}.hook_resid_mid`` (MLP input) and the last ``hook_resid_post``
(read-out). Every weight is 1: a standard residual stream. Hook names are not trusted: the
residual identity (sources sum to each stream) is checked on the first batch, and a model that
fails it (a post-LN BERT, or an architecture whose ``*_out`` hooks hold residual-added states)
is refused with one clear line instead of being decomposed wrongly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from depthscope.corpus import Corpus, load_corpus
from depthscope.errors import CorpusError, DepthscopeError, TraceError
from depthscope.probes.trace import Accumulator, Layout

FLUSH = 4  # consumers folded together (as in capture.py)
from depthscope.progress import bar

TOLERANCE = 1e-4


def is_bridge(model: Any) -> bool:
    try:
        from transformer_lens import TransformerBridge
    except ImportError:  # pragma: no cover - transformer-lens is a dependency
        return False
    return isinstance(model, TransformerBridge)


def bridge_hooks(model: Any) -> tuple[Layout, list[str], list[str]]:
    """Layout, source hook names and consumer hook names of a bridge model."""
    n = model.cfg.n_layers
    available = set(model.hook_dict)
    src = [("embed", "hook_embed", 0, "embed")]
    if "hook_pos_embed" in available:
        src.append(("pos_embed", "hook_pos_embed", 0, "embed"))
    cons = []
    for i in range(n):
        cons.append((f"{i}.attn", f"blocks.{i}.hook_resid_pre", 2 * i + 1, "attn", len(src)))
        src.append((f"{i}.attn", f"blocks.{i}.hook_attn_out", 2 * i + 1, "attn"))
        cons.append((f"{i}.mlp", f"blocks.{i}.hook_resid_mid", 2 * i + 2, "mlp", len(src)))
        src.append((f"{i}.mlp", f"blocks.{i}.hook_mlp_out", 2 * i + 2, "mlp"))
    cons.append(("readout", f"blocks.{n - 1}.hook_resid_post", 2 * n + 1, "readout", len(src)))
    missing = [h for h in [s[1] for s in src] + [c[1] for c in cons] if h not in available]
    if missing:
        raise TraceError(f"model has no hook {missing[0]}: not a standard residual stream depthscope can decompose")
    lay = Layout(
        layer=[c[0] for c in cons],
        layer_depth=[c[2] for c in cons],
        layer_kind=[c[3] for c in cons],
        layer_sources=[c[4] for c in cons],
        source=[s[0] for s in src],
        source_depth=[s[2] for s in src],
        source_kind=[s[3] for s in src],
    )
    return lay, [s[1] for s in src], [c[1] for c in cons]


def bridge_tokens(model: Any, data: Any, n_tokens: int, seed: int) -> tuple[Tensor, str]:
    """Windows for a bridge: token ids as given, or the corpus encoded by the model's tokenizer
    (raw bytes if it has none and a vocabulary of at least 256)."""
    from depthscope.probes.capture import token_windows

    ctx = model.cfg.n_ctx
    tokenizer = getattr(model, "tokenizer", None)
    if isinstance(data, Tensor) or tokenizer is None:
        if not isinstance(data, Tensor) and model.cfg.d_vocab < 256:
            raise DepthscopeError(f"model has no tokenizer and a vocabulary of {model.cfg.d_vocab} < 256: pass token ids")
        return token_windows(data, ctx, n_tokens, seed)
    corpus = data if isinstance(data, Corpus) else load_corpus(data)
    text = bytes(corpus.val[: max(8 * n_tokens, 4096)].tolist()).decode("utf-8", errors="replace")
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long).flatten()
    if len(ids) < ctx:
        raise CorpusError(f"corpus {corpus.name} gives {len(ids)} tokens, fewer than one context window ({ctx})")
    n = max(1, min(-(-n_tokens // ctx), len(ids) // ctx))
    return ids[: n * ctx].view(n, ctx), corpus.name


def capture_bridge(
    model: Any, data: Any, *, n_tokens: int, batch_size: int, seed: int, progress: bool, checkpoint: str = "", rank: bool = False
):
    """Trace of a TransformerBridge model (all mixing weights 1), refusing non-additive models."""
    from depthscope import __version__

    lay, src_hooks, con_hooks = bridge_hooks(model)
    windows, corpus_name = bridge_tokens(model, data, n_tokens, seed)
    acc = Accumulator(lay, covariance=rank)
    state: dict[str, Any] = {}

    def on_source(j: int):
        def hook(t: Tensor, hook) -> None:
            if state.pop("fresh", False):  # first source of a batch, whichever hook fires first
                shape = (*t.shape[:-1], len(src_hooks), t.shape[-1])
                if state.get("values") is None or state["values"].shape != shape:
                    state["values"], state["norms"] = t.new_empty(shape), t.new_empty(shape[:-1])
            state["values"][:, :, j] = t
            state["norms"][:, :, j] = acc.source(j, t)

        return hook

    def on_consumer(i: int):
        def hook(t: Tensor, hook) -> None:
            state["deferred"].append((i, t, t.new_ones(*t.shape[:-1], lay.layer_sources[i])))
            if len(state["deferred"]) >= FLUSH:
                acc.consumers(state["deferred"], state["values"], state["norms"])
                state["deferred"] = []

        return hook

    fwd = [(h, on_source(j)) for j, h in enumerate(src_hooks)] + [(h, on_consumer(i)) for i, h in enumerate(con_hooks)]
    with torch.no_grad(), model.hooks(fwd_hooks=fwd), bar("capture", len(windows), enabled=progress) as pb:
        for b, chunk in enumerate(windows.split(batch_size)):
            state["fresh"], state["deferred"] = True, []
            model(chunk)
            acc.consumers(state["deferred"], state["values"], state["norms"])
            acc.add_tokens(chunk.numel())
            pb.advance(len(chunk))
            if b == 0:
                _check_identity(acc, lay)
    attrs = {
        "scheme": "standard",
        "label": f"bridge:{getattr(model.cfg, 'model_name', None) or type(model).__name__}",
        "config": _bridge_config(model),
        "checkpoint": str(checkpoint),
        "corpus": corpus_name,
        "seed": seed,
        "depthscope_version": __version__,
    }
    return acc.dataset(attrs)


def _check_identity(acc: Accumulator, lay: Layout) -> None:
    s = acc.sums
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.sqrt(s["err"] / s["in_sq"])
    worst = int(np.nanargmax(err)) if np.isfinite(err).any() else 0
    if not np.all(err <= TOLERANCE):
        raise TraceError(
            f"model is not additive: its residual stream at {lay.layer[worst]} is not embedding + earlier "
            f"attn/mlp outputs (relative error {err[worst]:.3g}); post-LN models and hooks that hold "
            "residual-added states cannot be decomposed"
        )


def _bridge_config(model: Any) -> str:
    import json

    keep = ("model_name", "n_layers", "d_model", "n_heads", "d_mlp", "n_ctx", "d_vocab", "normalization_type", "positional_embedding_type")
    return json.dumps({k: getattr(model.cfg, k, None) for k in keep}, default=str, sort_keys=True)


def load_bridge(directory: str) -> Any:
    """Wrap a local Hugging Face model directory in a TransformerBridge, offline."""
    import os
    from pathlib import Path

    path = Path(directory)
    if not (path / "config.json").is_file():
        raise DepthscopeError(f"{path}: not a Hugging Face model directory (no config.json)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformer_lens import TransformerBridge

    try:
        return TransformerBridge.boot_transformers(str(path))
    except Exception as err:  # transformers raises many types for unsupported or broken models
        raise DepthscopeError(f"{path}: cannot load as a TransformerBridge ({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None


def load_model(path: str) -> Any:
    """A depthscope checkpoint (.safetensors file) or a local Hugging Face model directory."""
    from pathlib import Path

    from depthscope.schemes.checkpoint import load

    return load_bridge(path) if Path(path).is_dir() else load(path)
