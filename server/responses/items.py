"""A Responses request's `input` as the chat messages the model's template
renders: message items (user, system, developer, assistant; text parts),
function_call items folded into the assistant turn they belong to,
function_call_output items as tool results, and reasoning items as the
reasoning_content of the assistant turn they precede (a sealed thought
must be this server's), which templates that read past thoughts render and
the others drop. Every item the client sent is kept,
with an id, for GET /v1/responses/{id}/input_items."""

from __future__ import annotations

from typing import Any

from llmctl.errors import InvalidParams
from llmctl.server.responses.mcp_request import call_id_of
from llmctl.server.responses.store import ResponseStore, new_id

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")
_THOUGHT_PARTS = ("reasoning_text", "summary_text", "text")
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "reasoning": "rs", "mcp_list_tools": "mcpl", "mcp_call": "mcp",
              "mcp_approval_request": "mcpr", "mcp_approval_response": "mcpa"}


def flat_name(namespace: str | None, name: str) -> str:
    """The one name the model sees for `name` in `namespace` (Codex's own
    flattening: namespace__name)."""
    return f"{namespace.rstrip('_')}__{name.lstrip('_')}" if namespace else name


def _bad(where: str, what: str) -> InvalidParams:
    return InvalidParams(f"'{where}' {what}", param="input")


