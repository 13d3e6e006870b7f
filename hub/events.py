"""What a pull reports while it runs. The library draws nothing: a caller
(the CLI's progress bars, a server, a test) passes an object with these
methods, and pull calls them."""

from __future__ import annotations

from typing import Protocol


class PullEvents(Protocol):
    """Progress of one pull. `on_bytes` is called from the download threads,
    several at once, so an implementation must be thread-safe (rich's
    Progress is); the others are called from the thread that runs pull.
    Nothing here may raise: an exception would abort the pull."""

    def on_start(self, total: int) -> None:
        """The files to fetch add up to `total` bytes (some may be on disk
        already from an interrupted pull; on_file says how much)."""

    def on_file(self, name: str, size: int, done: int) -> None:
        """File `name` of `size` bytes starts, `done` of them already on disk."""

    def on_bytes(self, name: str, n: int) -> None:
        """`n` more bytes of file `name` arrived."""

    def on_note(self, text: str) -> None:
        """A line for the user (a resumed download, say)."""


class Silent:
    """PullEvents that ignores everything: the default."""

    def on_start(self, total: int) -> None:
        pass

    def on_file(self, name: str, size: int, done: int) -> None:
        pass

    def on_bytes(self, name: str, n: int) -> None:
        pass

    def on_note(self, text: str) -> None:
        pass
