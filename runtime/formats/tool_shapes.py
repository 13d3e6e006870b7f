"""Tool-call formats and the shapes the tool-call parser (tool_calls.py)
produces: which syntax a chat template teaches, OpenAI-shaped calls, the
message a whole answer parses into and the deltas a streamed one does.

Everything here is importable from llmctl.runtime.formats.tool_calls as well."""

from __future__ import annotations

import enum
import json
import random
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Callable, Union, cast


class ToolFormat(str, enum.Enum):
    """The tool-call syntaxes llmctl parses, as detect_format names them from
    a chat template."""

    HERMES = "hermes"    # <tool_call>{"name": …, "arguments": {…}}</tool_call>
    LLAMA3 = "llama3"    # [<|python_tag|>]{"name": …, "parameters": {…}}; …
    MISTRAL = "mistral"  # [TOOL_CALLS][{…}, …] or [TOOL_CALLS]name[ARGS]{…}
    GENERIC = "generic"  # {"tool_calls": [{…}]} or {"name": …, "arguments": {…}}
    NONE = "none"


def detect_format(template: str | None) -> ToolFormat:
    """The tool-call syntax a chat template teaches, from its marker strings.
    Templates whose `<tool_call>` wraps something other than JSON (GLM,
    Qwen3-Coder's XML) come out HERMES; their calls then stay content.
    Raises nothing."""
    t = template or ""
    if "[TOOL_CALLS]" in t:
        return ToolFormat.MISTRAL
    if "<tool_call>" in t:
        return ToolFormat.HERMES
    if "<|python_tag|>" in t or ("ipython" in t and "<|start_header_id|>" in t):
        return ToolFormat.LLAMA3
    if re.search(r"\btools\b", t):
        return ToolFormat.GENERIC
    return ToolFormat.NONE


# A Hermes model's call written without its <tool_call> tag as the whole
# answer: a bare call object, or one right inside a leading ``` or ```json
# fence. It is a lazy-grammar trigger in grammar_sampler's anchored form (a
# trigger that begins with "^" is a pattern matched at the output's start);
# the grammar (tool_call_grammar with openings) takes the text from group 1
# on. Every repeat is bounded, so a match is decided within
# CALL_OPENING_MAX characters and watching for it costs nothing after.
CALL_OPENING = (r'^\s{0,8}((?:```[ \t]{0,4}(?:json)?[ \t]{0,4}\r?\n[ \t\r\n]{0,8})?'
                r'\{[ \t\r\n]{0,8}"name")')
CALL_OPENING_MAX = 48

_ID_CHARS = string.ascii_letters + string.digits


def call_id_factory(rng: random.Random | None = None) -> Callable[[], str]:
    """A source of OpenAI-style ids, `call_` and 24 letters or digits: from
    `secrets` by default, from `rng` when given (seeded, for tests)."""
    pick = rng.choice if rng is not None else secrets.choice
    return lambda: "call_" + "".join(pick(_ID_CHARS) for _ in range(24))


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call in OpenAI's terms: its id, the function's name and
    the arguments as JSON text."""

    id: str
    name: str
    arguments: str  # compact JSON text of an object, as OpenAI's function.arguments

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedMessage:
    """A whole answer parsed: its content, tool calls and reasoning text
    (None where there is none)."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None


@dataclass(frozen=True)
class TextDelta:
    """Streamed answer text, outside tool calls and reasoning."""

    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    """Streamed reasoning (thinking) text."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A call's first delta carries its id and name (arguments ""); later
    ones carry only argument text, to be appended in order."""
    index: int
    id: str | None
    name: str | None
    arguments: str

    def to_openai(self) -> dict:
        """The entry of `choices[0].delta.tool_calls` in a streamed chunk."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallDone:
    """A call's end: no more argument text follows for `index` (its
    arguments stand as written, even where the output stopped inside them)."""

    index: int


Delta = Union[TextDelta, ThinkingDelta, ToolCallDelta, ToolCallDone]


def collect(deltas: list[Delta]) -> ParsedMessage:
    """Folds streamed deltas into the message they spell. Raises nothing."""
    content: list[str] = []
    reasoning: list[str] = []
    heads: dict[int, tuple[str, str]] = {}      # index -> id, name
    arguments: dict[int, str] = {}
    for d in deltas:
        if isinstance(d, TextDelta):
            content.append(d.text)
        elif isinstance(d, ThinkingDelta):
            reasoning.append(d.text)
        elif isinstance(d, ToolCallDone):
            continue
        elif d.id is not None:
            # A call's first delta carries its name (see ToolCallDelta).
            heads[d.index] = (d.id, cast(str, d.name))
            arguments[d.index] = d.arguments
        else:
            arguments[d.index] += d.arguments
    return ParsedMessage("".join(content) or None,
                         [ToolCall(*heads[i], arguments[i]) for i in sorted(heads)],
                         "".join(reasoning) or None)


# Deeper JSON than this in a tool call (the request's history or the model's
# output) is refused: the request body is held to the same depth
# (server/body.py), and json.loads and json.dumps recurse.
MAX_JSON_DEPTH = 64


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _loads(text: str):
    """The JSON value in `text`, or None when it is not JSON or nests deeper
    than MAX_JSON_DEPTH. Raises nothing: json.loads' RecursionError on deep
    nesting (about 1,000 levels) is caught too."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    return value if json_depth(value) <= MAX_JSON_DEPTH else None


def json_depth(value) -> int:
    """How deeply `value` nests lists and dicts (a scalar: 0), without
    recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value)
    return deepest
