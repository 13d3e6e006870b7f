"""One answer in Anthropic's shapes: the whole message, or its server-sent
events in Anthropic's order (message_start; per content block
content_block_start, its deltas, content_block_stop; message_delta with
the stop reason and usage; message_stop; an `error` event when generation
fails). Both read the answer through one AnswerReader, so the events add up
to the whole message."""

from __future__ import annotations

import json
import uuid

from llmctl.runtime.engine.events import ErrorEvent, TokenEvent, Usage
from llmctl.runtime.formats.call_stream import arguments_object
from llmctl.server import errors
from llmctl.server.answer_reader import (
    AnswerEvent,
    AnswerReader,
    Finish,
    TextDelta,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCallStart,
    fold,
    stop_details,
)
from llmctl.server.generation import Answer, Event

PING = 'event: ping\ndata: {"type": "ping"}\n\n'


def sse(obj: dict) -> str:
    """One event: its type as the SSE event name, the object as its data."""
    return f"event: {obj['type']}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"


def usage_dict(usage: Usage) -> dict:
    """`usage` in Anthropic's terms: what the prefix cache held is
    cache_read_input_tokens and the rest input_tokens, so the three input
    counts add up to the prompt. llmctl keeps a prompt's KV without being
    asked and at no cost, so nothing counts as cache creation."""
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens,
            "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": usage.cached_tokens}


def stop_reason(finish: Finish) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished answer: a call the output
    stopped inside stops for what stopped it."""
    if finish.reason == "tool_calls":
        return "tool_use", None
    if finish.reason == "length":
        return "max_tokens", None
    if finish.stop:
        return "stop_sequence", finish.stop
    return "end_turn", None


def _tool_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


class MessageWriter:
    """The message (or its events) of one answer, read by `reader`.
    Thoughts become thinking blocks when `thinking` was asked for, and are
    left out otherwise."""

    def __init__(self, model: str, reader: AnswerReader, thinking: bool, n_prompt: int):
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model, self.reader, self.thinking, self.n_prompt = model, reader, thinking, n_prompt
        self._index = -1                    # the latest block's index
        self._open: str | None = None       # the type of the block still open

    def _message(self, content: list[dict], reason: str | None, stop: str | None,
                 usage: dict, details: dict | None = None) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "content": content,
                "model": self.model, "stop_reason": reason, "stop_sequence": stop,
                **(details or {}), "usage": usage}

    # ---- the whole message --------------------------------------------------

    def body(self, answers: list[Answer]) -> dict:
        """The whole message of the (one) answer."""
        answer = answers[0]
        folded = fold(self.reader.whole(answer.pieces or (answer.text,), answer.finish))
        assert folded.finish is not None
        content: list[dict] = []
        if self.thinking and folded.thinking:
            content.append({"type": "thinking", "thinking": folded.thinking, "signature": ""})
        if folded.content:
            content.append({"type": "text", "text": folded.content})
        for call in folded.calls:
            content.append({"type": "tool_use", "id": _tool_id(), "name": call.name,
                            "input": arguments_object(call.arguments)})
        reason, stop = stop_reason(folded.finish)
        return self._message(content, reason, stop, usage_dict(folded.finish.usage),
                             stop_details(folded.finish.reason))

    # ---- the stream ---------------------------------------------------------

    def opening(self) -> str:
        """message_start, before anything is generated."""
        usage = {"input_tokens": self.n_prompt, "output_tokens": 0,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        return sse({"type": "message_start", "message": self._message([], None, None, usage)})

    def frames(self, batch: list[tuple[int, Event]]) -> tuple[str, bool]:
        """The events for a batch of engine events, and whether the stream ends."""
        out: list[str] = []
        for _, event in batch:
            if isinstance(event, ErrorEvent):
                e = event.error
                status = errors.anthropic_status(e.http_status, e)
                out.append(sse(errors.anthropic_body(e.message, status)))
                return "".join(out), True
            if isinstance(event, TokenEvent):
                out += self._render(self.reader.feed(event.text))
                continue
            out += self._render(self.reader.finish(event))
            return "".join(out), True
        return "".join(out), False

    def _start(self, block: dict) -> list[str]:
        out = self._close()
        self._index += 1
        self._open = block["type"]
        return out + [sse({"type": "content_block_start", "index": self._index,
                           "content_block": block})]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        self._open = None
        return [sse({"type": "content_block_stop", "index": self._index})]

    def _delta(self, delta: dict) -> str:
        return sse({"type": "content_block_delta", "index": self._index, "delta": delta})

    def _render(self, events: list[AnswerEvent]) -> list[str]:
        out: list[str] = []
        for e in events:
            if isinstance(e, TextDelta):
                if self._open != "text":
                    out += self._start({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": e.text}))
            elif isinstance(e, ThinkingDelta) and self.thinking and e.text:
                if self._open != "thinking":
                    out += self._start({"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": e.text}))
            elif isinstance(e, ToolCallStart):
                out += self._start({"type": "tool_use", "id": _tool_id(), "name": e.name,
                                    "input": {}})
            elif isinstance(e, ToolArgumentsDelta):
                out.append(self._delta({"type": "input_json_delta", "partial_json": e.text}))
            elif isinstance(e, Finish):
                reason, stop = stop_reason(e)
                out += self._close()
                out.append(sse({"type": "message_delta",
                                "delta": {"stop_reason": reason, "stop_sequence": stop,
                                          **stop_details(e.reason)},
                                "usage": usage_dict(e.usage)}))
                out.append(sse({"type": "message_stop"}))
        return out
