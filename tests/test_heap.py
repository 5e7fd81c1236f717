"""The heap during a capture (``resources.steady_heap``): glibc keeps what a batch frees instead of
trimming it, and gives the process back glibc's own limits afterwards.

The checks read glibc (the C library of the machines the tests run on; elsewhere steady_heap does
nothing). Each runs in a fresh interpreter (a known heap) and reads glibc's ``mallinfo2``: ``fordblks`` is
the free memory the heap holds. 200 MiB of 8 MiB tensors are allocated and freed: a heap that gives
them back holds at most its trim threshold (64 MiB, glibc's adaptive limit) and a block; a steady
one holds what was freed. What glibc can give back once the block is left depends on where the
system placed the heap (a heap that is not contiguous is not trimmed), so the thresholds set on
leaving are checked on the calls themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from depthscope import resources

ROOT = Path(__file__).resolve().parent.parent
BLOCK, FREED, TRIMMED = 8, 200, 64 + 8  # MiB: one tensor, all of them, the most a trimming heap keeps

PROGRAM = """
import ctypes, json, sys, torch
from depthscope.resources import steady_heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info

def kept():  # MiB of free heap top after freeing FREED MiB of BLOCK MiB tensors
    ts = [torch.empty(BLOCK * 2**18) for _ in range(FREED // BLOCK)]
    del ts
    return libc.mallinfo2().fordblks / 2**20

out = {"before": kept()}
if sys.argv[1] == "capture":  # the same, from inside a capture's forward
    from depthscope.probes import capture
    from tests.helpers import build, tiny

    model = build(tiny("standard"))
    seen = []
    model.ln_final.register_forward_hook(lambda *_: seen.append(kept()))
    capture(model, n_tokens=64, ctx=32, progress=False)
    out["during"] = seen[-1]  # the last batch's forward (a probe forward may come before the batches)
else:
    with steady_heap():
        out["during"] = kept()
print(json.dumps(out))
"""


def heap(mode: str, **env: str) -> dict[str, float]:
    code = f"BLOCK, FREED = {BLOCK}, {FREED}\n" + PROGRAM
    res = subprocess.run(
        [sys.executable, "-c", code, mode],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["steady", "capture"])
def test_the_heap_is_kept_during_a_capture(mode):
    got = heap(mode)
    assert got["before"] <= TRIMMED, got  # glibc's own rule gives what is freed back
    assert got["during"] >= FREED / 2, got  # kept: the next batch reuses those pages


def test_a_tuned_allocator_is_left_as_its_user_set_it(monkeypatch):
    got = heap("steady", MALLOC_TRIM_THRESHOLD_=str(2**20))
    assert max(got.values()) <= TRIMMED, got
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576")
    assert resources._mallopt() is None


def test_leaving_sets_glibcs_own_limits_even_on_an_error(monkeypatch):
    calls = []
    monkeypatch.setattr(resources, "_mallopt", lambda: lambda param, value: calls.append((param, value)))
    with pytest.raises(KeyboardInterrupt), resources.steady_heap():
        assert calls == [(resources.M_MMAP_THRESHOLD, 32 * 2**20), (resources.M_TRIM_THRESHOLD, 2**31 - 1)]
        raise KeyboardInterrupt
    assert calls[2:] == [(resources.M_TRIM_THRESHOLD, 64 * 2**20)]
