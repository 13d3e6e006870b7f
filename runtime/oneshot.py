"""`llmctl run`: one prompt in, one answer out."""

from __future__ import annotations

import sys
from typing import Callable

from llmctl.runtime.events import TokenEvent
from llmctl.runtime.llm import LLM, Completion, LoadOptions
from llmctl.runtime.sampling import SamplingParams


def run_prompt(model: str | None, prompt: str, params: SamplingParams, load: LoadOptions,
               system: str | None = None,
               on_text: Callable[[str], None] | None = None) -> Completion:
    """Answer `prompt` as a single-turn chat, streaming text to `on_text`."""
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": prompt})
    with LLM.load(model, load) as llm:
        tokens = llm.chat_tokens(messages)
        parts: list[str] = []
        for event in llm.stream(tokens, params):
            text = event.text if isinstance(event, TokenEvent) else event.tail
            if text:
                parts.append(text)
                if on_text:
                    on_text(text)
            if not isinstance(event, TokenEvent):
                return Completion("".join(parts), event.reason, event.usage, event.ttft_s,
                                  event.tokens_per_s, event.duration_s)
    raise RuntimeError("generation ended without a finish event")


def read_prompt(prompt: str) -> str:
    return sys.stdin.read() if prompt == "-" else prompt
