"""SamplingParams: every generation knob in one self-validating value, so no
function has to pass fifteen keyword arguments along."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from llmctl.errors import InvalidParams

# GBNF text is compiled by llama.cpp for every request that carries it; a
# schema-derived grammar is a few KiB, so this only stops abuse.
MAX_GRAMMAR_CHARS = 200_000
MAX_TRIGGERS = 16
MAX_LOGIT_BIAS = 1024
# OpenAI allows 20 alternatives per token; each costs a detokenize per step.
MAX_TOP_LOGPROBS = 20


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
    # GBNF text whose rule `root` the output must match (llama.cpp grammar).
    grammar: str | None = None
    # When set, the grammar is lazy: output is free until one of these strings
    # appears, and from that string on (itself included) it must match `root`.
    grammar_triggers: tuple[str, ...] = field(default_factory=tuple)
    # (token id, bias added to its logit), sorted by id; a dict is accepted.
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    # None: no log-probabilities; k >= 0: each token's, with its k best rivals.
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.grammar_triggers, (list, str)):
            triggers = [self.grammar_triggers] if isinstance(self.grammar_triggers, str) \
                else self.grammar_triggers
            object.__setattr__(self, "grammar_triggers", tuple(triggers))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
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
        if self.logprobs is not None:
            _number("logprobs", self.logprobs, integer=True)
            if not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
                raise InvalidParams(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}]",
                                    param="logprobs")
        if len(self.stop) > 16 or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidParams("stop must be up to 16 non-empty strings", param="stop")
        self._validate_grammar()

    def _validate_grammar(self) -> None:
        if self.grammar is not None:
            if not isinstance(self.grammar, str) or not self.grammar.strip():
                raise InvalidParams("grammar must be non-empty GBNF text", param="response_format")
            if len(self.grammar) > MAX_GRAMMAR_CHARS:
                raise InvalidParams(f"grammar is over {MAX_GRAMMAR_CHARS:,} characters",
                                    param="response_format")
            if self.ignore_eos:
                # A completed grammar allows only end-of-generation tokens.
                raise InvalidParams("ignore_eos cannot be combined with a grammar",
                                    param="ignore_eos")
        if self.grammar_triggers:
            if self.grammar is None:
                raise InvalidParams("grammar triggers need a grammar", param="response_format")
            if len(self.grammar_triggers) > MAX_TRIGGERS or not all(
                    isinstance(t, str) and t for t in self.grammar_triggers):
                raise InvalidParams(f"grammar triggers must be up to {MAX_TRIGGERS} "
                                    "non-empty strings", param="response_format")

    @property
    def constrained(self) -> bool:
        return self.grammar is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def replace(self, **changes: Any) -> "SamplingParams":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({k: v for k, v in changes.items() if v is not None})
        return SamplingParams(**values)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """`value` (a mapping or pairs of token id -> bias, ids possibly as
    decimal strings as OpenAI's JSON sends them) as sorted pairs. Raises
    InvalidParams (param "logit_bias"). Ids are checked against the vocabulary
    when the sampler is built: this value does not know the model."""
    def bad(why: str) -> InvalidParams:
        return InvalidParams(f"logit_bias {why}", param="logit_bias")

    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)):
        pairs = list(value)
    else:
        raise bad(f"must map token ids to numbers, got {type(value).__name__}")
    if len(pairs) > MAX_LOGIT_BIAS:
        raise bad(f"may hold at most {MAX_LOGIT_BIAS} tokens")
    out: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise bad("entries must be (token id, bias) pairs")
        token, bias = pair
        if isinstance(token, str) and token.strip().isdigit():
            token = int(token)
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise bad(f"keys must be token ids (non-negative integers), got {token!r}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not math.isfinite(bias) or not -100 <= bias <= 100:
            raise bad(f"values must be numbers in [-100, 100], got {bias!r} for token {token}")
        out[token] = float(bias)
    return tuple(sorted(out.items()))
