"""An answer read as typed events, which every protocol renders in its own
shapes: OpenAI's chat chunks, Anthropic's content blocks, the Responses
API's output items and Ollama's lines are four dialects of one event set.

The model's text is read by the tool-call parser (runtime/formats): plain
text, a thought, and tool calls in the model's own syntax. A whole answer
is read as the same events as a streamed one, so a stream adds up to the
body. `ToolCallEnd` carries the whole call, for protocols whose calls
travel whole (Ollama) or close with their arguments (Responses). Text and
thought deltas are the parser's own (TextDelta, ThinkingDelta)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Union

from llmctl.runtime.engine.events import FinishEvent, Usage
from llmctl.runtime.formats.tool_calls import (
    Delta,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallDone,
    ToolCallParser,
    ToolFormat,
)


@dataclass(frozen=True)
class ToolSetup:
    """How to read one answer: the model's tool-call format, the names it may
    call (an empty set: none), whether several calls are allowed, whether a
    leading <think> block is split off as reasoning, and whether the
    tool-call grammar writes the calls (`constrained`: then a call's
    arguments stream as they are written, see ToolCallParser; a protocol
    whose calls travel whole, as Ollama's, leaves it False)."""

    fmt: ToolFormat
    names: frozenset[str]
    parallel: bool = True
    reasoning: bool = True
    started_in_thought: bool = False
    constrained: bool = False
    doubled: bool = False           # the template teaches calls in doubled braces


@dataclass(frozen=True)
class ToolCallStart:
    """A tool call begins: its index in the answer, id and function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolArgumentsDelta:
    """More of call `index`'s arguments, JSON text to append in order."""

    index: int
    text: str


@dataclass(frozen=True)
class ToolCallEnd:
    """Call `index` is complete; `call` is the whole of it."""

    index: int
    call: ToolCall


LOOP_EXPLANATION = ("the output repeated one block of text over and over, and the loop "
                    "guard ended it")


def stop_details(reason: str) -> dict:
    """The field each protocol adds when the loop guard ended an answer
    (`reason` "loop"), to splat into its object; empty otherwise. The
    protocols' own stop reasons stay ones their clients know."""
    return {"stop_details": {"type": "loop", "explanation": LOOP_EXPLANATION}} \
        if reason == "loop" else {}


@dataclass(frozen=True)
class Finish:
    """The answer ended. `reason` is "tool_calls" when it called a tool
    (and did not stop inside the call), else the engine's "stop",
    "length" or "loop"; `stop` is the stop string that ended it, if one did."""

    reason: str
    stop: str | None
    usage: Usage
    engine: FinishEvent             # timings, for protocols that report them
    reasoning_tokens: int = 0       # output tokens that went to the thought


AnswerEvent = Union[TextDelta, ThinkingDelta, ToolCallStart, ToolArgumentsDelta, ToolCallEnd,
                    Finish]


class AnswerReader:
    """Reads one answer's text pieces, as the engine releases them, into
    AnswerEvents. Without a ToolSetup the text passes through as text."""

    def __init__(self, setup: ToolSetup | None):
        self.setup = setup
        # parallel_tool_calls=false: the first call only
        self.parallel = setup is None or setup.parallel
        self._parser = None if setup is None else ToolCallParser(
            setup.fmt, set(setup.names), setup.reasoning,
            started_in_thought=setup.started_in_thought, constrained=setup.constrained,
            doubled=setup.doubled)
        self._open: dict[int, list] = {}     # index -> [id, name, argument pieces]
        self.n_calls = 0
        # Pieces fed before the first content or call, and whether a
        # thought was among them: the thought's share of the output.
        self._before_answer, self._thought_seen, self._answering = 0, False, False

    @property
    def reasoning_tokens(self) -> int:
        """The pieces fed so far that went to the answer's leading thought."""
        return self._before_answer if self._thought_seen else 0

    @property
    def cut(self) -> bool:
        """Whether the output stopped inside a streamed call (max_tokens or a
        stop string): the call stands with the arguments written so far."""
        return self._parser is not None and self._parser.cut

    def feed(self, text: str) -> list[AnswerEvent]:
        """The events a piece of generated text adds."""
        if self._parser is None:
            return [TextDelta(text)] if text else []
        out = self._events(self._parser.feed(text))
        if not self._answering:
            self._thought_seen |= any(isinstance(e, ThinkingDelta) for e in out)
            self._answering = any(isinstance(e, (TextDelta, ToolCallStart)) for e in out)
            self._before_answer += not self._answering
        return out

    def finish(self, end: FinishEvent) -> list[AnswerEvent]:
        """The events still held back when the answer ends (its `tail`
        included), the end of a call it stopped inside, and Finish."""
        return (self.feed(end.tail) if end.tail else []) + self._close(end)

    def whole(self, pieces: Iterable[str], end: FinishEvent) -> list[AnswerEvent]:
        """Every event of a whole answer: `pieces`, its text as the engine
        released it, tail included (so the thought's tokens are counted as
        a stream counts them)."""
        out: list[AnswerEvent] = []
        for piece in pieces:
            if piece:
                out += self.feed(piece)
        return out + self._close(end)

    def _close(self, end: FinishEvent) -> list[AnswerEvent]:
        out: list[AnswerEvent] = []
        if self._parser is not None:
            out += self._events(self._parser.finish())
        for index in list(self._open):
            out += self._end(index)
        if self.n_calls and not self.cut:
            reason = "tool_calls"
        else:
            reason = end.reason if end.reason in ("stop", "length", "loop") else "stop"
        return out + [Finish(reason, end.stop, end.usage, end, self.reasoning_tokens)]

    def _events(self, deltas: list[Delta]) -> list[AnswerEvent]:
        out: list[AnswerEvent] = []
        for d in deltas:
            if isinstance(d, TextDelta):
                if d.text:
                    out.append(d)
            elif isinstance(d, ThinkingDelta):
                out.append(d)
            elif d.index > 0 and not self.parallel:
                continue
            elif isinstance(d, ToolCallDone):
                out += self._end(d.index)
            else:
                out += self._call(d)
        return out

    def _call(self, d: ToolCallDelta) -> list[AnswerEvent]:
        out: list[AnswerEvent] = []
        if d.id is not None:
            self.n_calls = max(self.n_calls, d.index + 1)
            self._open[d.index] = [d.id, d.name or "", []]
            out.append(ToolCallStart(d.index, d.id, d.name or ""))
        if d.arguments and d.index in self._open:
            self._open[d.index][2].append(d.arguments)
            out.append(ToolArgumentsDelta(d.index, d.arguments))
        return out

    def _end(self, index: int) -> list[AnswerEvent]:
        opened = self._open.pop(index, None)
        if opened is None:
            return []
        call_id, name, pieces = opened
        return [ToolCallEnd(index, ToolCall(call_id, name, "".join(pieces)))]


@dataclass
class Folded:
    """A whole answer's events folded: its text (None when there is
    none), its thought (None when there is none), its calls and how it
    finished."""

    content: str | None
    thinking: str | None
    calls: list[ToolCall] = field(default_factory=list)
    finish: Finish | None = None


def fold(events: Iterable[AnswerEvent]) -> Folded:
    """The whole answer `events` spell."""
    text: list[str] = []
    thought: list[str] = []
    calls: list[ToolCall] = []
    finish = None
    for e in events:
        if isinstance(e, TextDelta):
            text.append(e.text)
        elif isinstance(e, ThinkingDelta):
            thought.append(e.text)
        elif isinstance(e, ToolCallEnd):
            calls.append(e.call)
        elif isinstance(e, Finish):
            finish = e
    return Folded("".join(text) or None, "".join(thought) or None, calls, finish)
