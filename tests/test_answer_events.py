"""The event set every protocol renders (server/answer_reader.py), read from
model text without a model: a stream's events and a whole answer's are the
same, calls start, stream and end once each, and Finish says why."""

from __future__ import annotations

import json
import random

from llmctl.runtime.engine.events import FinishEvent, Usage
from llmctl.runtime.formats.tool_calls import ToolFormat
from llmctl.server.answer_reader import (
    AnswerReader,
    Finish,
    TextDelta,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolSetup,
    fold,
)

NAMES = frozenset({"get_weather", "get_time"})
WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
END = FinishEvent("stop", Usage(10, 20), ttft_s=0.1, duration_s=0.3, decode_s=0.2)


def _setup(**kw) -> ToolSetup:
    return ToolSetup(ToolFormat.HERMES, NAMES, **kw)


def _streamed(text: str, setup: ToolSetup | None, end: FinishEvent = END,
              rng: random.Random | None = None) -> list:
    rng = rng or random.Random(text)
    reader, events, at = AnswerReader(setup), [], 0
    while at < len(text):
        step = rng.randint(1, 7)
        events += reader.feed(text[at:at + step])
        at += step
    return events + reader.finish(end)


def _kinds(events: list) -> list[str]:
    return [type(e).__name__ for e in events]


def test_a_call_starts_streams_and_ends_once_and_the_answer_says_why():
    for constrained in (False, True):
        events = _streamed("<think>rain?</think>\n" + WEATHER, _setup(constrained=constrained))
        starts = [e for e in events if isinstance(e, ToolCallStart)]
        ends = [e for e in events if isinstance(e, ToolCallEnd)]
        assert [(s.index, s.name) for s in starts] == [(0, "get_weather")]
        assert len(ends) == 1 and ends[0].call.id == starts[0].id
        args = "".join(e.text for e in events if isinstance(e, ToolArgumentsDelta))
        assert json.loads(args) == json.loads(ends[0].call.arguments) == {"city": "Paris"}
        first_arg = next(i for i, e in enumerate(events) if isinstance(e, ToolArgumentsDelta))
        assert events.index(starts[0]) < first_arg < events.index(ends[0])
        assert "".join(e.text for e in events if isinstance(e, ThinkingDelta)) == "rain?"
        assert isinstance(events[-1], Finish) and events[-1].reason == "tool_calls"
        assert _kinds(events).count("Finish") == 1


def test_a_stream_and_a_whole_answer_are_the_same_events():
    text = "Let me check.\n" + WEATHER + "\n" + TIME
    for seed in range(5):
        streamed = fold(_streamed(text, _setup(), rng=random.Random(seed)))
        whole = fold(AnswerReader(_setup()).whole([text], END))
        assert (streamed.content, streamed.thinking) == (whole.content, whole.thinking)
        assert [(c.name, c.arguments) for c in streamed.calls] == \
            [(c.name, c.arguments) for c in whole.calls] == \
            [("get_weather", '{"city":"Paris"}'), ("get_time", "{}")]
        assert streamed.content == "Let me check."


def test_without_parallel_calls_only_the_first_is_read():
    events = _streamed(WEATHER + "\n" + TIME, _setup(parallel=False))
    assert [e.call.name for e in events if isinstance(e, ToolCallEnd)] == ["get_weather"]
    assert not any(isinstance(e, (ToolCallStart, ToolArgumentsDelta)) and e.index > 0
                   for e in events)


def test_a_call_cut_by_max_tokens_ends_and_finishes_for_length():
    cut = WEATHER[:WEATHER.index("Paris") + 3]
    events = _streamed(cut, _setup(constrained=True), FinishEvent("length", Usage(10, 8), 0.1, 0.3))
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(ends) == 1 and ends[0].call.name == "get_weather"
    assert isinstance(events[-1], Finish) and events[-1].reason == "length"


def test_plain_text_passes_through_and_a_stop_string_is_kept():
    events = _streamed("Four.", None, FinishEvent("stop", Usage(3, 2), 0.1, 0.3, stop="\n\n"))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Four."
    assert events[-1] == Finish("stop", "\n\n", Usage(3, 2), events[-1].engine)
