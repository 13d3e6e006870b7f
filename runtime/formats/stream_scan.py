"""Scanners over model text as it streams, for the tool-call parser
(tool_calls.py): where a JSON value ends, read once however it is chunked,
one output channel trimmed of surrounding whitespace, and the pattern of
the text that may still become a given syntax. None raises on any text."""

from __future__ import annotations

import re


def so_far(pieces: list[str], last: str = "") -> re.Pattern[str]:
    """The pattern whose full matches are the prefixes of `pieces` joined
    (then `last`): each piece a pattern whose own prefixes it matches (one
    character, or a run of a character class), `last` the pattern of the
    final piece's prefixes. Text that full-matches it may still become the
    syntax as more arrives. Raises re.error for a malformed piece."""
    pattern = f"(?:{last})?" if last else ""
    for piece in reversed(pieces):
        pattern = f"(?:{piece}{pattern})?"
    return re.compile(pattern)


class Trimmed:
    """One output channel: drops leading whitespace and holds trailing
    whitespace until more text follows, so the streamed text equals the
    whole text stripped."""

    def __init__(self) -> None:
        self._started = False
        self._held = ""

    def push(self, text: str) -> str:
        """The part of `text` decided now: what may be trailing whitespace is held."""
        if not self._started:
            text = text.lstrip()
            self._started = bool(text)
        body = text.rstrip()
        if not body:
            self._held += text
            return ""
        out, self._held = self._held + body, text[len(body):]
        return out


class Brackets:
    """Finds where a JSON object or array starting at `start` ends, resuming
    where the previous call stopped, so a long call streamed in small chunks
    is scanned once."""

    _OUTSIDE = re.compile(r'[{}\[\]"]')
    _INSIDE = re.compile(r'[\\"]')

    def __init__(self, start: int) -> None:
        self.start = self._pos = start
        self._depth = 0
        self._in_string = False
        self._end: int | None = None

    @property
    def scanned(self) -> int:
        """How far the text has been read: all before it is inside the value."""
        return self._end if self._end is not None else self._pos

    def end(self, s: str) -> int | None:
        """Index just past the value, or None while it is unfinished."""
        while self._end is None:
            m = (self._INSIDE if self._in_string else self._OUTSIDE).search(s, self._pos)
            if m is None:
                self._pos = len(s)
                return None
            c = m.group()
            if c == "\\":
                if m.end() == len(s):  # the escaped character is still to come
                    self._pos = m.start()
                    return None
                self._pos = m.end() + 1
                continue
            self._pos = m.end()
            if c == '"':
                self._in_string = not self._in_string
            elif c in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    self._end = self._pos
        return self._end
