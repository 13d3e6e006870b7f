"""A model's leading `<think>…</think>` thought (DeepSeek-R1 distills, Qwen3,
QwQ), split from the rest of its output as the text streams in.

Only a thought at the very start of the output counts: a `<think>` later in
an answer is the answer's own text (a model explaining the tag, say)."""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def opens_thought(prompt: str) -> bool:
    """Whether a rendered prompt leaves the model inside a thought: templates
    such as DeepSeek-R1's end the generation prompt with `<think>\\n`, so the
    output holds only the closing `</think>`. Raises nothing."""
    return prompt.rstrip().endswith(THINK_OPEN)


def partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one
    of `markers`: text a streaming parser must hold back until the next chunk
    says whether a marker begins there. Raises nothing."""
    longest = max((len(m) for m in markers), default=1) - 1
    for n in range(min(longest, len(text)), 0, -1):
        tail = text[-n:]
        if any(m.startswith(tail) for m in markers):
            return n
    return 0


class ThinkSplitter:
    """Splits streamed output into parts, in order, each a (kind, text) pair:
    "open" (the `<think>` tag with any whitespace before it), "thought",
    "close" (the `</think>` tag) and "body" (everything after, or all of it
    when the output does not start with a thought). Joining every part's text
    gives back the input exactly. A thought never closed runs to the end.
    Raises nothing."""

    def __init__(self, started_in_thought: bool = False) -> None:
        self._state = "thought" if started_in_thought else "start"
        self._buf = ""

    def feed(self, text: str, final: bool = False) -> list[tuple[str, str]]:
        """Parts decided by `text`; with final=True, also all text held back."""
        self._buf += text
        parts: list[tuple[str, str]] = []
        if self._state == "start":
            head = self._buf.lstrip()
            if head.startswith(THINK_OPEN):
                cut = len(self._buf) - len(head) + len(THINK_OPEN)
                parts.append(("open", self._buf[:cut]))
                self._buf, self._state = self._buf[cut:], "thought"
            elif not final and THINK_OPEN.startswith(head):
                return parts
            else:
                self._state = "body"
        if self._state == "thought":
            end = self._buf.find(THINK_CLOSE)
            if end < 0:
                keep = 0 if final else partial_marker_len(self._buf, (THINK_CLOSE,))
                parts.append(("thought", self._buf[:len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep:]
                return [p for p in parts if p[1]]
            parts += [("thought", self._buf[:end]), ("close", THINK_CLOSE)]
            self._buf, self._state = self._buf[end + len(THINK_CLOSE):], "body"
        parts.append(("body", self._buf))
        self._buf = ""
        return [p for p in parts if p[1]]
