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
    if status == INTERRUPTED:
        _leave_interrupted()
    sys.exit(status)


def _leave_interrupted() -> None:
    """Exit 130 after the exit handlers, without the interpreter's own epilogue: CPython kills itself
    with SIGINT at exit once a KeyboardInterrupt escaped code it ran through ``PyRun_String`` (torch
    runs some while it is imported), even when depthscope caught that interrupt further up.
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
    os._exit(INTERRUPTED)


if __name__ == "__main__":
    run()
