"""An Anthropic message whose MCP tools the server runs, over rounds
(server/hosted_rounds.py): each call of a hosted tool is an mcp_tool_use
block (its input streamed as input_json_delta) followed, once it ran, by
an mcp_tool_result block; text, thinking and the client's own tool_use
blocks as in any message (frames.py). The blocks are kept as they are
sent, so the whole message is what its events add up to."""

from __future__ import annotations

import uuid

from llmctl.errors import LlmctlError
from llmctl.runtime.formats.call_stream import arguments_object
from llmctl.runtime.formats.tool_calls import ToolCall
from llmctl.server import errors
from llmctl.server.answer_reader import (
    AnswerEvent,
    Finish,
    TextDelta,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    stop_details,
)
from llmctl.server.anthropic.frames import sse, stop_reason, usage_dict
from llmctl.server.hosted_tools import HostedTools
from llmctl.tools.agent import Route
from llmctl.tools.mcp_hub import McpOutcome


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class McpMessage:
    """The message's events over every round, and the whole message."""

    def __init__(self, model: str, hosted: HostedTools, thinking: bool, n_prompt: int):
        self.id = _id("msg")
        self.model, self.hosted, self.thinking, self.n_prompt = model, hosted, thinking, n_prompt
        self.content: list[dict] = []
        self._open: dict | None = None          # the block still open
        self._uses: dict[str, dict] = {}        # call id -> its mcp_tool_use block
        self._message: dict | None = None

    def _shape(self, reason: str | None, stop: str | None, usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "content": self.content,
                "model": self.model, "stop_reason": reason, "stop_sequence": stop,
                "usage": usage}

    def opening(self) -> str:
        usage = {"input_tokens": self.n_prompt, "output_tokens": 0,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        start = {**self._shape(None, None, usage), "content": []}
        return sse({"type": "message_start", "message": start})

    def listed(self) -> str:
        return ""

    def _start(self, block: dict) -> str:
        out = self._close()
        self.content.append(block)
        self._open = block
        shown = {**block, **({"input": {}} if "input" in block else {})}
        return out + sse({"type": "content_block_start", "index": len(self.content) - 1,
                          "content_block": shown})

    def _close(self) -> str:
        if self._open is None:
            return ""
        self._open = None
        return sse({"type": "content_block_stop", "index": len(self.content) - 1})

    def _delta(self, delta: dict) -> str:
        return sse({"type": "content_block_delta", "index": len(self.content) - 1,
                    "delta": delta})

    def push(self, events: list[AnswerEvent]) -> str:
        out = ""
        for e in events:
            if isinstance(e, TextDelta) and e.text:
                if self._open is None or self._open["type"] != "text":
                    out += self._start({"type": "text", "text": ""})
                assert self._open is not None
                self._open["text"] += e.text
                out += self._delta({"type": "text_delta", "text": e.text})
            elif isinstance(e, ThinkingDelta) and self.thinking and e.text:
                if self._open is None or self._open["type"] != "thinking":
                    out += self._start({"type": "thinking", "thinking": "", "signature": ""})
                assert self._open is not None
                self._open["thinking"] += e.text
                out += self._delta({"type": "thinking_delta", "thinking": e.text})
            elif isinstance(e, ToolCallStart):
                out += self._start(self._use(e))
            elif isinstance(e, ToolArgumentsDelta) and self._open is not None:
                out += self._delta({"type": "input_json_delta", "partial_json": e.text})
            elif isinstance(e, ToolCallEnd) and self._open is not None \
                    and self._open["type"] in ("tool_use", "mcp_tool_use"):
                self._open["input"] = arguments_object(e.call.arguments)
                out += self._close()
        return out

    def _use(self, e: ToolCallStart) -> dict:
        route = self.hosted.route(e.name)
        if route is None:
            return {"type": "tool_use", "id": _id("toolu"), "name": e.name, "input": {}}
        block = {"type": "mcp_tool_use", "id": _id("mcptoolu"), "name": route.tool.name,
                 "server_name": route.tool.server, "input": {}}
        self._uses[e.id] = block
        return block

    def ran(self, call: ToolCall, route: Route, outcome: McpOutcome) -> str:
        out = self._close()
        use = self._uses.pop(call.id, None)
        if use is None:
            out += self._start({"type": "mcp_tool_use", "id": _id("mcptoolu"),
                                "name": route.tool.name, "server_name": route.tool.server,
                                "input": arguments_object(call.arguments)}) + self._close()
            use = self.content[-1]
        result = {"type": "mcp_tool_result", "tool_use_id": use["id"],
                  "is_error": outcome.is_error,
                  "content": [{"type": "text", "text": outcome.text}]}
        return out + self._start(result) + self._close()

    def asked(self, call: ToolCall, route: Route) -> str:
        # Anthropic's MCP connector runs every call (ask_by_default is off).
        raise AssertionError("an Anthropic request never waits for approval")

    def finish(self, finish: Finish, added: list[dict]) -> str:
        reason, stop = stop_reason(finish)
        if reason == "tool_use" and not any(b["type"] == "tool_use" for b in self.content):
            reason = "end_turn"         # only hosted calls: nothing for the client to run
        usage = usage_dict(finish.usage)
        details = stop_details(finish.reason)
        self._message = self._shape(reason, stop, usage) | details
        return self._close() + sse({"type": "message_delta",
                                    "delta": {"stop_reason": reason, "stop_sequence": stop,
                                              **details},
                                    "usage": usage}) + sse({"type": "message_stop"})

    def failed(self, error: LlmctlError) -> str:
        status = errors.anthropic_status(error.http_status, error)
        return sse(errors.anthropic_body(error.message, status))

    def body(self) -> dict:
        assert self._message is not None
        return self._message
