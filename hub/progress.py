"""Rich progress bars on stderr: one per file and one overall."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TaskID, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)


class PullProgress:
    def __init__(self, total: int, *, quiet: bool, console: Console | None = None):
        self.console = console or Console(stderr=True, highlight=False)
        self.progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=self.console,
            disable=quiet, transient=False)
        self.overall = self.progress.add_task("total", total=total)
        self.quiet = quiet

    def __enter__(self) -> "PullProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def file(self, name: str, size: int, done: int = 0) -> TaskID:
        task = self.progress.add_task(name, total=size, completed=done)
        self.progress.advance(self.overall, done)
        return task

    def advance(self, task: TaskID, n: int) -> None:
        self.progress.advance(task, n)
        self.progress.advance(self.overall, n)

    def note(self, text: str) -> None:
        if not self.quiet:
            self.progress.console.print(text, markup=False, highlight=False)
