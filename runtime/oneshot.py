"""`llmctl run`: one prompt in, one answer out."""

from __future__ import annotations

import sys
from typing import Callable

from llmctl.runtime.llm import LLM, Completion, LoadOptions
from llmctl.runtime.sampling import SamplingParams


def run_prompt(model: str | None, prompt: str, params: SamplingParams, load: LoadOptions,
               system: str | None = None,
               on_text: Callable[[str], None] | None = None) -> Completion:
    """Answer `prompt` as a single-turn chat, streaming text to `on_text`."""
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": prompt})
    with LLM.load(model, load) as llm:
        return llm.complete(llm.chat_tokens(messages), params, on_text)


def read_prompt(prompt: str) -> str:
    return sys.stdin.read() if prompt == "-" else prompt
