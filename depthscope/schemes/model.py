"""The one model family: a byte-level decoder-only pre-norm transformer with a pluggable scheme.

Tokens are bytes (vocabulary 256). Positions are rotary (inside attention), so the embedding
source is the token embedding alone. Every sublayer computes f(RMSNorm(input)); where its input
comes from, and where its output goes, is the scheme's business (``schemes/base.py``).

Legend: batch, pos, d_model, vocab.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from depthscope.errors import CheckpointError, DepthscopeError
from depthscope.schemes import checkpoint
from depthscope.schemes._common import RMSNorm, init_sublayer, listening
from depthscope.schemes.base import VOCAB, ModelConfig, Site, get_scheme, readout_site


class Block(nn.Module):
    """One transformer block: for each sublayer kind, mixer -> sublayer -> output hook -> write."""

    def __init__(self, cfg: ModelConfig, block: int):
        super().__init__()
        scheme = get_scheme(cfg.scheme)
        self.kinds = cfg.kinds
        for j, kind in enumerate(self.kinds):
            site = Site(block, kind, block * len(self.kinds) + j)
            # registration order = execution order, so hook_dict lists hooks as they fire
            self.add_module(f"{kind}_mix", scheme.mixer(cfg, site))
            self.add_module(kind, scheme.sublayer(cfg, site))
            self.add_module(f"hook_{kind}_out", HookPoint())  # [batch, pos, d_model]

    def forward(self, state: Any) -> Any:
        """Each sublayer kind in turn: its mixer reads the state, the sublayer runs, the mixer writes back."""
        for kind in self.kinds:
            mixer = getattr(self, f"{kind}_mix")
            inp, state = mixer.read(state)
            out = getattr(self, f"hook_{kind}_out")(getattr(self, kind)(inp))
            state = mixer.write(state, out)
        return state


class DepthModel(HookedRootModule):
    """Byte-level transformer whose every sublayer input is produced by the scheme's mixer.

    Call it on a LongTensor of bytes [batch, pos] to get logits [batch, pos, 256].
    ``run_with_cache`` and ``hooks`` come from TransformerLens's HookedRootModule.
    """

    def __init__(self, cfg: ModelConfig, training: dict[str, Any] | None = None):
        super().__init__()
        self.cfg = cfg
        self.training_summary: dict[str, Any] = dict(training or {})
        self.embed = nn.Embedding(VOCAB, cfg.d_model)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.readout_mix = get_scheme(cfg.scheme).mixer(cfg, readout_site(cfg))
        self.ln_final = RMSNorm(cfg.d_model)
        self.unembed = nn.Linear(cfg.d_model, VOCAB, bias=False)
        self._init_weights()
        self.setup()
        self._weight_hooks = [h for n, h in self.hook_dict.items() if n.endswith("hook_weights")]

    @property
    def scheme(self):
        """The scheme class of the model's config."""
        return get_scheme(self.cfg.scheme)

    def _init_weights(self) -> None:
        # Only embedding, sublayers and unembedding: each mixer owns its initialisation (a global
        # re-init would break the schemes that start out equal to the standard residual).
        nn.init.normal_(self.embed.weight, 0.0, 0.02)
        nn.init.normal_(self.unembed.weight, 0.0, 0.02)
        for block in self.blocks:
            for kind in block.kinds:
                init_sublayer(getattr(block, kind), self.cfg.n_sublayers)

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits [batch, pos, 256] of bytes [batch, pos]: the scheme's depth state from the embedding through
        every block, then the read-out mix, the final norm and the unembedding.

        Delta-basis bookkeeping is switched on only when a ``hook_weights`` has a listener.
        """
        if tokens.dtype != torch.long or tokens.ndim != 2:
            raise ValueError(f"expected LongTensor [batch, pos], got {tokens.dtype} {tuple(tokens.shape)}")
        if tokens.shape[1] > self.cfg.ctx:
            raise ValueError(f"sequence of {tokens.shape[1]} exceeds the context of {self.cfg.ctx}")
        x0 = self.hook_embed(self.embed(tokens))
        track = any(listening(h) for h in self._weight_hooks)
        state = self.scheme.start(self.cfg, x0, track)
        for block in self.blocks:
            state = block(state)
        h, _ = self.readout_mix.read(state)
        return self.unembed(self.ln_final(h))

    def n_params(self) -> int:
        """Number of parameters, the mixers' included."""
        return sum(p.numel() for p in self.parameters())

    def save(self, path: str | Path, *, dtype: torch.dtype | None = None) -> Path:
        """Write a .safetensors checkpoint with the config in its metadata (atomic)."""
        meta = {"model": self.cfg.to_dict(), "training": self.training_summary}
        return checkpoint.write(path, self.state_dict(), meta, dtype=dtype)


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of floating-point tensors


def _check_tensors(path: Path, cfg: ModelConfig, header: dict) -> None:
    """The file holds exactly the tensors the config's model has, with their shapes, as floating-point
    numbers; checked on a model built on the meta device (no memory), so that a small file whose
    config claims a huge model is refused before that model is allocated.
    """
    try:
        with torch.device("meta"):
            expected = DepthModel(cfg).state_dict()
    except (RuntimeError, MemoryError, ValueError) as err:
        raise CheckpointError(
            f"{path}: cannot build the model of its config ({type(err).__name__})"
        ) from None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(
            f"{path}: missing tensors: {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{path}: unexpected tensors: {', '.join(extra[:5])}")
    for key, ref in expected.items():
        entry = tensors[key]
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or tuple(shape) != tuple(ref.shape):
            got = tuple(shape) if isinstance(shape, list) else shape
            raise CheckpointError(f"{path}: tensor {key} has shape {got!r:.60}, expected {tuple(ref.shape)}")
        if ref.is_floating_point() and entry.get("dtype") not in FLOAT_DTYPES:
            kind = str(entry.get("dtype"))[:10]
            raise CheckpointError(f"{path}: tensor {key} holds {kind} values, not floating-point weights")


def load_checkpoint(path: str | Path) -> DepthModel:
    """Load a depthscope checkpoint; returns the model in eval mode (float32).

    Raises CheckpointError naming the file and the problem for a missing file, a file that is
    not safetensors or is truncated, missing/invalid config, an unknown scheme, missing or
    misshapen tensors, and NaN or Inf weights.
    """
    path = Path(path)
    meta = checkpoint.read_meta(path)
    try:
        cfg = ModelConfig.from_dict(meta["model"])
    except DepthscopeError as err:
        raise CheckpointError(f"{path}: {err}") from None
    except TypeError as err:
        raise CheckpointError(f"{path}: invalid model config ({err})") from None
    _check_tensors(path, cfg, checkpoint.read_header(path))  # before anything the config claims is allocated
    try:
        tensors = load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for corrupt data
        raise CheckpointError(f"{path}: unreadable tensors ({err})") from None
    try:
        model = DepthModel(cfg, training=meta.get("training"))
    except (RuntimeError, MemoryError) as err:  # a config far too large to build (e.g. ctx 10**12)
        raise CheckpointError(
            f"{path}: cannot build the model of its config ({type(err).__name__})"
        ) from None
    for key, ref in model.state_dict().items():
        t = tensors[key].to(ref.dtype)  # finiteness after the cast: 3e38 in float64 is inf in float32
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{path}: tensor {key} holds NaN or Inf values (as {str(ref.dtype)[6:]})")
        tensors[key] = t
    model.load_state_dict(tensors)
    return model.eval()
