"""Atomic output: write to a temporary name beside the target, rename on success."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from depthscope.errors import DepthscopeError


def _disk_full(directory: Path) -> bool:
    """Whether the file system of ``directory`` has (almost) no room left: what a failed write that
    does not say why usually means.
    """
    try:
        return shutil.disk_usage(directory).free < 1 << 20
    except OSError:
        return False


def check_output(path: Path, *inputs: str | Path) -> None:
    """Refuse an output path that cannot be replaced by a file safely: no name, a directory, an
    existing non-regular file (a FIFO, a device: ``--out /dev/null`` must not replace /dev/null),
    a name too long for the file system, or one of ``inputs`` itself (same file).
    """
    if not path.name:
        raise DepthscopeError(f"cannot write {path}: no file name")
    if len(os.fsencode(path.name)) + len(".part") + 16 > 255:  # the temporary name must fit too
        raise DepthscopeError(
            f"cannot write {str(path)[:80]}...: the file name is too long (255 bytes at most)"
        )
    try:
        st = path.stat() if path.exists() or path.is_symlink() else None
    except OSError as err:
        raise DepthscopeError(f"cannot write {path}: {err.strerror or err}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise DepthscopeError(f"cannot write {path}: is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise DepthscopeError(f"cannot write {path}: it exists and is not a regular file")
    for source in inputs:
        try:
            same = st is not None and Path(source).exists() and os.path.samefile(path, source)
        except OSError:
            same = False
        if same:
            raise DepthscopeError(f"cannot write {path}: it is the input; name another output file")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path; rename it onto ``path`` if the block succeeds, else delete it.

    An interrupted or failed write never leaves a half-written file under the final name.
    """
    path = Path(path)
    check_output(path)
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
        full = not isinstance(err, (KeyboardInterrupt, DepthscopeError)) and _disk_full(parent)
        tmp_path.unlink(missing_ok=True)
        if full:  # netCDF and safetensors report a full disk as their own errors, not as OSError
            raise DepthscopeError(f"no space left on device writing {path}") from None
        if isinstance(err, OSError):  # lost permission, a directory made meanwhile ...
            raise DepthscopeError(f"cannot write {path}: {err.strerror or err}") from None
        raise
