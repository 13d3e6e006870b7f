"""A /v1/responses body, validated and translated: the conversation (the
stored one for previous_response_id, then `instructions` and `input`), the
tools in OpenAI chat's shape for server/tool_protocol.py (a namespace's
functions under their flattened names; hosted tools left out and named),
tool_choice, text.format, and the sampling fields. A field llmctl cannot
honour is refused by name, never dropped."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from llmctl.errors import InvalidParams
from llmctl.runtime.formats.tool_calls import ToolCall
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.fields import EFFORTS, ThinkingAsk, effort_thinking, parse_sampling, typed_field
from llmctl.server.hosted_rounds import Decision
from llmctl.server.hosted_tools import ServerAsk
from llmctl.server.responses.items import flat_name, input_messages
from llmctl.server.responses.mcp_request import call_id_of, mcp_ask
from llmctl.server.responses.store import ID_RE, ResponseStore, StoredResponse
from llmctl.server.tool_protocol import Structured, parse_structured
from llmctl.tools.mcp_hub import McpHub

# Tools that OpenAI runs on its side: llmctl cannot, so the model is not
# offered them and the response names them (Codex sends web_search always).
HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "file_search", "code_interpreter", "computer_use_preview", "computer_use", "computer",
    "image_generation", "tool_search"})
# include values for hosted tools' results: with the tools left out there is nothing to include.
_HOSTED_INCLUDES = frozenset({
    "web_search_call.action.sources", "web_search_call.results", "file_search_call.results",
    "code_interpreter_call.outputs", "computer_call_output.output.image_url",
    "message.input_image.image_url"})
SEALED_REASONING = "reasoning.encrypted_content"
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_FUNCTION_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
_NAMESPACE_KEYS = frozenset({"type", "name", "description", "tools"})
_SUMMARIES = (None, "auto", "concise", "detailed")


def _absent(v: Any) -> bool:
    return v is None


# Fields refused unless they ask for nothing, with the test for "nothing".
_REFUSED: dict[str, Callable[[Any], bool]] = {
    "background": lambda v: v in (None, False),
    "conversation": _absent,
    "prompt": _absent,
    "context_management": _absent,
    "truncation": lambda v: v in (None, "disabled"),
    "top_logprobs": lambda v: v in (None, 0),
}
# Fields read below, or accepted as they change nothing llmctl does.
_KNOWN = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
    "max_output_tokens", "temperature", "top_p", "stop", "seed", "reasoning", "metadata",
    "user", "prompt_cache_key", "client_metadata", "include", "store", "previous_response_id",
    "stream", "stream_options", "service_tier", "safety_identifier", "prompt_cache_retention",
    "keep_alive", "max_tool_calls", *_REFUSED})


@dataclass(frozen=True)
class Tools:
    """The request's callable tools in chat's shape, which function each
    flattened name stands for, the raw tools for the echo, and the hosted
    tools left out."""

    chat: list[dict]
    namespaces: dict[str, tuple[str, str]]     # flat name -> (namespace, function)
    hosted: tuple[str, ...]
    mcp: tuple[ServerAsk, ...] = ()            # the MCP servers the server runs for it


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated /v1/responses (or /v1/responses/input_tokens) body."""

    model: str | None
    stream: bool
    store: bool
    params: SamplingParams
    structured: Structured
    messages: list[dict]        # what the template renders: instructions first
    history: list[dict]         # the conversation so far, without instructions, for the store
    input_items: list[dict]     # as sent, each with an id
    tools: Tools
    sealed: bool                # reasoning items carry encrypted_content
    ignored: tuple[str, ...]    # fields accepted that change nothing here
    echo: dict                  # the request fields the response object repeats
    keep_alive: object = None
    think: ThinkingAsk = ThinkingAsk()  # reasoning.effort, for the template
    max_tool_calls: int | None = None   # MCP calls the server may run for it
    mcp_choice: str | None = None       # tool_choice for the MCP tools (HostedTools.merged)
    approvals: tuple[Decision, ...] = ()    # mcp_approval_response items, resolved


