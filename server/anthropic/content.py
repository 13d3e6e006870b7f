"""Anthropic's conversation as the OpenAI-style messages the chat template
takes: `system` (a string or text blocks) first, then each message's
blocks. A user's tool_result blocks become `tool` messages tied to the
tool_use they answer, an assistant's tool_use blocks its tool_calls (input
as JSON), and thinking blocks are kept only as far as the request's
context_management asks (templates drop past thoughts anyway). Blocks
llmctl cannot honour (image, document, server tools' results) are refused
by name."""

from __future__ import annotations

import json
from typing import Any, Iterator

from llmctl.errors import InvalidParams

# Blocks that carry what a text model cannot read, or the result of a tool
# the server would have had to run itself.
_REFUSED_BLOCKS = {
    "image": "images are not supported by llmctl (text models only)",
    "document": "documents are not supported by llmctl (text models only)",
    "search_result": "search results are not supported by llmctl",
    "container_upload": "code-execution containers are not supported by llmctl",
}
_THINKING = ("thinking", "redacted_thinking")
_ROLES = ("user", "assistant", "system")      # Claude Code sends a system message too


def _bad(where: str, what: str) -> InvalidParams:
    return InvalidParams(f"{where} {what}", param="messages")


def _refuse_block(where: str, kind: Any) -> InvalidParams:
    shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
    why = _REFUSED_BLOCKS.get(shown)
    if why is None and isinstance(kind, str) and ("tool_use" in kind or "tool_result" in kind):
        why = "server tools are not supported by llmctl"
    return _bad(f"{where}.type", f"{shown!r}: {why or 'is not a content block llmctl knows'}")


