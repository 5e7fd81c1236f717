"""``python -m depthscope`` (and ``torchrun -m depthscope``): the command line."""

from depthscope.cli import run

run()