def _function(tool: dict, where: str, namespace: str | None) -> dict:
    extra = sorted(set(tool) - _FUNCTION_KEYS)
    if extra:
        raise InvalidParams(f"'{where}.{extra[0][:40]}' is not supported by llmctl", param="tools")
    name = tool.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(flat_name(namespace, name)):
        raise InvalidParams(f"'{where}.name' must match ^[a-zA-Z0-9_-]{{1,64}}$ (with its "
                            "namespace and '__' before it)", param="tools")
    if tool.get("strict") not in (None, True, False):
        raise InvalidParams(f"'{where}.strict' must be a boolean", param="tools")
    fn = {"name": flat_name(namespace, name)}
    fn.update({k: tool[k] for k in ("description", "parameters") if tool.get(k) is not None})
    return {"type": "function", "function": fn}


def parse_tools(value: Any, hub: McpHub | None = None) -> Tools:
    """The `tools` field; `mcp` tools name the servers of `hub`. Raises
    InvalidParams (param "tools") for a tool type llmctl cannot offer nor
    leave out, or a malformed tool."""
    if value is None:
        return Tools([], {}, ())
    if not isinstance(value, list):
        raise InvalidParams("'tools' must be a list", param="tools")
    chat, namespaces, hosted, mcp = [], {}, [], []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        kind = kind if isinstance(kind, str) else None
        if kind == "function":
            chat.append(_function(tool, f"tools[{i}]", None))
        elif kind == "namespace":
            extra = sorted(set(tool) - _NAMESPACE_KEYS)
            ns, inner = tool.get("name"), tool.get("tools")
            if extra or not isinstance(ns, str) or not isinstance(inner, list):
                raise InvalidParams(f"'tools[{i}]' must be a namespace with a 'name' and its "
                                    "function 'tools'", param="tools")
            for j, fn in enumerate(inner):
                if not isinstance(fn, dict) or fn.get("type") != "function":
                    raise InvalidParams(f"'tools[{i}].tools[{j}]' must be a function tool",
                                        param="tools")
                chat.append(_function(fn, f"tools[{i}].tools[{j}]", ns))
                namespaces[chat[-1]["function"]["name"]] = (ns, fn["name"])
        elif kind == "mcp":
            mcp.append(mcp_ask(tool, f"tools[{i}]", hub))
        elif kind in HOSTED_TOOLS:
            hosted.append(kind)
        else:
            what = repr(kind[:40]) if kind else "without a 'type'"
            raise InvalidParams(f"'tools[{i}]': tools of type {what} are not supported by llmctl",
                                param="tools")
    labels = [a.label for a in mcp]
    if len(set(labels)) < len(labels):
        raise InvalidParams("'tools' names an MCP server twice", param="tools")
    return Tools(chat, namespaces, tuple(dict.fromkeys(hosted)), tuple(mcp))


def _tool_choice(value: Any) -> Any:
    """tool_choice in chat's shape."""
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" \
            and isinstance(value.get("name"), str) \
            and isinstance(value.get("namespace"), (str, type(None))):
        return {"type": "function",
                "function": {"name": flat_name(value.get("namespace"), value["name"])}}
    raise InvalidParams('\'tool_choice\' must be "auto", "none", "required" or {"type": '
                        '"function", "name": ...}; other choices are not supported by llmctl',
                        param="tool_choice")


def _text_format(text: Any) -> tuple[dict | None, dict, tuple[str, ...]]:
    """(chat's response_format, the echo of `text`, ignored fields)."""
    if text is None:
        return None, {"format": {"type": "text"}}, ()
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise InvalidParams("'text' must be an object with 'format' (and 'verbosity')",
                            param="text")
    fmt = text.get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise InvalidParams("'text.format' must be an object", param="text")
    ignored = ("text.verbosity",) if text.get("verbosity") not in (None, "medium") else ()
    if fmt.get("type") != "json_schema":
        return fmt, {**text, "format": fmt}, ignored
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}, {**text, "format": fmt}, ignored


