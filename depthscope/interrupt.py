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

* an interrupt that a library turned into another exception (Python turns a KeyboardInterrupt
  raised inside ``__set_name__``, while a class is being made, into a RuntimeError) is still an
  interrupt: ``finish`` reports any exception after a recorded Ctrl-C as exit 130;
* the messages Python prints for exceptions it cannot raise (an object finalised half made, such as
  a ``ZipFile`` whose ``__init__`` the interrupt stopped) are silent once an interrupt is recorded;
* the imports of torch and transformers run with the interrupt deferred (``HEAVY``): an exception
  raised while their C++ extensions call back into Python aborts the process (``terminate called
  after throwing an instance of 'pybind11::error_already_set'``); the Ctrl-C is raised as soon as
  the import is done.

A process started with SIGINT ignored (a job started in the background by a non-interactive
shell) keeps it ignored, as Python itself does.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import signal
import sys
from collections.abc import Callable, Iterator

_STATE = {"installed": False, "armed": False, "hit": False, "said": False, "looking": False}
HEAVY = ("torch", "transformers")  # top-level packages whose import defers a Ctrl-C (their C++ calls back)


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
    sys.meta_path.insert(0, _DeferredImports)
    default = sys.unraisablehook
    sys.unraisablehook = lambda u: None if _STATE["hit"] else default(u)
    _STATE["installed"] = True


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a Ctrl-C that arrives inside the block; raise it when the block ends (if armed)."""
    armed = _STATE["armed"]
    _STATE["armed"] = False
    try:
        yield
    finally:
        _STATE["armed"] = armed
    if armed and _STATE["hit"]:
        raise KeyboardInterrupt


class _Deferring:
    """A loader that runs another loader's module code with the interrupt ``deferred``."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name):  # get_source, get_resource_reader, ...: the wrapped loader's own
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        with deferred():
            self._loader.exec_module(module)


class _DeferredImports:
    """A finder that hands the ``HEAVY`` packages' own specs back with a ``_Deferring`` loader."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in HEAVY or _STATE["looking"]:
            return None
        _STATE["looking"] = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            _STATE["looking"] = False
        if spec is not None and spec.loader is not None:
            spec.loader = _Deferring(spec.loader)
        return spec


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
    except BaseException:
        if not _STATE["hit"]:
            raise
        status = 130  # an interrupt a library turned into another exception
    if _STATE["hit"] or status == 130:
        status = 130
        if not _STATE["said"]:
            say()
    return status


def leave(status: int) -> None:
    """Exit with ``status`` after the exit handlers and with the output flushed, without the
    interpreter's own epilogue (finalization and the C++ destructors that run after it):

    * after an interrupt, CPython kills itself with SIGINT at exit once a KeyboardInterrupt escaped
      code it ran through ``PyRun_String`` (torch runs some while it is imported), even when
      depthscope caught that interrupt further up;
    * a rank under torchrun has finished its part and destroyed its process group; the C++ side
      then aborted at interpreter exit ("terminate called without an active exception", SIGABRT;
      where exactly was not found) in 2 of about 20 two-rank captures of a tiny Llama on a 2-core
      machine (and once in CI), after the trace was written, and torchrun then reported the run as
      failed; 0 of 36 leaving this way. A local ``--workers`` rank (``pipelines.capture``) aborted
      the same way at its exit once in 9 two-worker captures of SmolLM2, after its part was done.
    """
    import atexit
    import contextlib
    import os
    import sys

    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
