"""What this process may use: memory available and cores, so that work is refused before it
allocates what a file or an option claims rather than failing halfway with a traceback; and how its
heap behaves during a capture (``steady_heap``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
from collections.abc import Callable, Iterator

from depthscope.errors import DepthscopeError

GB = 2**30


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_available() -> int:
    """Bytes this process can still allocate: the system's available memory, and under an address
    space limit (``ulimit -v``, RLIMIT_AS) what is left of it; a large number where neither is known.
    """
    limits = [v for v in (_meminfo("MemAvailable"),) if v is not None]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(max(0, soft - _vm_size()))
    return min(limits) if limits else 2**62


def require_memory(need: int, what: str, hint: str = "") -> None:
    """DepthscopeError, before allocating, if ``need`` bytes for ``what`` exceed what is available."""
    have = memory_available()
    if need > have:
        raise DepthscopeError(
            f"{what} needs {need / GB:.1f} GB of memory and {have / GB:.1f} GB are available{hint}"
        )


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# glibc's mallopt parameters and the values of its own adaptive rule at its limit: a freed block of
# up to 32 MiB raises the mmap threshold to its size (32 MiB at most) and the trim threshold to
# twice that
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
KEEP = 2**31 - 1  # mallopt takes a C int: the largest trim threshold, "never trim"
ALLOCATOR_SETTINGS = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)


def _mallopt() -> Callable[[int, int], int] | None:
    """The C library's ``mallopt``, where glibc is this process's allocator and its user has not tuned it
    (``MALLOC_*_`` or ``GLIBC_TUNABLES`` settings, an allocator preloaded): else None.
    """
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return None
        fn = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, ValueError):
        return None
    env = os.environ
    if any(k in env for k in ALLOCATOR_SETTINGS) or "malloc" in env.get("GLIBC_TUNABLES", ""):
        return None
    if any(a in env.get("LD_PRELOAD", "") for a in ("jemalloc", "tcmalloc", "mimalloc")):
        return None
    fn.argtypes, fn.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return fn


@contextlib.contextmanager
def steady_heap() -> Iterator[None]:
    """The heap kept while a capture runs, not given back to the system after each batch.

    glibc returns the free top of its heap to the system whenever it exceeds the trim threshold
    (16 MiB once 8 MiB blocks have been freed), so a batch's temporaries, the model's own among them,
    land on fresh pages in the next batch, each page zeroed and faulted in again. Inside the block
    nothing is trimmed; on leaving it the thresholds are the values glibc's own adaptive rule
    reaches (32 MiB for mmap, 64 MiB for trimming), so glibc trims afterwards as it would have.
    Nothing changes where glibc is not the allocator or its user tuned it (docs/design.md, "The heap
    during a capture").
    """
    mallopt = _mallopt()
    if mallopt is None:
        yield
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, KEEP)
    try:
        yield
    finally:
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
