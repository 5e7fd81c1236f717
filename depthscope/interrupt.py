"""Ctrl-C for the ``depthscope`` command: exit 130 and one line ``interrupted`` at every moment.

The promise holds from start-up (imports of torch and transformers take seconds) to shutdown, so
the handler is installed by the entry point before anything heavy is imported (``install``), and:

* the first SIGINT raises ``KeyboardInterrupt`` only while a command runs (``armed``); before that
  it is recorded and the command is not started, after it the exit status becomes 130;
* every later SIGINT is recorded and ignored, so the clean-up of the first (temporary files
  removed, partial sums kept, worker processes stopped) runs to its end undisturbed;
* a finished command leaves with SIGINT ignored: the interpreter's shutdown resets a Python
  handler to the default action, and a Ctrl-C there would turn exit 130 into a death by SIGINT;
* an interrupt that some library swallowed still ends in exit 130: ``atomic_path`` refuses to
  rename an output into place once one was recorded, and ``finish`` reports it.

A process started with SIGINT ignored (a job started in the background by a non-interactive
shell) keeps it ignored, as Python itself does.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

_STATE = {"installed": False, "armed": False, "hit": False, "said": False}


def _on_sigint(signum, frame) -> None:
    if _STATE["hit"]:
        return  # one interrupt is enough; a second must not break the clean-up of the first
    _STATE["hit"] = True
    if _STATE["armed"]:
        raise KeyboardInterrupt


def install() -> None:
    """Take over SIGINT for this process (unless it was started with SIGINT ignored)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return
    signal.signal(signal.SIGINT, _on_sigint)
    _STATE["installed"] = True


def hit() -> bool:
    """Whether this process received a Ctrl-C (only known where ``install`` ran)."""
    return _STATE["hit"]


def say() -> None:
    """Print the one line ``interrupted`` on stderr (``finish`` then prints nothing more)."""
    _STATE["said"] = True
    sys.stderr.write("interrupted\n")
    sys.stderr.flush()


def finish(command: Callable[[], int]) -> int:
    """Run ``command`` (returning an exit status) with interrupts armed; the exit status to leave with.

    Afterwards SIGINT is ignored for the rest of the process's life.
    """
    status = 130
    _STATE["said"] = False
    try:
        try:
            _STATE["armed"] = True
            if _STATE["hit"]:  # Ctrl-C during start-up, before the command could begin
                raise KeyboardInterrupt
            status = command()
        finally:
            _STATE["armed"] = False
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        status = 130
    if _STATE["hit"] or status == 130:
        status = 130
        if not _STATE["said"]:
            say()
    return status