def _mcp_choice(body: dict, tools: Tools) -> str | None:
    """What tool_choice asks of the MCP tools: "required" held back from
    the checks where they are the only tools (they are listed later)."""
    if body.get("tool_choice") is None:
        return None
    return "required" if tools.mcp and not tools.chat and \
        body.get("tool_choice") == "required" else "keep"


def _structured(body: dict, tools: Tools, response_format: dict | None) -> Structured:
    choice = None if _mcp_choice(body, tools) == "required" else body.get("tool_choice")
    chat_body = {"tools": tools.chat, "tool_choice": _tool_choice(choice),
                 "parallel_tool_calls": body.get("parallel_tool_calls"),
                 "response_format": response_format}
    try:
        return parse_structured(chat_body, chat=True)
    except InvalidParams as e:
        # The checks are chat's; the client reads its own field names.
        param = "text" if e.param == "response_format" else e.param
        raise InvalidParams(e.message.replace("response_format", "text.format"),
                            param=param) from None


def _refuse_unknown(body: dict) -> None:
    for key in body:
        if key not in _KNOWN:
            raise InvalidParams(f"'{key[:64]}' is not a Responses field llmctl supports",
                                param=key[:64])
    for key, fine in _REFUSED.items():
        if not fine(body.get(key)):
            raise InvalidParams(f"'{key}' is not supported by llmctl", param=key)


def _include(body: dict) -> bool:
    include = body.get("include")
    if include is None:
        return False
    if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
        raise InvalidParams("'include' must be a list of strings", param="include")
    for value in include:
        if value != SEALED_REASONING and value not in _HOSTED_INCLUDES:
            raise InvalidParams(f"'include' value {value[:64]!r} is not supported by llmctl",
                                param="include")
    return SEALED_REASONING in include


def _reasoning(body: dict) -> tuple[dict, tuple[str, ...], ThinkingAsk]:
    """(the echo of `reasoning`, ignored fields, the thought asked for):
    effort none or minimal turns the model's thought off, the others on
    (named as ignored till the model's template is known to think).
    llmctl does not summarise a thought (it returns the thought itself),
    so a summary is named as ignored."""
    value = typed_field(body, "reasoning", (dict,)) or {}
    effort, summary = value.get("effort"), value.get("summary", value.get("generate_summary"))
    if effort not in (None, *EFFORTS) or summary not in _SUMMARIES or \
            set(value) - {"effort", "summary", "generate_summary"}:
        raise InvalidParams("'reasoning' must be {\"effort\": one of none, minimal, low, medium, "
                            "high, xhigh; \"summary\": auto, concise or detailed}",
                            param="reasoning")
    think = effort_thinking(effort, "reasoning.effort")
    ignored = think.fields + (("reasoning.summary",) if summary is not None else ())
    return {"effort": effort, "summary": summary}, ignored, think


def _previous(body: dict, store: ResponseStore) -> StoredResponse | None:
    rid = typed_field(body, "previous_response_id", (str,))
    if rid is None:
        return None
    found = store.get(rid) if ID_RE.fullmatch(rid) else None
    if found is None:
        raise InvalidParams(f"previous response with id {rid[:80]!r} not found",
                            param="previous_response_id")
    return found


def _sampling(body: dict, defaults: SamplingParams) -> SamplingParams:
    params = parse_sampling({k: body.get(k) for k in ("temperature", "top_p", "seed", "stop")},
                            defaults)
    max_out = typed_field(body, "max_output_tokens", (int,))
    if max_out is not None:
        if max_out < 1:
            raise InvalidParams("'max_output_tokens' must be at least 1",
                                param="max_output_tokens")
        params = params.replace(max_tokens=max_out)
    return params


