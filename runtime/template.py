"""Chat templates from GGUF metadata, rendered in Jinja2's sandbox.

A model file is untrusted input: llama-cpp-python once rendered templates in
a plain Environment, and a crafted GGUF could run code (CVE-2024-34359).
The immutable sandbox refuses attribute tricks such as __class__/__globals__."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache

from jinja2 import TemplateError as JinjaTemplateError
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llmctl.errors import InvalidParams, TemplateError

# Used when a GGUF carries no template: ChatML is what most small
# instruction-tuned models (SmolLM2 and Qwen among them) were trained on.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str) -> None:
    raise TemplateError(f"chat template refused the conversation: {message}")


@lru_cache(maxsize=8)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except JinjaTemplateError as e:
        raise TemplateError(f"invalid chat template: {e}") from e


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = ""):
        self.source = source or CHATML
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(self.source)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except SecurityError as e:
            raise TemplateError(f"chat template tried to escape the sandbox: {e}") from e
        except Exception as e:  # any Jinja runtime error in untrusted code
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e


def normalize_messages(messages) -> list[dict]:
    """Validate OpenAI-style messages; flatten text content parts to one
    string. Raises InvalidParams (param="messages") for anything else: no
    messages, a message that is not an object, a missing or non-string role,
    content that is not a string, null or list of text parts, and tool
    calls, which llmctl does not implement."""
    if not isinstance(messages, list) or not messages:
        raise InvalidParams("messages must be a non-empty list", param="messages")
    return [{"role": _role(i, m), "content": _content(i, m.get("content"))}
            for i, m in enumerate(messages)]


def _role(i: int, message) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
            or not message["role"]:
        raise InvalidParams(f"messages[{i}] must be an object with a string 'role'",
                            param="messages")
    for key in ("tool_calls", "function_call"):
        if message.get(key):
            raise InvalidParams(f"messages[{i}].{key} is not supported by llmctl yet",
                                param="messages")
    return message["role"]


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
