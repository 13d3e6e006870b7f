"""The text each tool-call format writes around a call, as the parser
(tool_calls.py) looks for it: markers, openers, fences and the bare call
object a small model writes, with the partial forms that may still become
one while the text streams in."""

from __future__ import annotations

import re

from llmctl.runtime.formats.tool_shapes import ToolFormat

MARKERS = {ToolFormat.HERMES: "<tool_call>", ToolFormat.LLAMA3: "<|python_tag|>",
            ToolFormat.MISTRAL: "[TOOL_CALLS]"}
# Output that opens with bare JSON: Llama 3 and generic calls are plain JSON,
# and llama.cpp renders Mistral's [TOOL_CALLS] control token as nothing.
OPENERS = {ToolFormat.LLAMA3: re.compile(r"\{"), ToolFormat.GENERIC: re.compile(r"\{"),
            ToolFormat.MISTRAL: re.compile(r"\[\s*\{")}
HERMES_CLOSE = re.compile(r"\s*</tool_call>")
MISTRAL_HEAD = re.compile(r"([A-Za-z0-9_.-]{1,64})(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\]\s*")
MISTRAL_HEAD_SO_FAR = re.compile(r"[A-Za-z0-9_.\-\[\]]{0,150}")
SEPARATORS = " \t\r\n;"
# A Hermes call in a code block: the fence line, then the call (see module doc).
FENCE = "```"
FENCE_LANGS = ("json", "xml", "tool_call")
FENCE_OPEN = re.compile(r"```[ \t]*(?:json|xml|tool_call)?[ \t]*\r?\n", re.IGNORECASE)
# A bare call object opening a Hermes answer (tool_shapes.CALL_OPENING): its
# first key is "name". Other JSON (another first key, an array) is content.
BARE_CALL = re.compile(r'\{\s*"name"\s*:')
BARE_CALL_SO_FAR = re.compile(r'\{\s*(?:"(?:n(?:a(?:m(?:e(?:"\s*)?)?)?)?)?)?')
# The same call in doubled braces, as a template whose instructions show it
# so (a Jinja string literal's `{{\"name\": ...}}`) teaches it.
DOUBLED_CALL = re.compile(r'\{\{\s*"name"\s*:')
DOUBLED_CALL_SO_FAR = re.compile(r'\{\{?\s*(?:"(?:n(?:a(?:m(?:e(?:"\s*)?)?)?)?)?)?')
FENCE_OPEN_SO_FAR = re.compile(
    r"`{0,3}|```[ \t]*(?:%s)|```[ \t]*(?:json|xml|tool_call)?[ \t]*\r?"
    % "|".join(lang[:n] for lang in FENCE_LANGS for n in range(1, len(lang))), re.IGNORECASE)
