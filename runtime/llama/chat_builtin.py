"""llama.cpp's built-in chat formats (`gemma`, `llama3`, `phi3`, ...), rendered
by llama_chat_apply_template for a GGUF that carries no chat template;
runtime/formats/template_source.py decides which one a model speaks."""

from __future__ import annotations

import ctypes

import llama_cpp as lc

from llmctl.errors import InvalidParams, TemplateError


def builtin_names() -> list[str]:
    """The names of the formats this llama.cpp build knows."""
    n = lc.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    lc.llama_chat_builtin_templates(names, n)
    return [name.decode() for name in names if name]


def render_builtin(name: str, turns: list[tuple[str, str]], add_generation_prompt: bool) -> str:
    """The prompt for (role, content) `turns` in built-in format `name`.
    Raises InvalidParams for a NUL in a message (C strings end there, so the
    rest would vanish unseen) and TemplateError when llama.cpp does not know
    `name`."""
    encoded = []
    for i, (role, content) in enumerate(turns):
        if "\0" in role or "\0" in content:
            raise InvalidParams(f"messages[{i}] holds a NUL character, which llama.cpp's "
                                f"built-in {name!r} chat format cannot render", param="messages")
        encoded.append((role.encode(), content.encode()))
    # The bytes objects stay referenced by `encoded` while llama.cpp reads them.
    chat = (lc.llama_chat_message * len(encoded))(
        *[lc.llama_chat_message(role, content) for role, content in encoded])
    size = 256 + 2 * sum(len(role) + len(content) for role, content in encoded)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = lc.llama_chat_apply_template(name.encode(), chat, len(encoded),
                                         add_generation_prompt, buf, size)
        if n < 0:
            raise TemplateError(f"llama.cpp has no built-in chat format {name!r}")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n
    raise TemplateError(f"llama.cpp's built-in {name!r} format did not fit its buffer")
