"""`llmctl run`: one prompt in, one answer out."""

from __future__ import annotations

from typing import Callable

from llmctl.errors import UsageError
from llmctl.runtime.llm import LLM, Completion, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.store.install import ensure_installed


def run_prompt(model: str | None, prompt: str, params: SamplingParams, load: LoadOptions,
               system: str | None = None,
               on_text: Callable[[str], None] | None = None, *, raw: bool = False) -> Completion:
    """Answer `prompt` as a single-turn chat, or continue it as plain text
    when `raw` (no chat template: what a base model serves), streaming text
    to `on_text`. Raises UsageError for a system prompt with `raw`,
    ModelNotFound/BadModelFile for a bad model reference, InvalidParams for
    chat with a model that has no chat format, what installing a registry
    model's packages on first use raises (InstallError), and the engine's
    LlmctlError (e.g. ContextOverflow) when generation fails."""
    if raw and system:
        raise UsageError("--system needs the chat template, which --raw leaves out")
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": prompt})
    ensure_installed(model)     # `llmctl run` is the command line: it may install
    with LLM.load(model, load) as llm:
        tokens = llm.text_tokens(prompt) if raw else llm.chat_tokens(messages)
        return llm.complete(tokens, params, on_text)
