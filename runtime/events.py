"""What the engine tells a request's consumer, in order: zero or more
TokenEvents, then exactly one FinishEvent or ErrorEvent."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import LlmctlError


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class TokenEvent:
    text: str
    token: int


@dataclass
class FinishEvent:
    reason: str                 # "stop", "length" or "cancelled"
    usage: Usage
    ttft_s: float               # arrival to first token
    duration_s: float           # arrival to finish
    decode_s: float = 0.0       # first token to finish
    tail: str = ""              # text released at the end (held-back bytes)

    @property
    def tokens_per_s(self) -> float:
        n = self.usage.completion_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


@dataclass
class ErrorEvent:
    error: LlmctlError
