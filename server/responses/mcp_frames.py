"""A Responses API response whose MCP tools the server runs, over rounds
(server/hosted_rounds.py): its mcp_list_tools items, each call of a
hosted tool as an mcp_call item (its arguments streamed, its output once
it ran) or, where the request asks for approval, an mcp_approval_request
item that ends the response; the rest as in any response (frames.py)."""

from __future__ import annotations

from llmctl.errors import LlmctlError
from llmctl.runtime.formats.tool_calls import ToolCall
from llmctl.server.answer_reader import (
    AnswerEvent,
    Finish,
    ToolArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    stop_details,
)
from llmctl.server.hosted_tools import HostedTools
from llmctl.server.responses.frames import OnFinal, OutputItems, ResponseObject, Sequenced
from llmctl.server.responses.mcp_request import item_id
from llmctl.server.responses.store import new_id
from llmctl.tools.agent import Route
from llmctl.tools.mcp_hub import McpOutcome


class McpReply(Sequenced):
    """The response's events over every round, and the whole object."""

    def __init__(self, obj: ResponseObject, items: OutputItems, hosted: HostedTools,
                 on_final: OnFinal):
        self.obj, self.items, self.hosted, self.on_final = obj, items, hosted, on_final
        self._calls: dict[int, dict | None] = {}   # this round's hosted calls by index
        self._by_id: dict[str, dict] = {}           # mcp_call items waiting for their output
        self._final: dict | None = None

    def _add(self, item: dict) -> tuple[dict, int]:
        self.items.items.append(item)
        return item, len(self.items.items) - 1

    def _whole(self, item: dict) -> list[dict]:
        _, index = self._add(item)
        return [{"type": "response.output_item.added", "output_index": index, "item": item},
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def opening(self) -> str:
        """response.created and response.in_progress."""
        start = self.obj.shape("in_progress", [])
        return self._sse([{"type": "response.created", "response": start},
                          {"type": "response.in_progress", "response": start}])

    def listed(self) -> str:
        events = []
        for label, tools in self.hosted.listed.items():
            item, index = self._add({"type": "mcp_list_tools", "id": new_id("mcpl"),
                                     "server_label": label, "tools": [], "error": None})
            where = {"item_id": item["id"], "output_index": index}
            events += [{"type": "response.output_item.added", "output_index": index,
                        "item": dict(item)},
                       {"type": "response.mcp_list_tools.in_progress", **where}]
            item["tools"] = [t.as_dict() for t in tools]
            events += [{"type": "response.mcp_list_tools.completed", **where},
                       {"type": "response.output_item.done", "output_index": index, "item": item}]
        return self._sse(events)

    def push(self, events: list[AnswerEvent]) -> str:
        out: list[dict] = []
        for e in events:
            if isinstance(e, ToolCallStart) and (route := self.hosted.route(e.name)) is not None:
                out += self.items.close()
                self._calls[e.index] = None if self.hosted.needs_approval(route) else \
                    self._open_call(e, route, out)
            elif isinstance(e, (ToolArgumentsDelta, ToolCallEnd)) and e.index in self._calls:
                out += self._call_event(e)
            else:
                out += self.items.push(e)
        return self._sse(out)

    def _open_call(self, e: ToolCallStart, route: Route, out: list[dict]) -> dict:
        item, index = self._add({"type": "mcp_call", "id": item_id("mcp", e.id),
                                 "server_label": route.tool.server, "name": route.tool.name,
                                 "arguments": "", "output": None, "error": None,
                                 "status": "in_progress"})
        self._by_id[e.id] = item
        out.append({"type": "response.output_item.added", "output_index": index,
                    "item": dict(item)})
        return item

    def _call_event(self, e: ToolArgumentsDelta | ToolCallEnd) -> list[dict]:
        item = self._calls[e.index]
        if item is None:            # waits for approval: sent whole by asked()
            return []
        where = {"item_id": item["id"], "output_index": self.items.items.index(item)}
        if isinstance(e, ToolArgumentsDelta):
            item["arguments"] += e.text
            return [{"type": "response.mcp_call_arguments.delta", **where, "delta": e.text}]
        item["arguments"] = e.call.arguments or item["arguments"]
        return [{"type": "response.mcp_call_arguments.done", **where,
                 "arguments": item["arguments"]},
                {"type": "response.mcp_call.in_progress", **where}]

    def ran(self, call: ToolCall, route: Route, outcome: McpOutcome) -> str:
        events: list[dict] = []
        item = self._by_id.pop(call.id, None)
        if item is None:            # approved in this request: it was not streamed
            item, _ = self._add({"type": "mcp_call", "id": item_id("mcp", call.id),
                                 "server_label": route.tool.server, "name": route.tool.name,
                                 "arguments": call.arguments or "{}", "output": None,
                                 "error": None, "status": "in_progress"})
            events.append({"type": "response.output_item.added",
                           "output_index": self.items.items.index(item), "item": dict(item)})
        index = self.items.items.index(item)
        if outcome.is_error:
            item.update(status="failed", error={"type": "mcp_tool_execution_error",
                                                "content": [{"type": "text",
                                                             "text": outcome.text}]})
        else:
            item.update(status="completed", output=outcome.text)
        kind = "failed" if outcome.is_error else "completed"
        events += [{"type": f"response.mcp_call.{kind}", "item_id": item["id"],
                    "output_index": index},
                   {"type": "response.output_item.done", "output_index": index, "item": item}]
        self._calls.clear()
        return self._sse(events)

    def asked(self, call: ToolCall, route: Route) -> str:
        self._calls.clear()
        return self._sse(self._whole({"type": "mcp_approval_request",
                                      "id": item_id("mcpr", call.id),
                                      "server_label": route.tool.server, "name": route.tool.name,
                                      "arguments": call.arguments or "{}"}))

    def finish(self, finish: Finish, added: list[dict]) -> str:
        status = "incomplete" if finish.reason == "length" else "completed"
        events = self.items.close(status)
        self._final = self.obj.shape(status, self.items.items, finish.usage,
                                     reasoning_tokens=finish.reasoning_tokens) \
            | stop_details(finish.reason)
        self.on_final(self._final, added)
        return self._sse(events + [{"type": f"response.{status}", "response": self._final}])

    def failed(self, error: LlmctlError) -> str:
        return self._sse([{"type": "error", "code": error.code, "message": error.message,
                           "param": error.param},
                          {"type": "response.failed", "response": self.obj.shape(
                              "failed", self.items.items,
                              error={"code": "server_error", "message": error.message})}])

    def body(self) -> dict:
        assert self._final is not None
        return self._final
