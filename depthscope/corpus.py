"""Byte-level text corpora: a file, a directory, or (by default) the Python standard library.

The default corpus is the standard library's own ``.py`` source, found through ``sysconfig`` (so it
exists on every machine with Python and needs no download), test suites excluded. A directory is
read recursively in sorted path order; files holding NUL bytes (binaries) are skipped. The
train/validation split is deterministic: the bytes are cut into 64 KiB chunks and every 10th chunk
goes to validation.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import torch
from torch import Tensor

from depthscope.errors import CorpusError

CHUNK = 1 << 16
VAL_EVERY = 10
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def default_files() -> list[Path]:
    """The standard library's .py files, test suites and installed packages excluded, sorted."""
    root = stdlib_root()
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if _SKIP_DIRS.intersection(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        out.append(p)
    return out


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise CorpusError(f"cannot read corpus file {path}: {err.strerror or err}") from None


@dataclass(frozen=True)
class Corpus:
    """A corpus as bytes, with a deterministic train/validation split."""

    name: str
    data: bytes

    @cached_property
    def train(self) -> Tensor:
        return _split(self.data, train=True)

    @cached_property
    def val(self) -> Tensor:
        return _split(self.data, train=False)

    def require(self, n: int, what: str = "one context window") -> None:
        """Raise CorpusError unless both splits hold at least ``n`` bytes."""
        for split, data in (("training", self.train), ("validation", self.val)):
            if len(data) < n:
                raise CorpusError(
                    f"corpus {self.name} is too short: its {split} split has {len(data)} bytes, "
                    f"{what} needs {n}"
                )


def _split(data: bytes, *, train: bool) -> Tensor:
    chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    if len(chunks) < 2:  # too small to split by chunks: last tenth is validation
        cut = len(data) - max(1, len(data) // VAL_EVERY) if len(data) > 1 else len(data)
        part = data[:cut] if train else data[cut:]
    else:
        part = b"".join(c for i, c in enumerate(chunks) if (i % VAL_EVERY == VAL_EVERY - 1) != train)
    return torch.frombuffer(bytearray(part), dtype=torch.uint8) if part else torch.zeros(0, dtype=torch.uint8)


@lru_cache(maxsize=1)
def _stdlib() -> Corpus:
    files = default_files()
    return Corpus(f"python-stdlib ({len(files)} files, {stdlib_root()})", b"".join(_read(p) for p in files))


def _load_path(path: Path) -> Corpus:
    if not path.exists():
        raise CorpusError(f"corpus {path} does not exist")
    if path.is_file():
        data = _read(path)
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.relative_to(path).parts))
        blobs = [b for b in (_read(p) for p in files) if b"\x00" not in b[:8192]]
        data = b"".join(blobs)
    else:
        raise CorpusError(f"corpus {path} is neither a file nor a directory")
    if not data:
        raise CorpusError(f"corpus {path} is empty (no readable text)")
    return Corpus(str(path), data)


def load_corpus(path: str | Path | None = None) -> Corpus:
    """Load a corpus from a file or directory; None means the Python standard library (cached)."""
    return _stdlib() if path is None else _load_path(Path(path))


def sample_batch(data: Tensor, batch: int, ctx: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random windows: inputs [batch, ctx] and next-byte targets [batch, ctx] (int64)."""
    starts = torch.randint(0, len(data) - ctx, (batch,), generator=generator)
    idx = starts[:, None] + torch.arange(ctx + 1)
    windows = data[idx].long()
    return windows[:, :-1], windows[:, 1:]


def eval_windows(data: Tensor, n_tokens: int, ctx: int, seed: int = 0) -> Tensor:
    """Deterministic windows [n, ctx] (n = ceil(n_tokens / ctx)) from ``data``, seeded offsets."""
    if len(data) < ctx:
        raise CorpusError(f"need at least {ctx} bytes for one window, have {len(data)}")
    n = -(-n_tokens // ctx)
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - ctx + 1, (n,), generator=g)
    return data[starts[:, None] + torch.arange(ctx)].long()
