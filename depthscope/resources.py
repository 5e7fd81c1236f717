"""What this process may use: memory available and cores, so that work is refused before it
allocates what a file or an option claims rather than failing halfway with a traceback.
"""

from __future__ import annotations

import os
import resource

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
