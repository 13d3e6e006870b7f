"""What the engine tells a request's consumer, in order: zero or more
TokenEvents, then exactly one FinishEvent or ErrorEvent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmctl.errors import LlmctlError

if TYPE_CHECKING:
    from llmctl.runtime.engine.logprobs import TokenLogprob


@dataclass
class Usage:
    """One request's token counts: prompt, completion, and the prompt tokens
    reused from the prefix cache."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class TokenEvent:
    """Output text as it is released, with the token that released it and,
    with logprobs, the log-probabilities of the tokens the text comes from."""

    text: str
    token: int
    # With SamplingParams.logprobs: the tokens whose text this event
    # releases (text held back for UTF-8 or a stop string comes later).
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class FinishEvent:
    """A request's end: why it stopped, its usage and timings, and the text
    (and its tokens' logprobs) held back until then."""

    reason: str                 # "stop", "length", "loop" (the loop guard) or "cancelled"
    usage: Usage
    ttft_s: float               # arrival to first token
    duration_s: float           # arrival to finish
    decode_s: float = 0.0       # first token to finish
    tail: str = ""              # text released at the end (held-back bytes)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the tail's tokens
    stop: str | None = None     # the stop string that ended it; None for end of text

    @property
    def tokens_per_s(self) -> float:
        n = self.usage.completion_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


@dataclass
class ErrorEvent:
    """A request's failure: the LlmctlError it ends with."""

    error: LlmctlError


# What a request's `emit` callback is given.
Event = TokenEvent | FinishEvent | ErrorEvent
