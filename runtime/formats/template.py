"""Chat templates from GGUF metadata, rendered in Jinja2's sandbox.

A model file is untrusted input: llama-cpp-python once rendered templates in
a plain Environment, and a crafted GGUF could run code (CVE-2024-34359).
The immutable sandbox refuses attribute tricks such as __class__/__globals__.

Templates get the variables transformers' apply_chat_template gives them
(messages, tools, add_generation_prompt, bos_token, eos_token), so a model
sees tools and tool calls laid out as it was trained to read them."""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any, Callable, Literal, Mapping

from jinja2 import TemplateError as JinjaTemplateError
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llmctl.errors import InvalidParams, TemplateError
from llmctl.runtime.formats.reasoning import THINK_CLOSE, THINK_OPEN, opens_thought
from llmctl.runtime.formats.tool_calls import ToolFormat, detect_format
from llmctl.runtime.formats.tool_schema import normalize_tool_calls, normalize_tool_result, validate_tools

# ChatTemplate(None)'s source. Models never get it by default: a GGUF
# without a template gets its architecture's format or none (template_source.py).
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# A template that never names `tools` cannot show them to the model.
_USES_TOOLS = re.compile(r"\btools\b")
# What Qwen3's template writes after the generation prompt for
# enable_thinking=false: an empty thought, so the model answers at once.
EMPTY_THOUGHT = f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"
# How a template thinks (ChatTemplate.thinking): it reads the switch, it
# opens the thought in the generation prompt, or it only knows the tags.
ThinkingKind = Literal["switch", "opens", "tags"]
# Renders a llama.cpp built-in format: (its name, (role, content) turns,
# add_generation_prompt) -> the prompt.
BuiltinRenderer = Callable[[str, list[tuple[str, str]], bool], str]


def _raise(message: str) -> None:
    raise TemplateError(f"chat template refused the conversation: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson sorts keys and escapes <, >, & and ' for HTML; chat
    # templates were written for transformers' filter, which does neither,
    # so a tool schema reaches the model as the client wrote it.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except JinjaTemplateError as e:
        raise TemplateError(f"invalid chat template: {e}") from e


class ChatTemplate:
    """A chat template compiled in the sandbox; None means ChatML. Raises
    TemplateError when the source is not valid Jinja."""

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = ""):
        self.source = source or CHATML
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(self.source)

    @cached_property
    def tool_format(self) -> ToolFormat:
        """The tool-call syntax this template teaches the model."""
        return detect_format(self.source)

    @property
    def teaches_doubled_braces(self) -> bool:
        """Whether its tool instructions show a call in doubled braces
        (`{{"name": ...}}` from a Jinja string literal): a model copies
        them, so such an answer is read as a call (docs/tools.md)."""
        return '{{\\"name\\"' in self.source

    @property
    def thinks(self) -> bool:
        """Whether the template knows a <think> block."""
        return THINK_OPEN in self.source

    @cached_property
    def thinking(self) -> ThinkingKind | None:
        """How the template thinks: "switch" (it reads `enable_thinking`,
        as Qwen3's does), "opens" (its generation prompt ends inside
        `<think>`, as DeepSeek-R1's), "tags" (it only mentions `<think>` or
        `reasoning_content`), None when it does not think. Raises nothing."""
        if not self.source:
            return None     # a built-in format or none: no template text, no thought
        if "enable_thinking" in self.source:
            return "switch"
        try:
            probe = self._template.render(messages=[{"role": "user", "content": "hi"}],
                                          tools=None, add_generation_prompt=True,
                                          bos_token=self.bos_token, eos_token=self.eos_token)
        except Exception:  # any Jinja error in untrusted code: judge by its text
            probe = ""
        if opens_thought(probe):
            return "opens"
        if THINK_OPEN in self.source or "reasoning_content" in self.source:
            return "tags"
        return None

    @property
    def reads_reasoning(self) -> bool:
        """Whether the template shows an assistant turn's reasoning_content
        (past thoughts) to the model."""
        return "reasoning_content" in self.source

    @property
    def supports_tools(self) -> bool:
        """Whether the template shows a request's tools to the model."""
        return _USES_TOOLS.search(self.source) is not None

    def render(self, messages: list[dict], tools: list[dict] | None = None, *,
               add_generation_prompt: bool = True, thinking: bool | None = None,
               variables: Mapping[str, Any] | None = None) -> str:
        """The prompt for `messages` (as normalize_messages returns them) and
        `tools` (the request's, validated here; None or [] for none), with
        `variables` (a preset's chat_template_kwargs) beside the standard
        ones; `thinking`'s switch wins over theirs.
        Raises InvalidParams(param="tools") for malformed tools or tools
        given to a template that does not support them,
        InvalidParams(param="messages") for tool calls in the history of
        such a template (they would vanish from the prompt), and
        TemplateError when the template fails or tries to leave the sandbox.
        A template that never names the developer role gets developer
        messages as system ones (OpenAI's newer name for them), so they are
        not dropped unseen. `thinking` (None: the template's default) turns
        the model's thought on or off where the template thinks: the
        switch's `enable_thinking`, else an off thought closed at once in
        the prompt (the empty thought Qwen3's template writes)."""
        tools = self._tools(messages, tools)
        if "developer" not in self.source:
            messages = [{**m, "role": "system"} if m.get("role") == "developer" else m
                        for m in messages]
        extra = dict(variables or {})
        if thinking is not None and self.thinking == "switch":
            extra["enable_thinking"] = thinking
        prompt = self._render(messages=messages, tools=tools or None,
                              add_generation_prompt=add_generation_prompt,
                              bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        if thinking is not False or not add_generation_prompt:
            return prompt
        return _closed_thought(prompt, self.thinking, self.thinks)

    def _render(self, **variables: Any) -> str:
        try:
            return self._template.render(**variables)
        except TemplateError:
            raise
        except SecurityError as e:
            raise TemplateError(f"chat template tried to escape the sandbox: {e}") from e
        except Exception as e:  # any Jinja runtime error in untrusted code
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e

    def _tools(self, messages: list[dict], tools) -> list[dict]:
        tools = validate_tools(tools)
        if self.supports_tools:
            return tools
        if tools:
            raise InvalidParams("this model's chat template does not support tools",
                                param="tools")
        for i, message in enumerate(messages):
            if message.get("tool_calls"):
                raise InvalidParams(f"messages[{i}].tool_calls: this model's chat template "
                                    "does not support tool calls", param="messages")
        return tools


class BuiltinTemplate(ChatTemplate):
    """One of llama.cpp's built-in chat formats, by name (`gemma`, `llama3`,
    ...), for a GGUF that carries no template: rendered by `renderer`
    (llama_chat_apply_template), with no tools and no thought. Rendering
    raises what ChatTemplate.render does, and what `renderer` raises."""

    def __init__(self, name: str, renderer: BuiltinRenderer, *, bos_token: str = "",
                 eos_token: str = ""):
        self.name = name
        self.source = ""
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._renderer = renderer

    def _render(self, **variables: Any) -> str:
        turns = [(m["role"], m["content"]) for m in variables["messages"]]
        return self._renderer(self.name, turns, bool(variables["add_generation_prompt"]))


class NoTemplate(ChatTemplate):
    """A model with no chat format (a base model): every render is refused
    with `refusal`, one line naming what serves it instead. render raises
    InvalidParams(param="model")."""

    def __init__(self, refusal: str, *, bos_token: str = "", eos_token: str = ""):
        self.refusal = refusal
        self.source = ""
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict], tools: list[dict] | None = None, *,
               add_generation_prompt: bool = True, thinking: bool | None = None,
               variables: Mapping[str, Any] | None = None) -> str:
        raise InvalidParams(self.refusal, param="model")


