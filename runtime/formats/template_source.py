"""Where a model's chat template comes from, decided in one place: models.toml's
override, the GGUF's own `tokenizer.chat_template`, or, for a GGUF that carries
none, the llama.cpp built-in format its architecture speaks. A model with none
of these is a base model and gets no chat formatting at all: chat is refused
with one line, never guessed (ChatML, the old fallback, leaks its markers into
a model that does not speak it).

Pure Python, like the rest of formats/: the built-in formats are rendered by
runtime/llama/chat_builtin.py, passed in as a renderer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from llmctl.runtime.formats.template import BuiltinRenderer, BuiltinTemplate, ChatTemplate, NoTemplate

Origin = Literal["models.toml", "gguf", "builtin", "none"]

_GEMMA = (("gemma", "<start_of_turn>"),)
_CHATML = (("chatml", "<|im_start|>"),)
# Each architecture's llama.cpp built-in formats, with a turn marker its
# vocabulary must hold as one token: a tokenizer without the marker was not
# trained on that format (a `llama` model may speak Llama 3's, ChatML or none).
BUILTIN_BY_ARCH: dict[str, tuple[tuple[str, str], ...]] = {
    "gemma": _GEMMA, "gemma2": _GEMMA, "gemma3": _GEMMA, "gemma3n": _GEMMA,
    "llama": (("llama3", "<|start_header_id|>"), *_CHATML),
    "llama4": (("llama4", "<|header_start|>"),),
    "phi3": (("phi4", "<|im_sep|>"), ("phi3", "<|user|>")),
    "granite": (("granite", "<|start_of_role|>"),),
    "exaone": (("exaone3", "[|system|]"),),
    "command-r": (("command-r", "<|START_OF_TURN_TOKEN|>"),),
    "cohere2": (("command-r", "<|START_OF_TURN_TOKEN|>"),),
}
# Any other architecture whose vocabulary holds ChatML's marker speaks ChatML
# (Qwen's, SmolLM's and most small instruct models' format).
ANY_ARCH = _CHATML


@dataclass(frozen=True)
class TemplateSource:
    """The chat template a model gets and where it came from: `text` is the
    Jinja source (models.toml, gguf) or the built-in's name (builtin)."""

    origin: Origin
    architecture: str
    text: str | None = None

    def describe(self) -> str:
        """One line for `llmctl show`."""
        if self.origin == "models.toml":
            return "models.toml's template override"
        if self.origin == "gguf":
            return "the GGUF's own chat template"
        if self.origin == "builtin":
            return (f"llama.cpp's built-in {self.text!r} format, for architecture "
                    f"{self.architecture!r} (the GGUF has no chat template)")
        return (f"none: a base model (no chat template in the GGUF, and no llama.cpp "
                f"built-in format for architecture {self.architecture!r} whose turn "
                "markers its vocabulary has)")

    def refusal(self, name: str) -> str:
        """The one line chat is refused with, for a model without a template."""
        return (f"{name} is a base model: its GGUF has no chat template and its vocabulary "
                "speaks none of llama.cpp's built-in chat formats; use `llmctl run --raw` "
                "or /v1/completions")

    def build(self, name: str, renderer: BuiltinRenderer, *, bos_token: str = "",
              eos_token: str = "") -> ChatTemplate:
        """The template to render prompts with: a NoTemplate that refuses
        chat for origin "none". Raises TemplateError for invalid Jinja."""
        if self.origin == "builtin" and self.text:
            return BuiltinTemplate(self.text, renderer, bos_token=bos_token, eos_token=eos_token)
        if self.origin == "none" or not self.text:
            return NoTemplate(self.refusal(name), bos_token=bos_token, eos_token=eos_token)
        return ChatTemplate(self.text, bos_token=bos_token, eos_token=eos_token)


def choose_template(*, override: str | None, gguf: str | None, architecture: str,
                    has_token: Callable[[str], bool]) -> TemplateSource:
    """The template for a model: models.toml's `template`, else the GGUF's
    own, else the first built-in format of its architecture (then ChatML)
    whose marker `has_token` finds in its vocabulary, else none. Raises
    nothing."""
    if override:
        return TemplateSource("models.toml", architecture, override)
    if gguf:
        return TemplateSource("gguf", architecture, gguf)
    for builtin, marker in (*BUILTIN_BY_ARCH.get(architecture, ()), *ANY_ARCH):
        if has_token(marker):
            return TemplateSource("builtin", architecture, builtin)
    return TemplateSource("none", architecture)