def _text(content: Any, where: str, kinds: tuple[str, ...] = _TEXT_PARTS, sep: str = "") -> str:
    """The text of a content field: a string, or its parts of `kinds` joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in kinds and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif isinstance(kind, str):
            raise _bad(f"{where}[{j}]", f"is a {kind[:32]!r} part, which llmctl does not "
                       f"support here ({', '.join(kinds)} parts only)")
        else:
            raise _bad(f"{where}[{j}]", "must be an object with a 'type' and its 'text'")
    return sep.join(texts)


def _string(item: dict, key: str, where: str, required: bool = True) -> str | None:
    value = item.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise _bad(f"{where}.{key}", "must be a non-empty string")
    return value


class _Conversation:
    """Chat messages built up from input items in order."""

    def __init__(self, store: ResponseStore):
        self.store = store
        self.messages: list[dict] = []
        self._thought: str | None = None    # a reasoning item's, for the next assistant turn
        self.approvals: list[dict] = []     # mcp_approval_response items, checked
        self.asked: dict[str, dict] = {}    # mcp_approval_request items by id

    def _think(self, message: dict) -> None:
        if self._thought is not None and "reasoning_content" not in message:
            message["reasoning_content"] = self._thought
        self._thought = None

    def message(self, item: dict, where: str) -> None:
        role = item.get("role")
        if role not in _ROLES:
            raise _bad(f"{where}.role", f"must be one of {', '.join(_ROLES)}")
        if "content" not in item:
            raise _bad(f"{where}.content", "is required")
        self.messages.append({"role": role, "content": _text(item["content"], f"{where}.content")})
        if role == "assistant":
            self._think(self.messages[-1])

    def function_call(self, item: dict, where: str) -> None:
        call_id = _string(item, "call_id", where) or ""
        name = _string(item, "name", where) or ""
        namespace = _string(item, "namespace", where, required=False)
        self._call(call_id, flat_name(namespace, name),
                   _string(item, "arguments", where, required=False) or "{}")

    def _call(self, call_id: str, name: str, arguments: str) -> None:
        call = {"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}}
        last = self.messages[-1] if self.messages else None
        # Calls that follow the assistant's text (or other calls) are that turn's.
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
            if not last["content"]:
                last["content"] = None
        else:
            self.messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        self._think(self.messages[-1])

    # MCP items: a call the server ran (with its output), a call that
    # waited for approval, the client's answer to it, and a tool listing.
    def mcp_call(self, item: dict, where: str) -> None:
        _string(item, "server_label", where)
        self._call(call_id_of(_string(item, "id", where) or ""), _string(item, "name", where) or "",
                   _string(item, "arguments", where, required=False) or "{}")
        error = item.get("error")
        output = item.get("output")
        text = output if isinstance(output, str) else ""
        if error is not None:
            text = f"error: {error if isinstance(error, str) else error.get('message', error)}" \
                if isinstance(error, (str, dict)) else "error"
        self.messages.append({"role": "tool", "tool_call_id": self.messages[-1]["tool_calls"][-1]
                              ["id"], "content": text})

    def mcp_approval_request(self, item: dict, where: str) -> None:
        _string(item, "server_label", where)
        item_id = _string(item, "id", where) or ""
        self._call(call_id_of(item_id), _string(item, "name", where) or "",
                   _string(item, "arguments", where, required=False) or "{}")
        self.asked[item_id] = item

    def mcp_approval_response(self, item: dict, where: str) -> None:
        _string(item, "approval_request_id", where)
        if not isinstance(item.get("approve"), bool):
            raise _bad(f"{where}.approve", "must be a boolean")
        _string(item, "reason", where, required=False)
        self.approvals.append(item)

    def mcp_list_tools(self, item: dict, where: str) -> None:
        _string(item, "server_label", where)

    def function_call_output(self, item: dict, where: str) -> None:
        if not item.get("call_id") and isinstance(item.get("name"), str) and item["name"]:
            call_id: str | None = self._standalone_call(item, where)
        else:
            call_id = _string(item, "call_id", where)
        if "output" not in item:
            raise _bad(f"{where}.output", "is required")
        self.messages.append({"role": "tool", "tool_call_id": call_id,
                              "content": _text(item["output"], f"{where}.output")})

    def _standalone_call(self, item: dict, where: str) -> str:
        """The id of a call made up for an output the client adds without
        one (Codex 0.171 sends its goal this way: a name and namespace, no
        call_id): a call of that tool without arguments, so every template
        sees a result that answers a call."""
        namespace = _string(item, "namespace", where, required=False)
        call_id = f"call_{item.get('id') or new_id('fco')}"
        self._call(call_id, flat_name(namespace, item["name"]), "{}")
        return call_id

    def reasoning(self, item: dict, where: str) -> None:
        """The thought: what this server sealed, else the item's own
        reasoning text, else its summary."""
        texts = {key: _text(item[key], f"{where}.{key}", _THOUGHT_PARTS, "\n")
                 for key in ("summary", "content") if item.get(key) is not None}
        sealed = item.get("encrypted_content")
        if sealed is not None:
            texts["sealed"] = self.store.unseal(sealed, f"{where}.encrypted_content")
        thought = texts.get("sealed") or texts.get("content") or texts.get("summary")
        if thought:
            self._thought = thought if self._thought is None else self._thought + "\n" + thought


def input_messages(value: Any, store: ResponseStore) -> tuple[list[dict], list[dict], "_Conversation"]:
    """(chat messages, the input items with ids, the conversation with its
    MCP approvals) for a request's `input`.
    Raises InvalidParams (param "input") naming the item and field at
    fault: a missing input, an item type or content part llmctl does not
    support, a malformed field, a sealed thought this home did not seal."""
    if isinstance(value, str):
        conversation = _Conversation(store)
        conversation.messages.append({"role": "user", "content": value})
        return (conversation.messages,
                [{"type": "message", "id": new_id("msg"), "role": "user", "status": "completed",
                  "content": [{"type": "input_text", "text": value}]}], conversation)
    if not isinstance(value, list):
        raise InvalidParams("'input' must be a string or a list of items", param="input")
    conversation = _Conversation(store)
    items = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "must be an object")
        raw = item.get("type", "message" if "role" in item else None)
        kind = raw if isinstance(raw, str) else ""
        if kind not in _ID_PREFIX:
            what = f"{kind[:40]!r} items" if kind else "items without a 'type'"
            raise _bad(f"{where}.type", f"is not supported by llmctl: {what} (message, "
                       "function_call, function_call_output, reasoning and mcp items are)")
        getattr(conversation, kind)(item, where)
        items.append({"type": kind, "id": item.get("id") or new_id(_ID_PREFIX[kind]),
                      **({"status": "completed"} if kind == "message" else {}),
                      **{k: v for k, v in item.items() if k not in ("type", "id")}})
    return conversation.messages, items, conversation
