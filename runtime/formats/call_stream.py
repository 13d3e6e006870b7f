"""A call's JSON read into calls, for the tool-call parser (tool_calls.py):
whole, from a complete object the model wrote freely (checked, and its
arguments re-serialized compactly), or streamed, from one the tool-call
grammar writes (grammar.tool_call_grammar), whose arguments are passed on
as the model writes them. Nothing here raises on model output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

from llmctl.runtime.formats.stream_scan import Brackets, so_far
from llmctl.runtime.formats.tool_shapes import (
    CALL_OPENING,
    CALL_OPENING_MAX,
    Delta,
    ToolCallDelta,
    ToolCallDone,
    _loads,
)

_WS = r"[ \t\r\n]{0,8}"
_NAME = r'"(?:[^"\\]|\\.)*"'
# What the grammar writes before a call's arguments: the object's "{", its
# name (group 1), and the "arguments" key. Whitespace is bounded as the
# grammar bounds it (at most one space; up to 8 whitespace characters after
# an untagged call's opening, as tool_shapes.CALL_OPENING lets through).
_HEAD = re.compile(_WS + r'\{' + _WS + r'"name"' + _WS + ":" + _WS + "(" + _NAME + ")")
_HEAD_SO_FAR = so_far([_WS, r"\{", _WS, *map(re.escape, '"name"'), _WS, ":", _WS],
                      r'"(?:[^"\\]|\\.)*\\?')
_ARGS = re.compile(r' ?, ?"arguments" ?: ?\{')
_ARGS_SO_FAR = so_far([" ?", ",", " ?", *map(re.escape, '"arguments"'), " ?", ":", " ?"])
_TAIL_WS = r"[ \t\r\n]*"
# The lazy grammar's anchored trigger, read as grammar_sampler reads its bytes.
_OPENING = re.compile(CALL_OPENING, re.ASCII)


@dataclass(frozen=True)
class Step:
    """What one read of a streamed call decided: its name the first time it
    is known, argument text decided now, and once the call's text has ended,
    where (an index into the text read)."""

    name: str | None = None
    arguments: str = ""
    end: int | None = None


class GrammarCall:
    """One call object written under the tool-call grammar, from its "{" at
    `start` on, streamed: the name as soon as it is read and one of `names`
    (None: any), then the arguments' text as it arrives, to the end of their
    value (Brackets finds it, so the call object's closing "}" and the
    `close` marker after it never leak into the arguments), then the close.
    `sure` says, once the name is read, whether the grammar wrote it.

    Until the name is known the call may still turn out not to be the
    grammar's (read() returns None: read it as a free call instead). Once it
    is, it stays a call: when the output stops inside it (max_tokens, a stop
    string) the arguments are the text written so far, as OpenAI's are when
    finish_reason is "length", and `cut` is True. Raises nothing."""

    def __init__(self, start: int, names: set[str] | None, close: str,
                 sure: Callable[[], bool] = lambda: True) -> None:
        self._pos = start
        self._names, self._sure = names, sure
        self._close = re.compile(_TAIL_WS + r"\}" + _TAIL_WS + re.escape(close))
        self._close_so_far = so_far([_TAIL_WS, r"\}", _TAIL_WS, *map(re.escape, close)])
        self._phase = "head"
        self._scan: Brackets | None = None
        self.cut = False

    def read(self, buf: str, final: bool) -> Step | None:
        """What `buf` (all of the section's text so far) decides now; None
        when it is not a grammar call after all."""
        if self._phase == "head":
            return self._head(buf, final)
        if self._phase == "arguments":
            return self._arguments(buf, final)
        if self._phase == "value":
            return self._value(buf, final)
        return self._tail(buf, final)

    def _head(self, buf: str, final: bool) -> Step | None:
        m = _HEAD.match(buf, self._pos)
        if m is None:
            if not final and _HEAD_SO_FAR.fullmatch(buf, self._pos):
                return Step()
            return None
        name = _loads(m.group(1))
        if not isinstance(name, str) or (self._names is not None and name not in self._names):
            return None
        if not self._sure():
            return None
        self._pos, self._phase = m.end(), "arguments"
        step = self._arguments(buf, final)
        return Step(name, step.arguments, step.end)

    def _arguments(self, buf: str, final: bool) -> Step:
        m = _ARGS.match(buf, self._pos)
        if m is None:
            if _ARGS_SO_FAR.fullmatch(buf, self._pos):
                if not final:
                    return Step()
                self.cut = True
                return Step(end=len(buf))
            return Step(end=self._pos)  # not the grammar's text: the rest is read as content
        self._pos, self._phase = m.end() - 1, "value"
        self._scan = Brackets(self._pos)
        return self._value(buf, final)

    def _value(self, buf: str, final: bool) -> Step:
        assert self._scan is not None
        end = self._scan.end(buf)
        if end is None:
            upto = len(buf) if final else self._scan.scanned
            text, self._pos = buf[self._pos:upto], upto
            if final:
                self.cut = True
                return Step(arguments=text, end=len(buf))
            return Step(arguments=text)
        text, self._pos, self._phase = buf[self._pos:end], end, "tail"
        step = self._tail(buf, final)
        return Step(arguments=text, end=step.end)

    def _tail(self, buf: str, final: bool) -> Step:
        m = self._close.match(buf, self._pos)
        if m is not None:
            return Step(end=m.end())
        if self._close_so_far.fullmatch(buf, self._pos):
            # The call's own syntax, cut short at the end of the output.
            return Step(end=len(buf)) if final else Step()
        return Step(end=self._pos)


class GrammarSections:
    """The streamed calls of ToolCallParser (tool_calls.py), kept here: the
    state they need and the "streamed" section that reads one.

    Under the tool-call grammar (ToolCallParser's `constrained`: tool_choice
    required or named, or `auto`'s lazy grammar, which starts at a
    <tool_call> or at a call opening the answer, tool_shapes.CALL_OPENING) a
    call the grammar is sure to have written streams: a <tool_call> block,
    unless the grammar started at the answer's opening (its free text after
    an untagged call follows, where a tag is not the grammar's), and a fenced
    call that opened the answer (after the fence, the grammar's too). A bare
    call is a call only as the whole answer, so it is held to the end, as are
    calls written freely."""

    _buf: str
    _out: list[Delta]
    _index: int
    _mode: str
    _names: set[str] | None
    _new_id: Callable[[], str]

    def _open_section(self, mode: str, raw: str, fenced: bool = False) -> bool:
        raise NotImplementedError

    def _init_grammar(self, constrained: bool, started_in_thought: bool) -> None:
        self._constrained = constrained
        self._opening = ""  # the output's first characters, where CALL_OPENING looks
        self._at_start = not started_in_thought  # no thought came before the body
        self._call: GrammarCall | None = None
        self._after = ("", "")  # the streamed section's free reading, and the next section
        self.cut = False  # the output ended inside a streamed call

    def _watch_opening(self, text: str) -> None:
        if len(self._opening) < 2 * CALL_OPENING_MAX:
            self._opening += text[:2 * CALL_OPENING_MAX]

    def _grammar_opened(self) -> bool:
        """Whether the lazy grammar started at the answer's opening."""
        return _OPENING.match(self._opening) is not None

    def _stream(self, at: int, close: str, free: str, then: str,
                sure: Callable[[], bool] = lambda: True) -> bool:
        """Reads the section from buf[at:] as a grammar call; `free` is the
        section that reads it when it is not one, `then` the one after it."""
        self._call = GrammarCall(at, self._names, close, sure)
        self._after, self._mode = (free, then), "streamed"
        return True

    def _in_streamed(self, final: bool) -> bool:
        assert self._call is not None
        step = self._call.read(self._buf, final)
        if step is None:  # not the grammar's call after all: read it as a free one
            self._call, self._mode = None, self._after[0]
            return True
        if step.name is not None:
            self._out.append(ToolCallDelta(self._index, self._new_id(), step.name, ""))
            self._index += 1
        if step.arguments:
            self._out.append(ToolCallDelta(self._index - 1, None, None, step.arguments))
        if step.end is None:
            return False
        self._out.append(ToolCallDone(self._index - 1))
        self.cut, self._buf, self._call = self._call.cut, self._buf[step.end:], None
        return self._open_section(self._after[1], "")


def whole_calls(text: str, names: set[str] | None,
                head: str | None = None) -> list[tuple[str, str]] | None:
    """(name, compact arguments) of each call in `text`, a complete JSON
    value the model wrote freely: one call, a list of them, or OpenAI's
    {"tool_calls": [...]}; `head` is a name written before the JSON (Mistral's
    name[ARGS]{…}), which makes the JSON the arguments. None unless every
    item is a call to one of `names` (None: any) with object arguments."""
    value = _loads(text)
    if head is not None:
        value = {"name": head, "arguments": value}
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    calls = [call for call in (_call(item, names) for item in items) if call is not None]
    return calls if calls and len(calls) == len(items) else None


def _call(item: object, names: set[str] | None) -> tuple[str, str] | None:
    if isinstance(item, dict) and "name" not in item and isinstance(item.get("function"), dict):
        item = item["function"]  # OpenAI's own shape
    if not isinstance(item, dict):
        return None
    name = item.get("name")
    args = item.get("arguments", item.get("parameters"))
    if isinstance(args, str):
        args = _loads(args)
    if not isinstance(name, str) or not isinstance(args, dict):
        return None
    if names is not None and name not in names:
        return None
    return name, json.dumps(args, ensure_ascii=False, separators=(",", ":"))


def arguments_object(text: str) -> dict:
    """A call's arguments as an object, for the protocols whose calls carry
    one (Anthropic's `input`): the JSON object in `text`, or, when the output
    stopped inside it, the object its text so far makes (an open string
    closed, or else its complete members); {} when there is none. Raises
    nothing."""
    value = _loads(text or "{}")
    if isinstance(value, dict) or not text.startswith("{"):
        return value if isinstance(value, dict) else {}
    closers, in_string = _closers(text)
    if in_string:
        body = text[:-1] if closers.startswith("\\") else text
        value = _loads(body + '"' + closers.lstrip("\\"))
        if isinstance(value, dict):
            return value
    # Drop members from the end until what is left, closed, parses.
    cut = len(text)
    for _ in range(64):
        cut = max(text.rfind(",", 0, cut), text.rfind("{", 0, cut))
        if cut < 0:
            break
        body = text[:cut] if text[cut] == "," else text[:cut + 1]
        closers, in_string = _closers(body)
        value = None if in_string else _loads(body + closers)
        if isinstance(value, dict):
            return value
    return {}


def _closers(text: str) -> tuple[str, bool]:
    """The brackets that close what the JSON prefix `text` left open, and
    whether it ends inside a string (then led by a backslash when it ends
    inside an escape)."""
    stack: list[str] = []
    in_string = escaped = False
    for c in text:
        if escaped:
            escaped = False
        elif in_string:
            escaped = c == "\\"
            in_string = c != '"'
        elif c == '"':
            in_string = True
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
        elif c in "}]" and stack:
            stack.pop()
    return ("\\" if escaped else "") + "".join(reversed(stack)), in_string
