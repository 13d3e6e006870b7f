"""Tools on the request side and in the conversation history: validated
and normalised for the chat template, so a malformed tool, tool_choice or
tool message is a 400 that names the field, never a template crash."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

from llmctl.errors import InvalidParams
from llmctl.runtime.formats.tool_shapes import MAX_JSON_DEPTH, _loads

_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# OpenAI's limit; each tool is rendered into the prompt and the grammar.
MAX_TOOLS = 128


def _complaint(where: str, param: str) -> Callable[[str], InvalidParams]:
    return lambda what: InvalidParams(where + what, param=param)


def validate_tools(tools) -> list[dict]:
    """The request's `tools`, checked and reduced to what templates read:
    [{"type": "function", "function": {"name", "description"?, "parameters"?}}].
    None and [] mean no tools. Raises InvalidParams(param="tools") naming the
    bad entry: not a list (or over MAX_TOOLS), type other than "function", a name not matching
    ^[a-zA-Z0-9_-]{1,64}$ or given twice, a description that is not a string,
    parameters that are not a JSON-schema object."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidParams("tools must be a list", param="tools")
    if len(tools) > MAX_TOOLS:
        raise InvalidParams(f"tools may hold at most {MAX_TOOLS} functions", param="tools")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        bad = _complaint(f"tools[{i}]", "tools")
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad(' must be an object with "type": "function"')
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad(".function must be an object")
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise bad(".function.name must match ^[a-zA-Z0-9_-]{1,64}$")
        if name in seen:
            raise bad(f".function.name {name!r} is used by an earlier tool")
        seen.add(name)
        if "description" in fn and not isinstance(fn["description"], str):
            raise bad(".function.description must be a string")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise bad(".function.parameters must be a JSON schema object")
        kept = {k: fn[k] for k in ("name", "description", "parameters") if k in fn}
        out.append({"type": "function", "function": kept})
    return out


@dataclass(frozen=True)
class ToolChoice:
    """A validated tool_choice: the mode, and the tool's name when the mode
    is "function"."""

    mode: str  # "auto", "none", "required" or "function" (one named tool)
    name: str | None = None

    def allowed(self, tool_names: set[str]) -> set[str]:
        """The names a parsed call may use under this choice."""
        if self.mode == "none":
            return set()
        if self.mode == "function":
            # A choice of one function always names it (validate_tool_choice).
            return {self.name} if self.name is not None else set()
        return set(tool_names)


def validate_tool_choice(tool_choice, tools: list[dict]) -> ToolChoice:
    """The request's `tool_choice` given its validated `tools`: None means
    "auto" with tools and "none" without, as OpenAI does. Raises
    InvalidParams(param="tool_choice") for anything else than "auto",
    "none", "required" or {"type": "function", "function": {"name": X}},
    for "required" or a named function without tools, and for an X that is
    not among the tools."""
    names = {t["function"]["name"] for t in tools}
    if tool_choice is None:
        return ToolChoice("auto" if tools else "none")
    if tool_choice in ("auto", "none", "required"):
        if tool_choice == "required" and not tools:
            raise InvalidParams('tool_choice "required" needs tools', param="tool_choice")
        return ToolChoice(tool_choice)
    named = isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
    fn = tool_choice.get("function") if named else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidParams('tool_choice must be "auto", "none", "required" or '
                            '{"type": "function", "function": {"name": ...}}',
                            param="tool_choice")
    if fn["name"] not in names:
        raise InvalidParams(f"tool_choice names {fn['name'][:64]!r}, which is not among the tools",
                            param="tool_choice")
    return ToolChoice("function", fn["name"])


def normalize_tool_calls(index: int, tool_calls) -> list[dict]:
    """An assistant history message's `tool_calls` (messages[index]) for a
    template: [{"id", "type": "function", "function": {"name", "arguments":
    dict}, "arguments_json": str}]. Templates such as Qwen's and Llama's
    apply `tojson` to the arguments, so they get the parsed object; the
    client's text is kept beside it. None and [] give []. Raises
    InvalidParams(param="messages") naming the bad field: a call that is not
    an object, an empty or non-string id, a type other than "function", a
    missing or non-string name, arguments that are not a JSON object (or its
    text)."""
    if tool_calls is None:
        return []
    where = f"messages[{index}].tool_calls"
    if not isinstance(tool_calls, list):
        raise InvalidParams(f"{where} must be a list", param="messages")
    out = []
    for j, call in enumerate(tool_calls):
        bad = _complaint(f"{where}[{j}]", "messages")
        if not isinstance(call, dict):
            raise bad(" must be an object")
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise bad(".id must be a non-empty string")
        if call.get("type", "function") != "function":
            raise bad('.type must be "function"')
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(".function.name must be a non-empty string")
        text = fn.get("arguments")
        args = _loads(text) if isinstance(text, str) else text
        if not isinstance(args, dict):
            raise bad(".function.arguments must be a JSON object in a string, nested at most "
                      f"{MAX_JSON_DEPTH} levels")
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": fn["name"], "arguments": args},
                    "arguments_json": text if isinstance(text, str) else
                    json.dumps(args, ensure_ascii=False, separators=(",", ":"))})
    return out


def normalize_tool_result(index: int, message: dict) -> dict:
    """The fields a `role: "tool"` message (messages[index]) adds beside its
    role and content: {"tool_call_id"} and "name" when given. Raises
    InvalidParams(param="messages") for a missing, empty or non-string
    tool_call_id and a name that is not a string."""
    where = f"messages[{index}]"
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidParams(f"{where}.tool_call_id must be a non-empty string", param="messages")
    out = {"tool_call_id": call_id}
    if message.get("name") is not None:
        if not isinstance(message["name"], str):
            raise InvalidParams(f"{where}.name must be a string", param="messages")
        out["name"] = message["name"]
    return out