def _max_tool_calls(body: dict) -> int | None:
    value = typed_field(body, "max_tool_calls", (int,))
    if value is not None and value < 1:
        raise InvalidParams("'max_tool_calls' must be at least 1", param="max_tool_calls")
    return value


def _approvals(conversation: Any, previous: StoredResponse | None) -> tuple[Decision, ...]:
    """The input's mcp_approval_response items, each with the call it
    answers: an mcp_approval_request item of this input or of the
    previous response's output."""
    asked = {i.get("id"): i for i in (previous.response.get("output", []) if previous else [])
             if isinstance(i, dict) and i.get("type") == "mcp_approval_request"}
    asked.update(conversation.asked)
    out = []
    for answer in conversation.approvals:
        rid = answer["approval_request_id"]
        request = asked.get(rid)
        if request is None:
            raise InvalidParams(f"mcp_approval_response: no mcp_approval_request {rid[:80]!r} "
                                "in this input or the previous response", param="input")
        call = ToolCall(call_id_of(rid), request["name"], request.get("arguments") or "{}")
        out.append(Decision(call, answer["approve"], answer.get("reason"), request["server_label"]))
    return tuple(out)


def parse_request(body: dict, chat: bool, defaults: SamplingParams, *,
                  store: ResponseStore, hub: McpHub | None = None) -> ResponsesRequest:
    """Validate a whole /v1/responses body (blocking: it may read the
    previous response from `store`). Raises InvalidParams naming the field:
    one llmctl does not know or support, a wrong type or value, a previous
    response not stored, an input item or tool llmctl cannot handle."""
    _refuse_unknown(body)
    model = typed_field(body, "model", (str,)) or None
    stream = bool(typed_field(body, "stream", (bool,)))
    stored = typed_field(body, "store", (bool,)) is not False
    instructions = typed_field(body, "instructions", (str,))
    if typed_field(body, "metadata", (dict,)) and not all(
            isinstance(v, str) for v in body["metadata"].values()):
        raise InvalidParams("'metadata' values must be strings", param="metadata")
    for key in ("user", "prompt_cache_key", "safety_identifier"):
        typed_field(body, key, (str,))
    tools = parse_tools(body.get("tools"), hub)
    response_format, text_echo, ignored_text = _text_format(body.get("text"))
    structured = _structured(body, tools, response_format)
    reasoning, ignored_reasoning, think = _reasoning(body)
    sealed = _include(body)
    if sealed:
        store.key()             # read (or made) here, off the loop, before sealing
    previous = _previous(body, store)
    if body.get("input") is None:
        raise InvalidParams("'input' is required", param="input")
    new, items, conversation = input_messages(body["input"], store)
    approvals = _approvals(conversation, previous)
    if approvals and not tools.mcp:
        raise InvalidParams("mcp_approval_response needs the request's `mcp` tool for its server",
                            param="input")
    history = (previous.messages if previous else []) + new
    system = [{"role": "system", "content": instructions}] if instructions else []
    params = _sampling(body, defaults)
    echo = {"instructions": instructions, "max_output_tokens": params.max_tokens,
            "metadata": body.get("metadata") or {}, "parallel_tool_calls": structured.parallel,
            "previous_response_id": body.get("previous_response_id"), "reasoning": reasoning,
            "store": stored, "temperature": params.temperature, "text": text_echo,
            "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
            "top_p": params.top_p, "truncation": "disabled", "user": body.get("user"),
            "prompt_cache_key": body.get("prompt_cache_key"), "background": False,
            "service_tier": "default"}
    return ResponsesRequest(model, stream, stored, params, structured, system + history, history,
                            items, tools, sealed, ignored_text + ignored_reasoning, echo,
                            body.get("keep_alive"), think, _max_tool_calls(body),
                            _mcp_choice(body, tools), approvals)
