"""Progress bars for long work (training, capture, reports), quiet when not wanted."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class _Bar:
    def __init__(self, progress: Progress | None, task):
        self._progress, self._task = progress, task

    def advance(self, n: float = 1, **fields) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=n, **fields)

    def set(self, **fields) -> None:
        if self._progress is not None:
            self._progress.update(self._task, **fields)


@contextlib.contextmanager
def bar(
    description: str, total: float, *, enabled: bool = True, info: str = "", **fields: float
) -> Iterator[_Bar]:
    """A rich progress bar on stderr.

    ``info`` is a rich format string over extra fields whose start values are ``fields``, e.g.
    ``bar("train", 100, info="loss {task.fields[loss]:.3f}", loss=float("nan"))``.
    """
    if not enabled:
        yield _Bar(None, None)
        return
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    if info:
        columns.append(TextColumn(info))
    console = Console(file=sys.stderr)
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total, **fields)
        yield _Bar(progress, task)
