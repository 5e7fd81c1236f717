"""Progress bars for long work (training, capture, reports): rich's Progress, disabled when not wanted."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Bar:
    """One task of a rich Progress: ``advance(n, **fields)``."""

    def __init__(self, progress: Progress, task: TaskID):
        self._progress, self._task = progress, task

    def advance(self, n: float = 1, **fields) -> None:
        """Advance the task by ``n`` and set the extra fields given."""
        self._progress.update(self._task, advance=n, **fields)


@contextlib.contextmanager
def bar(
    description: str, total: float, *, enabled: bool = True, info: str = "", **fields: float
) -> Iterator[Bar]:
    """A rich progress bar on stderr (``enabled=False``: rich's own disabled Progress, drawing nothing).

    ``info`` is a rich format string over extra fields whose start values are ``fields``, e.g.
    ``bar("train", 100, info="loss {task.fields[loss]:.3f}", loss=float("nan"))``.
    """
    columns = [
        TextColumn("{task.description}", markup=False, style="bold"),  # labels are text, never markup
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    if info:
        columns.append(TextColumn(info))
    with Progress(
        *columns, console=Console(file=sys.stderr), transient=False, disable=not enabled
    ) as progress:
        yield Bar(progress, progress.add_task(description, total=total, **fields))


@contextlib.contextmanager
def status(message: str, *, enabled: bool = True) -> Iterator[None]:
    """A spinner with ``message`` on stderr while a step without a count runs (loading a model),
    then the same line with the seconds it took; nothing when not ``enabled``.
    """
    if not enabled:
        yield
        return
    import time

    console = Console(file=sys.stderr, markup=False, highlight=False)
    start = time.perf_counter()
    with console.status(message):
        yield
    console.print(f"{message} done ({time.perf_counter() - start:.0f} s)")
