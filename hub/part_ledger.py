"""Parts bookkeeping, which is what makes a download resumable: the file
is cut into fixed parts, each fetched front to back by one connection, and a
sidecar records how many bytes of each part are on disk."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from llmctl.files import atomic_write

MIB = 1 << 20


def part_size_for(size: int, connections: int) -> int:
    """The part size for a `size`-byte download over `connections`: about four
    parts per connection, within 1 to 32 MiB."""
    # Several parts per connection, so the last ones do not leave most
    # connections idle; at least 1 MiB so request overhead stays small.
    return max(MIB, min(32 * MIB, -(-size // (connections * 4))))


class Parts:
    """A download's parts and the bytes of each on disk, kept in a JSON sidecar
    beside the data file. save() raises OSError."""

    def __init__(self, data: Path, etag: str, size: int, part_size: int,
                 done: list[int] | None = None):
        self.data, self.etag, self.size, self.part_size = data, etag, size, part_size
        self.count = max(1, -(-size // part_size))
        self.done = done or [0] * self.count
        self._lock = threading.Lock()

    @property
    def sidecar(self) -> Path:
        return self.data.with_name(self.data.name + ".json")

    def span(self, i: int) -> tuple[int, int]:
        """[start, end) of part i."""
        start = i * self.part_size
        return start, min(self.size, start + self.part_size)

    def remaining(self, i: int) -> int:
        start, end = self.span(i)
        return end - start - self.done[i]

    def advance(self, i: int, n: int) -> None:
        with self._lock:
            self.done[i] += n

    @property
    def bytes_done(self) -> int:
        return sum(self.done)

    def save(self) -> None:
        with self._lock:
            body = json.dumps({"etag": self.etag, "size": self.size,
                               "part_size": self.part_size, "done": self.done})
        atomic_write(self.sidecar, body)

    def discard(self) -> None:
        for p in (self.data, self.sidecar):
            p.unlink(missing_ok=True)

    @classmethod
    def open(cls, data: Path, etag: str, size: int, connections: int) -> "Parts":
        """Resume what the sidecar vouches for; otherwise start empty."""
        data.parent.mkdir(parents=True, exist_ok=True)
        parts = cls._load(data, etag, size)
        if parts is None:
            parts = cls(data, etag, size, part_size_for(size, connections))
            with open(data, "wb") as f:
                f.truncate(size)   # sparse: parts land anywhere, in any order
            parts.save()
        return parts

    @classmethod
    def _load(cls, data: Path, etag: str, size: int) -> "Parts | None":
        sidecar = data.with_name(data.name + ".json")
        try:
            meta = json.loads(sidecar.read_text())
            if meta["etag"] != etag or meta["size"] != size or data.stat().st_size != size:
                return None
            parts = cls(data, etag, size, int(meta["part_size"]), [int(d) for d in meta["done"]])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if len(parts.done) != parts.count or any(
                d < 0 or parts.remaining(i) < 0 for i, d in enumerate(parts.done)):
            return None
        return parts
