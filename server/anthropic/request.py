"""Anthropic's request body, validated and translated: sampling fields into
SamplingParams, `tools`/`tool_choice`/`output_config.format` into a
Structured (the path OpenAI's tools and response_format take, so a named
tool is enforced by the grammar), `system` and `messages` into the
template's messages (content.py). Every mistake is an InvalidParams naming
Anthropic's field; what llmctl cannot honour is refused by name, and what it
accepts without applying is listed in `ignored` (a response header)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmctl.errors import InvalidParams
from llmctl.runtime.sampling import MAX_STOPS, SamplingParams
from llmctl.server.anthropic.content import chat_messages, keep_thinking, system_messages
from llmctl.server.anthropic.mcp_request import mcp_asks
from llmctl.server.fields import ThinkingAsk, parse_sampling, typed_field
from llmctl.server.hosted_tools import ServerAsk
from llmctl.server.tool_protocol import Structured, parse_structured
from llmctl.tools.mcp_hub import McpHub

# Fields that change nothing here: billing, routing and cache hints (the
# prefix cache needs no breakpoints), accepted as Anthropic's API takes them.
_ACCEPTED = ("metadata", "cache_control", "service_tier", "speed", "inference_geo",
             "user_profile_id", "workspace_id", "diagnostics")
# Fields that ask for something llmctl does not do.
_REFUSED = {
    "container": "code-execution containers are not supported by llmctl",
}
_KNOWN = ("model", "max_tokens", "messages", "system", "tools", "tool_choice", "output_config",
          "output_format", "stop_sequences", "temperature", "top_p", "top_k", "stream",
          "thinking", "context_management", "mcp_servers", *_ACCEPTED, *_REFUSED)
_EFFORTS = ("low", "medium", "high", "xhigh", "max")
_THINKING_TYPES = ("enabled", "disabled", "adaptive")
# The tool fields llmctl reads or needs not read (the grammar always
# holds a call to its schema, so `strict` is always honoured).
_TOOL_FIELDS = ("name", "description", "input_schema", "type", "cache_control", "strict")


@dataclass(frozen=True)
class MessagesRequest:
    """A validated /v1/messages (or count_tokens) body."""

    model: str | None
    stream: bool
    params: SamplingParams
    structured: Structured
    messages: list[dict]            # for the template; LLM.chat_tokens validates the rest
    thinking: bool                  # thinking blocks asked for (a thought turned on)
    ignored: list[str] = field(default_factory=list)   # accepted, not applied
    think: ThinkingAsk = ThinkingAsk()  # thinking and effort, for the template
    mcp: tuple[ServerAsk, ...] = ()     # the MCP servers the server runs for it
    mcp_choice: str | None = None       # tool_choice for the MCP tools (HostedTools.merged)


def parse_messages(body: dict, count_only: bool, defaults: SamplingParams,
                   hub: McpHub | None = None) -> MessagesRequest:
    """Validate a Messages body; `count_only` (count_tokens) does not need
    max_tokens; `mcp_servers` name the servers of `hub`. Raises
    InvalidParams naming the field."""
    ignored: list[str] = []
    for key in body:
        if key in _REFUSED and body[key] is not None:
            raise InvalidParams(f"'{key}': {_REFUSED[key]}", param=key)
        if key not in _KNOWN:
            ignored.append(_shown(key))
    model = typed_field(body, "model", (str,))
    if not model and not count_only:
        raise InvalidParams("'model' is required", param="model")
    max_tokens = typed_field(body, "max_tokens", (int,))
    if max_tokens is None and not count_only:
        raise InvalidParams("'max_tokens' is required", param="max_tokens")
    effort, fmt = _output_config(body)
    asks = mcp_asks(body, hub)
    think = _thinking(body.get("thinking"), effort, ignored)
    edits = _edits(body.get("context_management"), ignored)
    messages = system_messages(body.get("system")) + chat_messages(body.get("messages"),
                                                                   keep_thinking(edits))
    return MessagesRequest(model or None, bool(typed_field(body, "stream", (bool,))),
                           _sampling(body, defaults, None if count_only else max_tokens),
                           _structured(body, fmt, ignored, asks), messages, think.on is True,
                           ignored, think, asks, _mcp_choice(body, asks))


def _shown(key: str) -> str:
    # A name from the client goes back in a header: keep it short and plain.
    key = "".join(c for c in key if c.isascii() and c.isprintable() and c not in ",;")
    return key if len(key) <= 64 else key[:64] + "..."


def _sampling(body: dict, defaults: SamplingParams, max_tokens: int | None) -> SamplingParams:
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise InvalidParams("'stop_sequences' must be a list of strings",
                                param="stop_sequences")
        if len(stops) > MAX_STOPS:
            raise InvalidParams(f"'stop_sequences' may hold at most {MAX_STOPS} strings",
                                param="stop_sequences")
    fields = {k: body.get(k) for k in ("temperature", "top_p", "top_k")}
    fields |= {"max_tokens": max_tokens, "stop": stops}
    return parse_sampling(fields, defaults)


def _thinking(value: Any, effort: str | None, ignored: list[str]) -> ThinkingAsk:
    """The thought asked for: `thinking` enabled or adaptive turns it on,
    disabled off; an `effort` (each of Anthropic's thinks) turns it on
    unless thinking is disabled. The fields that ask for a thought go in
    `ignored` (routes take them out where the template thinks); adaptive
    asks for none, as a model may answer it without one. budget_tokens is
    checked but not applied: llmctl does not bound how long a model thinks."""
    if value is None:
        on: bool | None = None
    elif not isinstance(value, dict) or value.get("type") not in _THINKING_TYPES:
        raise InvalidParams("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N}, "
                            "{\"type\": \"adaptive\"} or {\"type\": \"disabled\"}",
                            param="thinking")
    else:
        on = value["type"] != "disabled"
    fields: tuple[str, ...] = ()
    if value is not None and value["type"] == "enabled":
        budget = value.get("budget_tokens")
        if type(budget) is not int or budget < 1:
            raise InvalidParams("'thinking.budget_tokens' must be a positive integer",
                                param="thinking")
        fields = ("thinking",)
        ignored += ["thinking", "thinking.budget_tokens"]
    if effort is not None:
        # With thinking disabled there is no thought for the effort to shape.
        fields += ("output_config.effort",) if on is not False else ()
        on = on is not False
        ignored.append("output_config.effort")
    return ThinkingAsk(on, fields)


def _output_config(body: dict) -> tuple[str | None, dict | None]:
    """(effort, the JSON schema of format) of output_config; the beta's
    top-level output_format is read as its format."""
    config = typed_field(body, "output_config", (dict,)) or {}
    effort = config.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise InvalidParams(f"'output_config.effort' must be one of {', '.join(_EFFORTS)}",
                            param="output_config")
    fmt = config.get("format")
    if fmt is None:
        fmt = typed_field(body, "output_format", (dict,))
    if fmt is None:
        return effort, None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" \
            or not isinstance(fmt.get("schema"), dict):
        raise InvalidParams("'output_config.format' must be {\"type\": \"json_schema\", "
                            "\"schema\": {...}}", param="output_config")
    return effort, fmt["schema"]


def _edits(value: Any, ignored: list[str]) -> list[dict]:
    """context_management's edits; those other than clear_thinking are
    named in `ignored` (llmctl does not trim tool results)."""
    if value is None:
        return []
    edits = value.get("edits", []) if isinstance(value, dict) else None
    if not isinstance(edits, list) or not all(isinstance(e, dict)
                                              and isinstance(e.get("type"), str) for e in edits):
        raise InvalidParams("'context_management.edits' must be a list of objects with a "
                            "'type'", param="context_management")
    for i, edit in enumerate(edits):
        if not edit["type"].startswith("clear_thinking"):
            ignored.append(f"context_management.edits[{i}].type={_shown(edit['type'])}")
    return edits


def _tools(raw: Any, ignored: list[str]) -> list[dict] | None:
    """Anthropic's tools as OpenAI function tools. Tools without a type
    (or "custom") are the client's; a typed one is a server tool
    (web_search_..., bash_..., text_editor_...), which llmctl cannot run."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidParams("'tools' must be a list", param="tools")
    out, extra = [], set()
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise InvalidParams(f"tools[{i}] must be an object", param="tools")
        kind = tool.get("type")
        if kind == "mcp_toolset":       # the servers' tools (mcp_request.py)
            continue
        if kind not in (None, "custom"):
            shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
            raise InvalidParams(f"tools[{i}].type {shown!r}: server tools are not supported "
                                "by llmctl; define the tool with a name and an input_schema",
                                param="tools")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise InvalidParams(f"tools[{i}].input_schema must be a JSON schema object",
                                param="tools")
        fn = {"name": tool.get("name"), "parameters": schema}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
        extra |= {k for k in tool if k not in _TOOL_FIELDS}
    ignored += [f"tools[].{_shown(k)}" for k in sorted(extra)]
    return out


def _choice(raw: Any, tools: list[dict] | None) -> tuple[str | dict | None, bool]:
    """Anthropic's tool_choice as OpenAI's, and whether parallel calls are allowed."""
    if raw is None:
        return None, True
    kinds = ("auto", "any", "tool", "none")
    if not isinstance(raw, dict) or raw.get("type") not in kinds:
        raise InvalidParams("'tool_choice.type' must be one of auto, any, tool, none",
                            param="tool_choice")
    disable = raw.get("disable_parallel_tool_use")
    if disable not in (None, True, False):
        raise InvalidParams("'tool_choice.disable_parallel_tool_use' must be a boolean",
                            param="tool_choice")
    kind = raw["type"]
    if kind == "tool":
        if not isinstance(raw.get("name"), str):
            raise InvalidParams("'tool_choice.name' must name a tool", param="tool_choice")
        choice: str | dict | None = {"type": "function", "function": {"name": raw["name"]}}
    else:
        choice = {"any": "required"}.get(kind, kind)
        if kind == "any" and not tools:
            raise InvalidParams("tool_choice 'any' needs tools", param="tool_choice")
    return choice, not disable


def _mcp_choice(body: dict, asks: tuple[ServerAsk, ...]) -> str | None:
    """What tool_choice asks of the MCP tools (HostedTools.merged): "any"
    held back from the checks where they are the only tools."""
    raw = body.get("tool_choice")
    if raw is None:
        return None
    own = [t for t in body.get("tools") or [] if isinstance(t, dict)
           and t.get("type") != "mcp_toolset"]
    forced = asks and not own and isinstance(raw, dict) and raw.get("type") == "any"
    return "required" if forced else "keep"


def _structured(body: dict, schema: dict | None, ignored: list[str],
                asks: tuple[ServerAsk, ...] = ()) -> Structured:
    tools = _tools(body.get("tools"), ignored)
    raw = body.get("tool_choice")
    held = _mcp_choice(body, asks) == "required"
    choice, parallel = _choice(None if held else raw, tools)
    if held and isinstance(raw, dict):
        parallel = raw.get("disable_parallel_tool_use") is not True
    fmt = None if schema is None else {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": schema}}
    try:
        return parse_structured({"tools": tools, "tool_choice": choice,
                                 "parallel_tool_calls": parallel, "response_format": fmt},
                                chat=True)
    except InvalidParams as e:
        if e.param != "response_format":
            raise
        raise InvalidParams(e.message.replace("'response_format'", "'output_config.format'")
                            .replace("response_format", "output_config.format"),
                            param="output_config") from None
