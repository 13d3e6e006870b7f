"""Streaming detokenization: bytes in, whole characters out, stop strings
held back until they can no longer match."""

from __future__ import annotations

import codecs


class Utf8Decoder:
    """Feeds token bytes through an incremental UTF-8 decoder, so a character
    split across two tokens (common for emoji and CJK in byte-level BPE) is
    only emitted once complete."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings in streamed text. Text that might be the start of a
    stop string is held back, so a client never sees part of a stop."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.matched: str | None = None     # the stop string that was hit
        self._held = ""
        self._keep = max((len(s) for s in stops), default=1) - 1

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buf = self._held + text
        hits = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            cut, self.matched = min(hits, key=lambda hit: hit[0])
            self._held = ""
            return buf[:cut], True
        hold = self._partial_suffix(buf)
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold], False

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a prefix of a stop."""
        for n in range(min(self._keep, len(buf)), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
