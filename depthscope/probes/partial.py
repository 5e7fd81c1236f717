"""Partial captures: the float64 sums of the windows done so far, saved atomically and resumed.

A capture with ``save_every=N`` writes its state every N batches to a ``.partial`` file beside the
output (one per rank in a distributed capture); ``resume=True`` continues from it. The file is a
NumPy ``.npz`` (arrays only, read with ``allow_pickle=False``: data, never code) holding every
accumulator's state (``Accumulator.state``, ``Sums.state``) and a JSON record of what was done and
with what: a fingerprint of the model, of the windows (which covers the corpus, the seed, the window
length and the number of tokens) and of the settings. A partial state made with anything else is
refused, so a resumed trace is the trace of one run: equal to the uninterrupted capture's to
rounding (the same sums added in the same order, so in practice bit for bit).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from depthscope.atomic import atomic_path
from depthscope.errors import DepthscopeError

PARTIAL_FORMAT = 2  # 2: a digest of the arrays and the record, checked on load
SUFFIX = ".partial"


def partial_path(out: str | Path, rank: int = 0, world: int = 1) -> Path:
    """Where the partial state of a capture written to ``out`` goes (one file per rank)."""
    out = Path(out)
    return out.with_name(out.name + SUFFIX + (f".{rank}-of-{world}" if world > 1 else ""))


def model_fingerprint(model: Any, attrs: dict) -> str:
    """A digest of the model's description and of every parameter and buffer (name, shape, dtype,
    and float64 sums of the values and their squares: cheap, and any change of a weight shows).
    """
    h = hashlib.sha256(json.dumps(attrs, sort_keys=True, default=str).encode())
    tensors = dict(model.state_dict()) if hasattr(model, "state_dict") else {}
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, Tensor) or t.device.type == "meta":
            h.update(f"{name}:{type(t).__name__}".encode())
            continue
        x = t.detach().to(torch.float64)
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{float(x.sum())!r}:{float(x.pow(2).sum())!r}".encode())
    return h.hexdigest()


def windows_fingerprint(windows: Tensor, corpus: str) -> str:
    """A digest of the token windows and the corpus name."""
    h = hashlib.sha256(corpus.encode())
    h.update(windows.to(torch.int64).contiguous().numpy().tobytes())
    h.update(str(tuple(windows.shape)).encode())
    return h.hexdigest()


def digest(state: dict[str, np.ndarray], meta: dict) -> str:
    """A digest of every array (name, dtype, shape, bytes) and of the record that comes with them."""
    h = hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "digest"}, sort_keys=True).encode())
    for key in sorted(state):
        a = np.ascontiguousarray(state[key])
        h.update(f"{key}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save_partial(path: Path, state: dict[str, np.ndarray], meta: dict) -> None:
    """Write ``state`` and ``meta`` atomically: a kill during the write leaves the previous file."""
    arrays = {f"s/{k}": np.asarray(v) for k, v in state.items()}
    meta = {**meta, "partial_format": PARTIAL_FORMAT}
    arrays["meta"] = np.array(json.dumps({**meta, "digest": digest(arrays_of(arrays), meta)}))
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        np.savez(f, **arrays)


def arrays_of(saved: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The state arrays among a partial file's entries (``s/`` prefixed)."""
    return {k[2:]: np.asarray(v) for k, v in saved.items() if k.startswith("s/")}


def check_state(path: Path, state: dict[str, np.ndarray], template: dict[str, np.ndarray]) -> None:
    """Refuse a state whose arrays are not those of this capture (``template``: a fresh run's
    state): a key missing or extra, a shape of another layout, a NaN or inf in a sum.
    """
    fixed = {k: v for k, v in template.items() if ".native." not in k}
    missing = sorted(set(fixed) - set(state))
    extra = sorted(k for k in set(state) - set(fixed) if ".native." not in k)
    if missing or extra:
        which = f"lacks {missing[0]}" if missing else f"holds an unknown array {extra[0]}"
        raise DepthscopeError(f"{path}: this partial capture {which}; delete it")
    d = int(np.asarray(state["acc.d_model"]).reshape(-1)[0]) if "acc.d_model" in state else 0
    n_layers = np.asarray(template["acc.sums.hh"]).shape[0]
    for key, got in state.items():
        got = np.asarray(got)
        if key in fixed:
            want = np.asarray(fixed[key])
            shape = tuple(d if n == 0 and ".cov." in key else n for n in want.shape)
            ok = got.shape == shape and got.dtype.kind == want.dtype.kind
        else:  # a native quantity: one row per consumer
            shape = (n_layers, "...")
            ok = got.ndim >= 1 and got.shape[0] == n_layers and got.dtype.kind == "f"
        if not ok:
            raise DepthscopeError(
                f"{path}: {key} of this partial capture has shape {got.shape}, this capture's is {shape}; "
                "delete it"
            )
        if key in fixed and got.dtype.kind == "f" and not np.isfinite(got).all():
            raise DepthscopeError(f"{path}: {key} of this partial capture holds NaN or inf; delete it")


def load_partial(path: Path, fingerprint: dict) -> tuple[dict[str, np.ndarray], dict]:
    """The state and record saved at ``path``; DepthscopeError if unreadable or made with anything
    that differs from ``fingerprint`` (model, windows, settings).
    """
    try:
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            state = {k[2:]: f[k] for k in f.files if k.startswith("s/")}
    except Exception as err:  # zipfile, numpy and json raise many types for a damaged file
        raise DepthscopeError(
            f"{path}: not a readable partial capture ({type(err).__name__}); delete it"
        ) from None
    if not isinstance(meta, dict) or meta.get("partial_format") != PARTIAL_FORMAT:
        raise DepthscopeError(f"{path}: a partial capture of another format; delete it")
    if meta.get("digest") != digest(state, meta):
        raise DepthscopeError(f"{path}: this partial capture was changed after it was written; delete it")
    names = {
        "model": "another model",
        "windows": "another corpus, seed, window length or token count",
        "settings": "other settings",
    }
    for key, what in names.items():
        if meta.get(key) != fingerprint[key]:
            detail = ""
            if key == "settings" and isinstance(meta.get(key), dict):
                diff = [
                    f"{k} {meta[key].get(k)!r} (now {v!r})"
                    for k, v in fingerprint[key].items()
                    if meta[key].get(k) != v
                ]
                detail = f": {', '.join(diff)}"
            raise DepthscopeError(
                f"{path}: this partial capture was made with {what}{detail}; "
                "delete it or run the same command as before"
            )
    return state, meta
