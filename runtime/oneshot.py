"""`llmctl run`: one prompt in, one answer out."""

from __future__ import annotations

from typing import Callable

from llmctl.runtime.llm import LLM, Completion, LoadOptions
from llmctl.runtime.sampling import SamplingParams


def run_prompt(model: str | None, prompt: str, params: SamplingParams, load: LoadOptions,
               system: str | None = None,
               on_text: Callable[[str], None] | None = None) -> Completion:
    """Answer `prompt` as a single-turn chat, streaming text to `on_text`.
    Raises ModelNotFound/BadModelFile for a bad model reference and the
    engine's LlmctlError (e.g. ContextOverflow) when generation fails."""
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": prompt})
    with LLM.load(model, load) as llm:
        return llm.complete(llm.chat_tokens(messages), params, on_text)
