"""One answer in Anthropic's shapes: the whole message, or its server-sent
events in Anthropic's order (message_start; per content block
content_block_start, its deltas, content_block_stop; message_delta with
the stop reason and usage; message_stop; an `error` event when generation
fails). Both read the answer through one ChatShaper, so the events add up
to the whole message."""

from __future__ import annotations

import json
import uuid

from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, TokenEvent, Usage
from llmctl.runtime.formats.call_stream import arguments_object
from llmctl.server import errors
from llmctl.server.chat_output import ChatShaper
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


def stop_reason(shaper: ChatShaper, finish: FinishEvent) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished answer: a call the output
    stopped inside stops for what stopped it."""
    if shaper.n_calls and not shaper.cut:
        return "tool_use", None
    if finish.reason == "length":
        return "max_tokens", None
    if finish.reason == "stop" and finish.stop:
        return "stop_sequence", finish.stop
    return "end_turn", None


def _tool_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


class MessageWriter:
    """The message (or its events) of one answer, its text read by
    `shaper`. Thoughts become thinking blocks when `thinking` was asked
    for, and are left out otherwise."""

    def __init__(self, model: str, shaper: ChatShaper, thinking: bool, n_prompt: int):
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model, self.shaper, self.thinking, self.n_prompt = model, shaper, thinking, n_prompt
        self._index = -1                    # the latest block's index
        self._open: str | None = None       # the type of the block still open

    def _message(self, content: list[dict], reason: str | None, stop: str | None,
                 usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "content": content,
                "model": self.model, "stop_reason": reason, "stop_sequence": stop,
                "usage": usage}

    # ---- the whole message --------------------------------------------------

    def body(self, answers: list[Answer]) -> dict:
        """The whole message of the (one) answer."""
        answer = answers[0]
        message = self.shaper.message(answer.text)
        content: list[dict] = []
        if self.thinking and message.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": message["reasoning_content"],
                            "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls", ()):
            fn = call["function"]
            content.append({"type": "tool_use", "id": _tool_id(), "name": fn["name"],
                            "input": arguments_object(fn["arguments"])})
        reason, stop = stop_reason(self.shaper, answer.finish)
        return self._message(content, reason, stop, usage_dict(answer.finish.usage))

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
                out += self._deltas(self.shaper.feed(event.text))
                continue
            out += self._deltas(self.shaper.finish(event.tail))
            out += self._close()
            reason, stop = stop_reason(self.shaper, event)
            out.append(sse({"type": "message_delta",
                            "delta": {"stop_reason": reason, "stop_sequence": stop},
                            "usage": usage_dict(event.usage)}))
            out.append(sse({"type": "message_stop"}))
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

    def _deltas(self, deltas: list[dict]) -> list[str]:
        out: list[str] = []
        for d in deltas:
            if d.get("content"):
                if self._open != "text":
                    out += self._start({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": d["content"]}))
            elif d.get("reasoning_content") and self.thinking:
                if self._open != "thinking":
                    out += self._start({"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta",
                                        "thinking": d["reasoning_content"]}))
            for call in d.get("tool_calls", ()):
                out += self._call(call)
        return out

    def _call(self, call: dict) -> list[str]:
        fn = call["function"]
        out: list[str] = []
        if "id" in call:            # a call's head: a new tool_use block
            out += self._start({"type": "tool_use", "id": _tool_id(), "name": fn["name"],
                                "input": {}})
        if fn.get("arguments"):
            out.append(self._delta({"type": "input_json_delta",
                                    "partial_json": fn["arguments"]}))
        return out
