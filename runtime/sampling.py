"""SamplingParams: every generation knob in one self-validating value, so no
function has to pass fifteen keyword arguments along."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from llmctl.errors import InvalidParams


def _number(name: str, value: Any, *, integer: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "an integer" if integer else "a number"
        raise InvalidParams(f"{name} must be {kind}, got {type(value).__name__}", param=name)
    if integer and not isinstance(value, int):
        raise InvalidParams(f"{name} must be an integer, got {value!r}", param=name)
    if not math.isfinite(value):
        raise InvalidParams(f"{name} must be a finite number, got {value!r}", param=name)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    max_tokens: int | None = None       # None: until the context is full
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        self.validate()

    def validate(self) -> None:
        for name in ("temperature", "top_p", "min_p", "presence_penalty",
                     "frequency_penalty", "repeat_penalty"):
            _number(name, getattr(self, name))
        for name in ("top_k", "repeat_last_n"):
            _number(name, getattr(self, name), integer=True)
        if self.temperature < 0:
            raise InvalidParams("temperature must be >= 0", param="temperature")
        if not 0 < self.top_p <= 1:
            raise InvalidParams("top_p must be in (0, 1]", param="top_p")
        if not 0 <= self.min_p <= 1:
            raise InvalidParams("min_p must be in [0, 1]", param="min_p")
        if self.top_k < 0:
            raise InvalidParams("top_k must be >= 0 (0 disables it)", param="top_k")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise InvalidParams(f"{name} must be in [-2, 2]", param=name)
        if self.repeat_penalty <= 0:
            raise InvalidParams("repeat_penalty must be > 0", param="repeat_penalty")
        if self.max_tokens is not None:
            _number("max_tokens", self.max_tokens, integer=True)
            if self.max_tokens < 1:
                raise InvalidParams("max_tokens must be >= 1", param="max_tokens")
        if self.seed is not None:
            _number("seed", self.seed, integer=True)
        if len(self.stop) > 16 or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidParams("stop must be up to 16 non-empty strings", param="stop")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def replace(self, **changes: Any) -> "SamplingParams":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({k: v for k, v in changes.items() if v is not None})
        return SamplingParams(**values)
