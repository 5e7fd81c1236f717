"""Atomic output: write to a temporary name beside the target, rename on success."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from depthscope.errors import DepthscopeError


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path; rename it onto ``path`` if the block succeeds, else delete it.

    An interrupted or failed write never leaves a half-written file under the final name.
    """
    path = Path(path)
    if not path.name or path.is_dir():
        raise DepthscopeError(f"cannot write {path}: {'is a directory' if path.is_dir() else 'no file name'}")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=parent)
    except OSError as err:
        raise DepthscopeError(f"cannot write {path}: {err.strerror or err}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; a finished file gets normal permissions
        os.replace(tmp_path, path)
    except BaseException as err:
        tmp_path.unlink(missing_ok=True)
        if isinstance(err, OSError):  # full disk, lost permission, a directory made meanwhile ...
            raise DepthscopeError(f"cannot write {path}: {err.strerror or err}") from None
        raise
