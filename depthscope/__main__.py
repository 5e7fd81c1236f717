"""The ``depthscope`` command's entry point (the console script, ``python -m depthscope`` and
``torchrun -m depthscope``).

Ctrl-C is taken over before anything heavy is imported (``depthscope.interrupt``), so an
interrupt during start-up is exit 130 and one line like one during the work.
"""

from depthscope import interrupt

interrupt.install()

INTERRUPTED = 130


def run() -> None:
    """Run the command line on ``sys.argv`` and exit with its status."""
    import sys

    def command() -> int:
        from depthscope.cli import main

        return main()

    try:
        status = interrupt.finish(command)
    finally:  # what an interrupt or a failure left behind (SIGINT is ignored by now)
        from depthscope.atomic import remove_pending

        remove_pending()
    if status == INTERRUPTED or _one_of_several_ranks():
        _leave(status)
    sys.exit(status)


def _one_of_several_ranks() -> bool:
    """Whether this process is one rank of several that torchrun started (WORLD_SIZE > 1)."""
    import os

    return os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1")


def _leave(status: int) -> None:
    """Exit with ``status`` after the exit handlers and with the output flushed, without the
    interpreter's own epilogue (finalization and the C++ destructors that run after it):

    * after an interrupt, CPython kills itself with SIGINT at exit once a KeyboardInterrupt escaped
      code it ran through ``PyRun_String`` (torch runs some while it is imported), even when
      depthscope caught that interrupt further up;
    * a rank under torchrun has finished its part and destroyed its process group; the C++ side
      then aborted at interpreter exit ("terminate called without an active exception", SIGABRT;
      where exactly was not found) in 2 of about 20 two-rank captures of a tiny Llama on a 2-core
      machine (and once in CI), after the trace was written, and torchrun then reported the run as
      failed; 0 of 36 leaving this way.
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


if __name__ == "__main__":
    run()
