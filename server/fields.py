"""Request fields every protocol reads alike: a field checked against the
JSON types it may have (a wrong one is a 400 naming it, never a 500), and
the sampling parameters under their OpenAI names, which Ollama's options
share."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from fastapi.responses import Response

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


@dataclass(frozen=True)
class ThinkingAsk:
    """A request's word on the model's thought: on, off, or None for the
    template's default, and the request fields that asked for a thought.
    The choice is applied where the model's template thinks
    (ChatTemplate.render). Those fields are listed among the request's
    ignored ones when parsed, since on a model whose template does not
    think they have nothing to map to; `named` takes them out again where
    the template thinks."""

    on: bool | None = None
    fields: tuple[str, ...] = ()

    def named(self, ignored: Sequence[str], thinks: bool) -> list[str]:
        """`ignored` as the response names it on a model whose template
        thinks (or not): without this ask's fields where they were applied.
        Raises nothing."""
        return [f for f in ignored if not (thinks and f in self.fields)]


# OpenAI's reasoning efforts (Chat Completions' reasoning_effort, Responses'
# reasoning.effort): none and minimal ask a model to answer without a thought.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def effort_thinking(effort: str | None, name: str) -> ThinkingAsk:
    """The ThinkingAsk of an OpenAI reasoning effort (None: not given) sent
    as field `name`; one that asks for a thought names `name` in its
    fields. Raises InvalidParams naming `name` for a value not in
    EFFORTS."""
    if effort is None:
        return ThinkingAsk()
    if effort not in EFFORTS:
        raise InvalidParams(f"'{name}' must be one of {', '.join(EFFORTS)}",
                            param=name.split(".")[0])
    on = effort not in ("none", "minimal")
    return ThinkingAsk(on, (name,) if on else ())


# One header, one spelling, in every protocol: what a request asked for
# that llmctl accepted without applying, as request paths
# (`reasoning.effort`, `thinking.budget_tokens`), a hosted tool as
# `tools.<type>` (docs/serve.md).
IGNORED_HEADER = "x-llmctl-ignored"


def name_ignored(response: Response, names: Iterable[str], route: str) -> Response:
    """`response` with `names` (if any) in IGNORED_HEADER, each once, and in
    the log under `route`."""
    unique = ", ".join(dict.fromkeys(names))
    if unique:
        response.headers[IGNORED_HEADER] = unique
        logging.getLogger("llmctl.server").info("%s: accepted without applying: %s", route, unique)
    return response


# A request turns the loop guard (runtime/engine/repetition.py) on or off
# for itself; without the header, the server's `--loop-guard` decides.
LOOP_GUARD_HEADER = "x-llmctl-loop-guard"
_SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def loop_guard(headers: Mapping[str, str], default: bool) -> bool:
    """Whether the request's output ends once it repeats itself. Raises
    InvalidParams naming the header for a value other than on/off."""
    value = headers.get(LOOP_GUARD_HEADER)
    if value is None:
        return default
    switch = _SWITCH.get(value.strip().lower())
    if switch is None:
        raise InvalidParams(f"header {LOOP_GUARD_HEADER} must be on or off, got {value[:20]!r}",
                            param=LOOP_GUARD_HEADER)
    return switch
