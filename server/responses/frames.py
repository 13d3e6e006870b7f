"""One Responses API response: the response object, and the typed events
of its stream, each with its sequence_number. The answer's events (an
AnswerReader's: text, thoughts, tool calls) go through OutputItems, which
opens and closes the output items (reasoning, message, function_call) as
the text turns from one to the next, so a whole body is exactly what its
stream adds up to."""

from __future__ import annotations

import json
import time
from typing import Callable

from llmctl.runtime.engine.events import ErrorEvent, TokenEvent, Usage
from llmctl.server.answer_reader import (
    AnswerEvent,
    AnswerReader,
    Finish,
    TextDelta,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCallStart,
    stop_details,
)
from llmctl.server.generation import Answer, Event
from llmctl.server.responses.store import new_id

Sealer = Callable[[str], str]


class OutputItems:
    """The output items of one answer, from its AnswerEvents. push()
    and close() return the events they add; `items` are the closed ones.
    `namespaces` maps a flattened tool name back to (namespace, function);
    `seal`, when given, seals each thought into encrypted_content."""

    def __init__(self, namespaces: dict[str, tuple[str, str]], seal: Sealer | None):
        self.namespaces, self.seal = namespaces, seal
        self.items: list[dict] = []
        self._open: dict | None = None
        self._text: list[str] = []

    def push(self, event: AnswerEvent) -> list[dict]:
        """The events for one answer event (Finish is `close`'s)."""
        if isinstance(event, TextDelta):
            return self._append("message", event.text)
        if isinstance(event, ThinkingDelta):
            return self._append("reasoning", event.text)
        if isinstance(event, ToolCallStart):    # a new call: its head, then its arguments
            return self.close() + self._open_call(event)
        if isinstance(event, ToolArgumentsDelta):
            return self._append("function_call", event.text)
        return []

    def _where(self) -> dict:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.items)}

    def _append(self, kind: str, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open["type"] != kind:
            events += self.close() + self._open_item(kind)
        if not text:
            return events
        self._text.append(text)
        if kind == "function_call":
            return events + [{"type": "response.function_call_arguments.delta",
                              **self._where(), "delta": text}]
        name = "output_text" if kind == "message" else "reasoning_text"
        extra: dict = {"logprobs": []} if kind == "message" else {}
        return events + [{"type": f"response.{name}.delta", **self._where(), "content_index": 0,
                          "delta": text, **extra}]

    def _open_item(self, kind: str) -> list[dict]:
        if kind == "message":
            self._open = {"type": "message", "id": new_id("msg"), "status": "in_progress",
                          "role": "assistant", "content": []}
            part: dict = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            self._open = {"type": "reasoning", "id": new_id("rs"), "status": "in_progress",
                          "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        return [{"type": "response.output_item.added", "output_index": len(self.items),
                 "item": dict(self._open)},
                {"type": "response.content_part.added", **self._where(), "content_index": 0,
                 "part": part}]

    def _open_call(self, head: ToolCallStart) -> list[dict]:
        flat = head.name
        namespace, name = self.namespaces.get(flat, (None, flat))
        self._open = {"type": "function_call", "id": new_id("fc"), "call_id": head.id,
                      "name": name, "arguments": "", "status": "in_progress",
                      **({"namespace": namespace} if namespace else {})}
        return [{"type": "response.output_item.added", "output_index": len(self.items),
                 "item": dict(self._open)}]

    def close(self, status: str = "completed") -> list[dict]:
        """The events that end the open item (none when nothing is open)."""
        item, text = self._open, "".join(self._text)
        if item is None:
            return []
        where = self._where()
        self._open, self._text = None, []
        item["status"] = status
        events: list[dict] = []
        if item["type"] == "function_call":
            item["arguments"] = text
            events.append({"type": "response.function_call_arguments.done", **where,
                           "name": item["name"], "arguments": text})
        else:
            if item["type"] == "message":
                part: dict = {"type": "output_text", "text": text, "annotations": [],
                              "logprobs": []}
                done = {"type": "response.output_text.done", "text": text, "logprobs": []}
            else:
                part = {"type": "reasoning_text", "text": text}
                done = {"type": "response.reasoning_text.done", "text": text}
                if self.seal is not None:
                    item["encrypted_content"] = self.seal(text)
            item["content"] = [part]
            events += [{**done, **where, "content_index": 0},
                       {"type": "response.content_part.done", **where, "content_index": 0,
                        "part": part}]
        self.items.append(item)
        return events + [{"type": "response.output_item.done",
                          "output_index": where["output_index"], "item": item}]

    def assistant_message(self) -> dict:
        """The closed items as one chat assistant message (flattened tool
        names), for the conversation a continuation renders."""
        text = "".join(p["text"] for i in self.items if i["type"] == "message"
                       for p in i["content"])
        calls = [{"id": i["call_id"], "type": "function",
                  "function": {"name": _flat(i), "arguments": i["arguments"]}}
                 for i in self.items if i["type"] == "function_call"]
        message: dict = {"role": "assistant", "content": text or (None if calls else "")}
        thought = "".join(p["text"] for i in self.items if i["type"] == "reasoning"
                          for p in i["content"])
        if thought:     # a continuation shows it where the template reads past thoughts
            message["reasoning_content"] = thought
        if calls:
            message["tool_calls"] = calls
        return message


