"""SamplingParams: every generation knob in one self-validating value, so no
function has to pass fifteen keyword arguments along."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from llmctl.errors import InvalidParams
from llmctl.runtime.formats.grammar_limits import MAX_GRAMMAR_CHARS

# GBNF text is compiled by llama.cpp for every request that carries it; its
# bound is the converter's own (MAX_GRAMMAR_CHARS), so a grammar built from
# a schema always fits.
MAX_TRIGGERS = 16
MAX_LOGIT_BIAS = 1024
# OpenAI allows 20 alternatives per token; each costs a detokenize per step.
MAX_TOP_LOGPROBS = 20
# Integers that llama.cpp takes as a C int (top_k, the penalty window, token
# ids): a larger Python int would wrap, or size an allocation by itself.
INT32_MAX = 2**31 - 1
# A stop string is searched for, and its prefixes matched against the held-back
# tail, after every token: its length bounds that work.
MAX_STOPS = 16
MAX_STOP_CHARS = 256
# Seeds are reduced to llama.cpp's 32 bits; the range is what an int64 or a
# uint64 client may send.
SEED_RANGE = (-2**63, 2**64 - 1)
# (field, lowest, highest, lowest allowed itself): every float knob's range.
# OpenAI documents temperature up to 2; llama-server takes more, and past
# 100 the distribution is as flat as it gets.
_FLOAT_RANGES = (("temperature", 0.0, 100.0, True), ("top_p", 0.0, 1.0, False),
                 ("min_p", 0.0, 1.0, True), ("presence_penalty", -2.0, 2.0, True),
                 ("frequency_penalty", -2.0, 2.0, True), ("repeat_penalty", 0.0, 100.0, False))
# A logit_bias key: ASCII decimal digits only (str.isdigit() also takes "²"
# and other Unicode digits, which int() refuses) and short enough to be an id.
_TOKEN_KEY = re.compile(r"[0-9]{1,10}")


def _number(name: str, value: Any, *, integer: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "an integer" if integer else "a number"
        raise InvalidParams(f"{name} must be {kind}, got {type(value).__name__}", param=name)
    if integer and not isinstance(value, int):
        raise InvalidParams(f"{name} must be an integer, got {value!r}", param=name)
    if not _finite(value):
        raise InvalidParams(f"{name} must be a finite number, got {value!r}", param=name)


def _finite(value: int | float) -> bool:
    # math.isfinite() raises OverflowError on an int too large for a float
    # (JSON may carry 4,300 digits); every int is finite.
    return not isinstance(value, float) or math.isfinite(value)


def _short(value: Any) -> str:
    """repr(value) cut to 20 characters, for error messages; repr() of an
    int over 4,300 digits raises ValueError, so such ints are not shown."""
    if isinstance(value, int) and value.bit_length() > 64:
        return "an integer out of range"
    text = repr(value)
    return text if len(text) <= 20 else text[:20] + "..."


def _integer_in(name: str, value: Any, low: int, high: int | None, note: str = "") -> None:
    _number(name, value, integer=True)
    if value < low or (high is not None and value > high):
        span = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidParams(f"{name} must be {span}" + (f" ({note})" if note else ""), param=name)


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings, stop strings, grammar, logit bias and logprobs.
    Construction normalises `stop`, `grammar_triggers` and `logit_bias`, and raises
    InvalidParams (param: the field) for a wrong type or range, or a bad stop or grammar."""

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
    # End the output once it repeats one block over and over (engine/repetition.py).
    loop_guard: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.grammar_triggers, (list, str)):
            triggers = [self.grammar_triggers] if isinstance(self.grammar_triggers, str) \
                else self.grammar_triggers
            object.__setattr__(self, "grammar_triggers", tuple(triggers))
        object.__setattr__(self, "logit_bias", parse_logit_bias(self.logit_bias))
        self.validate()

    def validate(self) -> None:
        """Raises InvalidParams (param: the field) for a wrong type or a value
        outside its range; docs/limits.md lists the ranges."""
        for name, low, high, closed in _FLOAT_RANGES:
            value = getattr(self, name)
            _number(name, value)
            if not (low <= value if closed else low < value) or value > high:
                lo = "[" if closed else "("
                raise InvalidParams(f"{name} must be in {lo}{low:g}, {high:g}]", param=name)
        _integer_in("top_k", self.top_k, 0, INT32_MAX, "0 disables it")
        _integer_in("repeat_last_n", self.repeat_last_n, 0, INT32_MAX, "0 disables it")
        if self.max_tokens is not None:
            _integer_in("max_tokens", self.max_tokens, 1, None)
        if self.seed is not None:
            _integer_in("seed", self.seed, *SEED_RANGE)
        if self.logprobs is not None:
            _integer_in("logprobs", self.logprobs, 0, MAX_TOP_LOGPROBS)
        if len(self.stop) > MAX_STOPS or not all(
                isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in self.stop):
            raise InvalidParams(f"stop must be up to {MAX_STOPS} non-empty strings of at most "
                                f"{MAX_STOP_CHARS} characters", param="stop")
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


def parse_logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """`value` (a mapping or pairs of token id -> bias, ids possibly as
    decimal strings as OpenAI's JSON sends them) as sorted pairs. Raises
    InvalidParams (param "logit_bias"). Ids are checked against the vocabulary
    when the sampler is built: this value does not know the model."""
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)):
        pairs = list(value)
    else:
        raise InvalidParams(f"logit_bias must map token ids to numbers, got "
                            f"{type(value).__name__}", param="logit_bias")
    if len(pairs) > MAX_LOGIT_BIAS:
        raise InvalidParams(f"logit_bias may hold at most {MAX_LOGIT_BIAS} tokens",
                            param="logit_bias")
    out: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise InvalidParams("logit_bias entries must be (token id, bias) pairs",
                                param="logit_bias")
        token, bias = token_id(pair[0]), pair[1]
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not _finite(bias) or not -100 <= bias <= 100:
            raise InvalidParams(f"logit_bias[{token}] must be a number from -100 to 100, "
                                f"got {_short(bias)}", param="logit_bias")
        out[token] = float(bias)
    return tuple(sorted(out.items()))


def token_id(key: Any) -> int:
    """A logit_bias key as a token id: an int, or its ASCII decimal text, in
    [0, INT32_MAX]. Raises InvalidParams (param "logit_bias") otherwise,
    quoting at most 20 characters of the key."""
    if isinstance(key, str) and _TOKEN_KEY.fullmatch(key):
        key = int(key)
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= INT32_MAX:
        raise InvalidParams(f"logit_bias key {_short(key)} is not a token id (a decimal integer "
                            f"from 0 to {INT32_MAX})", param="logit_bias")
    return key
