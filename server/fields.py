"""Request fields every protocol reads alike: a field checked against the
JSON types it may have (a wrong one is a 400 naming it, never a 500), and
the sampling parameters under their OpenAI names, which Ollama's options
share."""

from __future__ import annotations

import math
from typing import Any

from llmctl.errors import InvalidParams
from llmctl.runtime.sampling import MAX_STOPS, SamplingParams

_NUMBER = (int, float)
# (body key, SamplingParams field, accepted types)
_SAMPLING_FIELDS = [
    ("temperature", "temperature", _NUMBER),
    ("top_p", "top_p", _NUMBER),
    ("top_k", "top_k", (int,)),
    ("min_p", "min_p", _NUMBER),
    ("presence_penalty", "presence_penalty", _NUMBER),
    ("frequency_penalty", "frequency_penalty", _NUMBER),
    ("repeat_penalty", "repeat_penalty", _NUMBER),
    ("seed", "seed", (int,)),
    ("ignore_eos", "ignore_eos", (bool,)),
]


def typed_field(body: dict, key: str, types: tuple) -> Any:
    """body[key] if it has one of `types`; None when absent or null (OpenAI:
    null means the default). Raises InvalidParams naming `key` otherwise."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in types:
        raise InvalidParams(f"'{key}' must be {_names(types)}, got a boolean", param=key)
    if not isinstance(value, types):
        raise InvalidParams(f"'{key}' must be {_names(types)}, got {_json_type(value)}",
                            param=key)
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidParams(f"'{key}' must be a finite number", param=key)
    return value


def _names(types: tuple) -> str:
    if types == _NUMBER:
        return "a number"
    return " or ".join({int: "an integer", bool: "a boolean", str: "a string",
                        dict: "an object", list: "an array"}[t] for t in types)


def _json_type(value: Any) -> str:
    return {str: "a string", dict: "an object", list: "an array", int: "an integer",
            float: "a number", bool: "a boolean"}.get(type(value), type(value).__name__)


def parse_sampling(body: dict, defaults: SamplingParams) -> SamplingParams:
    """The sampling parameters of a request over `defaults`. Raises
    InvalidParams (param: the field) for a wrong type or value out of range
    (SamplingParams checks the ranges; docs/limits.md lists them)."""
    values: dict[str, Any] = {}
    for key, name, types in _SAMPLING_FIELDS:
        value = typed_field(body, key, types)
        if value is not None:
            values[name] = value
    # max_completion_tokens is OpenAI's newer name; it wins when both are set.
    for key in ("max_tokens", "max_completion_tokens"):
        max_tokens = typed_field(body, key, (int,))
        if max_tokens is not None:
            if max_tokens < 1:
                raise InvalidParams(f"'{key}' must be at least 1", param=key)
            values["max_tokens"] = max_tokens
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidParams("'stop' must be a string or a list of strings", param="stop")
        if len(stop) > MAX_STOPS:     # counted before empty strings are dropped
            raise InvalidParams(f"'stop' may hold at most {MAX_STOPS} strings", param="stop")
        values["stop"] = tuple(s for s in stop if s)
    return defaults.replace(**values)