def _closed_thought(prompt: str, kind: ThinkingKind | None, knows_tags: bool) -> str:
    """`prompt` with the model's thought closed before it begins."""
    if opens_thought(prompt):
        return prompt.rstrip() + EMPTY_THOUGHT[len(THINK_OPEN):]
    if kind == "tags" and knows_tags:
        return prompt + EMPTY_THOUGHT
    return prompt


# OpenAI's roles; "function" is the legacy tool result, kept for history.
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def normalize_messages(messages) -> list[dict]:
    """Validate OpenAI-style messages for a template: text content parts
    flattened to one string, an assistant message's tool_calls kept with
    their arguments parsed (normalize_tool_calls) and its reasoning_content
    (a past thought, for templates that read it), a tool message's
    tool_call_id and name kept, a legacy function result's name kept.
    Raises InvalidParams (param="messages") naming the message and
    field for anything else: no messages, a message that is not an object, a
    role not in ROLES, content that is missing or null (allowed only beside
    an assistant's tool_calls), not a string or not a list of text parts, a
    malformed tool call or tool result, tool_calls outside an assistant
    message, a reasoning_content that is not a string, and the legacy
    function_call."""
    if not isinstance(messages, list) or not messages:
        raise InvalidParams("messages must be a non-empty list", param="messages")
    return [_message(i, m) for i, m in enumerate(messages)]


def _message(i: int, message) -> dict:
    role = _role(i, message)
    if message.get("function_call"):
        raise InvalidParams(f"messages[{i}].function_call is not supported; send tool_calls",
                            param="messages")
    calls = normalize_tool_calls(i, message.get("tool_calls")) if role == "assistant" else []
    if message.get("tool_calls") and role != "assistant":
        raise InvalidParams(f"messages[{i}].tool_calls is only allowed in assistant messages",
                            param="messages")
    content = message.get("content")
    if content is None and not calls:
        raise InvalidParams(f"messages[{i}].content is required for a {role!r} message "
                            "(only an assistant message with tool_calls may omit it)",
                            param="messages")
    out: dict[str, Any] = {"role": role, "content": _content(i, content)}
    thought = message.get("reasoning_content") if role == "assistant" else None
    if thought is not None:
        if not isinstance(thought, str):
            raise InvalidParams(f"messages[{i}].reasoning_content must be a string",
                                param="messages")
        out["reasoning_content"] = thought      # shown where the template reads it
    if calls:
        out["tool_calls"] = calls
    if role == "tool":
        out.update(normalize_tool_result(i, message))
    elif role == "function":
        out["name"] = _function_name(i, message)
    return out


def _role(i: int, message) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
            or not message["role"]:
        raise InvalidParams(f"messages[{i}] must be an object with a string 'role'",
                            param="messages")
    role = message["role"]
    if role not in ROLES:
        raise InvalidParams(f"messages[{i}].role must be one of {', '.join(ROLES)}, got "
                            f"{role[:32]!r}", param="messages")
    return role


def _function_name(i: int, message: dict) -> str:
    # A function result names the function it answers; it has no call id.
    name = message.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidParams(f"messages[{i}].name must name the function a 'function' "
                            "message answers", param="messages")
    return name


def _content(i: int, content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidParams(f"messages[{i}].content must be a string or a list of parts",
                            param="messages")
    texts = []
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            raise InvalidParams(f"{where}: only text content parts are supported",
                                param="messages")
        if not isinstance(part.get("text"), str):
            raise InvalidParams(f"{where}.text must be a string", param="messages")
        texts.append(part["text"])
    return "".join(texts)