def _flat(item: dict) -> str:
    namespace = item.get("namespace")
    return f"{namespace}__{item['name']}" if namespace else item["name"]


def usage_dict(usage: Usage, reasoning_tokens: int = 0) -> dict:
    """`usage` in the Responses API's shape; `reasoning_tokens` of the
    output went to the thought."""
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens,
                                     "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens,
                                                              usage.completion_tokens)},
            "total_tokens": usage.total_tokens}


class ResponseObject:
    """The fields of one response object that do not change as it runs."""

    def __init__(self, model: str, echo: dict):
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.model, self.echo = model, echo

    def shape(self, status: str, output: list[dict], usage: Usage | None = None,
              error: dict | None = None, reasoning_tokens: int = 0) -> dict:
        """The object with `status`, `output` and (once known) `usage`, of
        which `reasoning_tokens` went to the thought."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "error": error, "incomplete_details": incomplete,
                "model": self.model, "output": output, **self.echo,
                "usage": usage_dict(usage, reasoning_tokens) if usage is not None else None,
                **({"completed_at": int(time.time())} if status == "completed" else {})}


OnFinal = Callable[[dict, list[dict]], None]


class Sequenced:
    """Events as SSE, each with its sequence_number."""

    _seq = 0

    def _sse(self, events: list[dict]) -> str:
        out = []
        for event in events:
            event = {**event, "sequence_number": self._seq}
            self._seq += 1
            out.append(f"event: {event['type']}\ndata: "
                       f"{json.dumps(event, ensure_ascii=False)}\n\n")
        return "".join(out)


class Reply(Sequenced):
    """A response's frames (server/generation.py's Frames): its events as
    SSE, or the whole object. `on_final(response, messages)` runs once the
    answer has ended, failed responses aside, with the messages the
    response adds to the conversation."""

    def __init__(self, obj: ResponseObject, reader: AnswerReader, items: OutputItems,
                 on_final: OnFinal):
        self.obj, self.reader, self.items, self.on_final = obj, reader, items, on_final

    def opening(self) -> str:
        """response.created and response.in_progress."""
        start = self.obj.shape("in_progress", [])
        return self._sse([{"type": "response.created", "response": start},
                          {"type": "response.in_progress", "response": start}])

    def frames(self, batch: list[tuple[int, Event]]) -> tuple[str, bool]:
        """The events for a batch of engine events, and whether they end the stream."""
        events: list[dict] = []
        for _, event in batch:
            if isinstance(event, ErrorEvent):
                err = event.error
                events += [{"type": "error", "code": err.code, "message": err.message,
                            "param": err.param},
                           {"type": "response.failed", "response": self.obj.shape(
                               "failed", self.items.items,
                               error={"code": "server_error", "message": err.message})}]
                return self._sse(events), True
            if isinstance(event, TokenEvent):
                for answer_event in self.reader.feed(event.text):
                    events += self.items.push(answer_event)
                continue
            final = self._finish(self.reader.finish(event), events)
            return self._sse(events + [{"type": f"response.{final['status']}",
                                        "response": final}]), True
        return self._sse(events), False

    def _finish(self, ending: list[AnswerEvent], events: list[dict]) -> dict:
        """The events that end the answer (`ending`, Finish last) added to
        `events`, and the final response object."""
        for e in ending:
            events += self.items.push(e)
        finish = ending[-1]
        assert isinstance(finish, Finish)
        status = "incomplete" if finish.reason == "length" else "completed"
        events += self.items.close(status)
        final = self.obj.shape(status, self.items.items, finish.usage,
                               reasoning_tokens=finish.reasoning_tokens) | stop_details(finish.reason)
        self.on_final(final, [self.items.assistant_message()])
        return final

    def body(self, answers: list[Answer]) -> dict:
        """The whole response object for the one answer."""
        answer = answers[0]
        return self._finish(self.reader.whole(answer.pieces or (answer.text,), answer.finish),
                            [])
