"""Atomic output: write to a temporary name beside the target, rename on success."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from depthscope import interrupt
from depthscope.errors import DepthscopeError

TEMPORARY_EXTRA = 32  # what a temporary name adds to a file name: ".", ".PID.RANDOM.part"


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
    if len(os.fsencode(path.name)) + TEMPORARY_EXTRA > 255:  # the temporary name must fit too
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


# Temporary names made and not yet renamed or removed, registered before they exist: an interrupt
# landing anywhere (even between a file's creation and the line that keeps its name) leaves a name
# that ``remove_pending`` (called by the entry point on every exit) can delete.
_PENDING: set[Path] = set()


def _temporary_name(path: Path) -> Path:
    """A fresh hidden name beside ``path``: ``.NAME.PID.RANDOM.part``."""
    return path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.part"


def temporary_dir(path: Path) -> Path:
    """Make and register a hidden temporary directory beside ``path`` (to be renamed onto it or
    removed by the caller; ``remove_pending`` removes it otherwise).
    """
    tmp = _temporary_name(path)
    _PENDING.add(tmp)
    tmp.mkdir(mode=0o700)
    return tmp


def settle(tmp: Path) -> None:
    """``tmp`` was renamed into place or removed by its owner: nothing left to clean."""
    _PENDING.discard(tmp)


def remove_pending() -> None:
    """Delete every registered temporary file or directory that is still there."""
    for tmp in list(_PENDING):
        with contextlib.suppress(OSError):
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
        _PENDING.discard(tmp)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path; rename it onto ``path`` if the block succeeds, else delete it.

    An interrupted or failed write never leaves a half-written file under the final name, and once
    a Ctrl-C was received (even one a library swallowed) nothing more is renamed into place.
    """
    path = Path(path)
    check_output(path)
    parent = path.parent if str(path.parent) else Path(".")
    tmp_path = _temporary_name(parent / path.name)
    _PENDING.add(tmp_path)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as err:
        _PENDING.discard(tmp_path)
        raise DepthscopeError(f"cannot write {path}: {err.strerror or err}") from None
    try:
        yield tmp_path
        if interrupt.hit():
            raise KeyboardInterrupt
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # made 0600; a finished file gets normal permissions
        os.replace(tmp_path, path)
    except BaseException as err:
        full = not isinstance(err, (KeyboardInterrupt, DepthscopeError)) and _disk_full(parent)
        tmp_path.unlink(missing_ok=True)
        if full:  # netCDF and safetensors report a full disk as their own errors, not as OSError
            raise DepthscopeError(f"no space left on device writing {path}") from None
        if isinstance(err, OSError):  # lost permission, a directory made meanwhile ...
            raise DepthscopeError(f"cannot write {path}: {err.strerror or err}") from None
        raise
    finally:
        _PENDING.discard(tmp_path)
