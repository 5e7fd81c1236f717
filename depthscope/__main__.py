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
        interrupt.leave(status)
    sys.exit(status)


def _one_of_several_ranks() -> bool:
    """Whether this process is one rank of several that torchrun started (WORLD_SIZE > 1)."""
    import os

    return os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1")


if __name__ == "__main__":
    run()
