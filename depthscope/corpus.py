"""Byte-level text corpora: a file, a directory, or (by default) the Python standard library.

The default corpus is the standard library's own ``.py`` source, found through ``sysconfig`` (so it
exists on every machine with Python and needs no download), test suites excluded. A directory is
read recursively in sorted path order; files holding NUL bytes (binaries) are skipped. The
train/validation split is deterministic: the bytes are cut into 64 KiB chunks and every 10th chunk
goes to validation.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from depthscope.errors import CorpusError, DepthscopeError
from depthscope.resources import require_memory

CHUNK = 1 << 16
VAL_EVERY = 10
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_root() -> Path:
    """The directory of the running Python's standard library."""
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
        """The training split as bytes (uint8): every chunk but each 10th (a corpus under two chunks: all
        but its last tenth).
        """
        return _split(self.data, train=True)

    @cached_property
    def val(self) -> Tensor:
        """The validation split as bytes (uint8): every 10th chunk (under two chunks: the last tenth)."""
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


def short_name(name: str) -> str:
    """A corpus name as a page shows it, free of the machine's paths: the standard library's root as
    its last part (``python-stdlib (734 files, python3.11)``), a file or directory by its name. The
    trace keeps the full name.
    """
    head, sep, rest = name.partition(" (")
    if head == "python-stdlib" and sep and rest.endswith(")"):
        count, _, root = rest[:-1].partition(", ")
        return f"{head} ({count}, {Path(root).name})" if root else name
    return Path(name).name or name


def _load_path(path: Path) -> Corpus:
    if not path.exists():
        raise CorpusError(f"corpus {path} does not exist")
    if path.is_file():
        data = _read(path)
    elif path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(s.startswith(".") for s in p.relative_to(path).parts)
        )
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


Encode = Callable[[str], list[int]]  # text -> token ids (a model's tokenizer, no special tokens)
# a tokenizer that gives one id this much of a corpus reads nothing of it: transformers builds such a
# tokenizer (every word [UNK]) from a model's config.json alone when no tokenizer files were saved
ONE_ID = 0.95
JUDGED = 64  # fewer ids than this are too few to judge a tokenizer by (a corpus of a few words)
INSTEAD = (
    "pass token ids (Python: capture(model, ids)) or a tokenizer that goes with the model "
    "(capture(..., tokenizer=...), or its files saved in the model directory)"
)


def token_windows(
    data: Any, ctx: int, n_tokens: int, seed: int = 0, *, encode: Encode | None = None, vocab: int = 256
) -> tuple[Tensor, str]:
    """Windows [n, ctx] to analyse, and a description of where they came from.

    ``data`` is a LongTensor of token ids ([n, pos] with pos <= ctx, or flat: cut into windows of
    ``ctx``), a Corpus, a path, or None (the default corpus). Corpus windows come from its
    validation split at offsets drawn with ``seed``: as bytes (a byte-level model, ``encode`` None;
    needs ``vocab`` >= 256), or as the token ids of ``encode`` over as much of the split as
    ``n_tokens`` needs (about four times the tokens asked for, so the seed has offsets to choose
    from; the whole split when it is shorter).
    """
    if isinstance(data, Tensor):
        tokens = given_windows(data, ctx, vocab)
        return tokens, f"{tokens.numel()} given tokens"
    if n_tokens < ctx:
        raise CorpusError(f"asked for {n_tokens} tokens, fewer than one context window ({ctx})")
    # int64 windows, and for a tokenizer about four times as many ids to draw them from
    require_memory(8 * n_tokens * (5 if encode is not None else 1), f"--tokens {n_tokens}", "; ask for fewer")
    corpus = data if isinstance(data, Corpus) else load_corpus(data)
    if encode is None:
        if vocab < 256:
            raise DepthscopeError(
                f"the model has no tokenizer and a vocabulary of {vocab} < 256 bytes: {INSTEAD}"
            )
        corpus.require(ctx, "one context window")
        return eval_windows(corpus.val, n_tokens, ctx, seed), corpus.name
    ids = encode_prefix(corpus, encode, want=4 * (-(-n_tokens // ctx)) * ctx)
    check_encoding(ids, corpus)
    if len(ids) < ctx:
        raise CorpusError(
            f"corpus {corpus.name} gives {len(ids)} tokens in its validation split, fewer than one window "
            f"of {ctx}"
        )
    return eval_windows(ids, n_tokens, ctx, seed), corpus.name


def given_windows(data: Tensor, ctx: int, vocab: int) -> Tensor:
    """Token ids given as a tensor, as windows [n, pos] (pos <= ``ctx``; a flat tensor cut into
    windows of ``ctx``), checked: integers, within the vocabulary.
    """
    if data.dtype not in (torch.int64, torch.int32, torch.uint8):
        raise DepthscopeError(f"token tensor must hold integers, got {data.dtype}")
    tokens = data.long()
    if tokens.ndim == 1:
        if len(tokens) < ctx:
            raise CorpusError(f"{len(tokens)} tokens are fewer than one context window ({ctx})")
        tokens = tokens[: len(tokens) // ctx * ctx].view(-1, ctx)
    if tokens.ndim != 2 or tokens.shape[1] > ctx:
        raise DepthscopeError(f"tokens must be [batch, pos] with pos <= {ctx}, got {tuple(tokens.shape)}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise DepthscopeError(
            f"token ids must lie in [0, {vocab}), got {int(tokens.min())}..{int(tokens.max())}"
        )
    return tokens


def encode_prefix(corpus: Corpus, encode: Encode, want: int) -> Tensor:
    """Token ids of the validation split, encoded chunk by chunk until ``want`` ids (or the end)."""
    val, parts, total = corpus.val, [], 0
    for start in range(0, len(val), CHUNK):
        text = bytes(val[start : start + CHUNK].tolist()).decode("utf-8", errors="replace")
        ids = encode(text)
        parts.append(torch.as_tensor(ids, dtype=torch.long).flatten())
        total += len(parts[-1])
        if total >= want:
            break
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def check_encoding(ids: Tensor, corpus: Corpus) -> None:
    """Refuse a tokenizer that reads a corpus as nothing: no ids from text, or (almost) one id for all
    of it (more than ``ONE_ID`` of at least ``JUDGED`` ids), the tokenizer's fault rather than the
    corpus's.
    """
    if not len(ids):
        if bytes(corpus.val[:CHUNK].tolist()).strip():
            raise DepthscopeError(
                f"the tokenizer gives no token ids for the text of corpus {corpus.name} (an empty "
                f"vocabulary: built without its files?): {INSTEAD}"
            )
        return
    if len(ids) < JUDGED:
        return
    values, counts = torch.unique(ids, return_counts=True)
    top = int(counts.argmax())
    share = float(counts[top]) / len(ids)
    if share > ONE_ID:
        raise DepthscopeError(
            f"the tokenizer maps corpus {corpus.name} to almost one token id ({int(values[top])} is "
            f"{share:.1%} of {len(ids)} tokens; a tokenizer built without its vocabulary does that): "
            f"{INSTEAD}"
        )
