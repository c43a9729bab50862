"""Progress bars for long CLI commands (sync, verify, gc), on stderr and only on a terminal:
a pipe or a log gets the commands' usual lines and nothing else. Ctrl-C ends the command
cleanly (``ckptfs.cli.main`` turns it into exit 130 and one line)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

Update = Callable[[float, float | None], None]


def _noop(completed: float, total: float | None = None) -> None:
    return None


@contextlib.contextmanager
def progress(description: str, total: float | None, unit: str = "") -> Iterator[Update]:
    """Yield ``update(completed, total)``; a bar (a spinner while ``total`` is None) is drawn
    on stderr if it is a terminal, and removed at the end."""
    if not sys.stderr.isatty():
        yield _noop
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
    if unit == "bytes":
        columns += [DownloadColumn(), TransferSpeedColumn()]
    else:
        columns.append(MofNCompleteColumn())
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def update(completed: float, new_total: float | None = None) -> None:
            if new_total is not None:
                bar.update(task, total=new_total)
            bar.update(task, completed=completed)

        yield update