def text_of(blocks: Any, where: str, param: str = "messages") -> str:
    """The text of a string or a list of text blocks (their cache_control
    accepted and ignored), joined by newlines. Raises InvalidParams naming
    `where` for anything else."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise InvalidParams(f"{where} must be a string or a list of text blocks", param=param)
    parts = []
    for j, block in enumerate(blocks):
        here = f"{where}[{j}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            if kind in _REFUSED_BLOCKS:
                raise _refuse_block(here, kind)
            raise InvalidParams(f"{here} must be a text block", param=param)
        if not isinstance(block.get("text"), str):
            raise InvalidParams(f"{here}.text must be a string", param=param)
        parts.append(block["text"])
    return "\n".join(parts)


def system_messages(system: Any) -> list[dict]:
    """The top-level `system` as a leading system message (none when absent
    or empty). Raises InvalidParams naming `system`."""
    if system is None:
        return []
    text = text_of(system, "system", param="system")
    return [{"role": "system", "content": text}] if text else []


def keep_thinking(edits: list[dict]) -> int | None:
    """How many of the latest assistant turns keep their thinking blocks
    under context_management's clear_thinking edits: None for all (no such
    edit, or keep "all"). Raises InvalidParams naming the edit."""
    keep: int | None = None
    for i, edit in enumerate(edits):
        if not edit.get("type", "").startswith("clear_thinking"):
            continue
        value = edit.get("keep", {"type": "thinking_turns", "value": 1})
        if value == "all":
            continue
        if not (isinstance(value, dict) and value.get("type") == "thinking_turns"
                and type(value.get("value")) is int and value["value"] >= 0):
            raise InvalidParams(f"context_management.edits[{i}].keep must be \"all\" or "
                                "{\"type\": \"thinking_turns\", \"value\": N}",
                                param="context_management")
        keep = value["value"] if keep is None else min(keep, value["value"])
    return keep


def chat_messages(messages: Any, keep: int | None = None) -> list[dict]:
    """Anthropic's `messages` as OpenAI-style ones; `keep` (keep_thinking)
    bounds the assistant turns whose thinking is kept. Raises InvalidParams
    (param "messages") naming the message and block at fault."""
    if not isinstance(messages, list) or not messages:
        raise InvalidParams("'messages' must be a non-empty list", param="messages")
    n_assistant = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    first_kept = 0 if keep is None else n_assistant - keep
    names: dict[str, str] = {}        # tool_use id -> the tool's name
    out: list[dict] = []
    seen_assistant = 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise _bad(where, "must be an object with a role of user, assistant or system")
        role = message["role"]
        content = message.get("content")
        if role == "system":
            out.append({"role": "system", "content": text_of(content, f"{where}.content")})
        elif role == "user":
            out += _user(where, content, names)
        else:
            out += _assistant(where, content, names, seen_assistant >= first_kept)
            seen_assistant += 1
    if messages[-1].get("role") == "assistant":
        # Anthropic continues a final assistant turn; a template closes it.
        raise _bad(f"messages[{len(messages) - 1}]", "is an assistant turn: prefilling the "
                   "answer is not supported by llmctl; end with a user message")
    return out


def _blocks(where: str, content: Any) -> Iterator[tuple[str, str, dict]]:
    """(where, type, block) of each block of a message's content."""
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(f"{where}.content", "must be a string or a list of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"{where}.content[{j}]", "must be an object with a 'type'")
        yield f"{where}.content[{j}]", block["type"], block


def _text(where: str, block: dict) -> str:
    if not isinstance(block.get("text"), str):
        raise _bad(f"{where}.text", "must be a string")
    return block["text"]


def _user(where: str, content: Any, names: dict[str, str]) -> list[dict]:
    """A user message: its tool results as tool messages, then its text."""
    results, texts = [], []
    for here, kind, block in _blocks(where, content):
        if kind == "text":
            texts.append(_text(here, block))
        elif kind == "tool_result":
            results.append(_tool_result(here, block, names))
        else:
            raise _refuse_block(here, kind)
    if texts or not results:
        results.append({"role": "user", "content": "\n".join(texts)})
    return results


def _tool_result(where: str, block: dict, names: dict[str, str]) -> dict:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_use_id", "must be a non-empty string")
    raw = block.get("content", "")
    text = text_of(raw, f"{where}.content") if raw is not None else ""
    if block.get("is_error") is True:
        # OpenAI-style tool messages have no error flag: the model reads it.
        text = f"Error: {text}"
    elif block.get("is_error") not in (None, False):
        raise _bad(f"{where}.is_error", "must be a boolean")
    out = {"role": "tool", "tool_call_id": call_id, "content": text}
    if call_id in names:
        out["name"] = names[call_id]
    return out


def _assistant(where: str, content: Any, names: dict[str, str], keeps_thought: bool) -> list[dict]:
    """An assistant turn: its text, its thinking when kept (as
    reasoning_content, which templates that think may read), its calls.
    The server's own MCP calls (mcp_tool_use, then its mcp_tool_result)
    split the turn: the result is a tool message between its two parts."""
    out: list[dict] = []
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict] = []

    def flush() -> None:
        if not (texts or thoughts or calls):
            return
        message: dict = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
        if thoughts:
            message["reasoning_content"] = "\n".join(thoughts)
        if calls:
            message["tool_calls"] = list(calls)
        out.append(message)
        texts.clear()
        thoughts.clear()
        calls.clear()

    for here, kind, block in _blocks(where, content):
        if kind == "text":
            texts.append(_text(here, block))
        elif kind in ("tool_use", "mcp_tool_use"):
            calls.append(_tool_use(here, block, names))
        elif kind == "mcp_tool_result":
            flush()
            out.append(_tool_result(here, block, names))
        elif kind == "mcp_tool_listing":
            continue                # what the server listed: nothing for the template
        elif kind in _THINKING:
            if keeps_thought and isinstance(block.get("thinking"), str):
                thoughts.append(block["thinking"])
        else:
            raise _refuse_block(here, kind)
    flush()
    return out or [{"role": "assistant", "content": ""}]


def _tool_use(where: str, block: dict, names: dict[str, str]) -> dict:
    call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.id", "must be a non-empty string")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.name", "must be a non-empty string")
    if not isinstance(args, dict):
        raise _bad(f"{where}.input", "must be an object")
    names[call_id] = name
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
