"""Rich progress bars on stderr for `llmctl pull`: one per file and one
overall. Implements llmctl.hub.events.PullEvents."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class PullProgressBar:
    """Use as a context manager around `llmctl.hub.pull(..., events=bar)`."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True, highlight=False)
        self.progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=self.console,
            transient=False)
        self.overall: TaskID | None = None
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> "PullProgressBar":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def on_start(self, total: int) -> None:
        self.overall = self.progress.add_task("total", total=total)

    def on_file(self, name: str, size: int, done: int) -> None:
        self.tasks[name] = self.progress.add_task(name, total=size, completed=done)
        self._advance_overall(done)

    def on_bytes(self, name: str, n: int) -> None:
        self.progress.advance(self.tasks[name], n)
        self._advance_overall(n)

    def on_note(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)

    def _advance_overall(self, n: int) -> None:
        if self.overall is not None:
            self.progress.advance(self.overall, n)
