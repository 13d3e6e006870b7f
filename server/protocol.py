"""OpenAI request parsing and response shapes. Parsing is strict about types
so a client's mistake is a 400 that names the parameter, never a 500."""

from __future__ import annotations

import time
import uuid
from typing import Any

from llmctl.errors import InvalidParams
from llmctl.runtime.events import Usage
from llmctl.runtime.sampling import SamplingParams

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


def _typed(body: dict, key: str, types: tuple) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in types:
        raise InvalidParams(f"'{key}' must be a number, got a boolean", param=key)
    if not isinstance(value, types):
        names = " or ".join(t.__name__ for t in types)
        raise InvalidParams(f"'{key}' must be {names}, got {type(value).__name__}", param=key)
    return value


def parse_sampling(body: dict, defaults: SamplingParams) -> SamplingParams:
    values: dict[str, Any] = {}
    for key, name, types in _SAMPLING_FIELDS:
        value = _typed(body, key, types)
        if value is not None:
            values[name] = value
    max_tokens = _typed(body, "max_completion_tokens", (int,))
    if max_tokens is None:
        max_tokens = _typed(body, "max_tokens", (int,))
    if max_tokens is not None:
        if max_tokens < 1:
            raise InvalidParams("'max_tokens' must be at least 1", param="max_tokens")
        values["max_tokens"] = max_tokens
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidParams("'stop' must be a string or a list of strings", param="stop")
        values["stop"] = tuple(s for s in stop if s)
    n = body.get("n", 1)
    if n != 1:
        raise InvalidParams("only n=1 is supported", param="n")
    return defaults.replace(**values)


def stream_options(body: dict) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise InvalidParams("'stream_options' must be an object", param="stream_options")
    return bool(opts.get("include_usage"))


def usage_dict(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


class ResponseIds:
    """The fields every object of one response shares."""

    def __init__(self, model: str, chat: bool):
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self.chat = chat

    def _base(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "llmctl"}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> dict:
        if self.chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**self._base("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self._base("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: Usage) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage_dict(usage)}

    def full(self, text: str, finish: str, usage: Usage) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish}
            return {**self._base("chat.completion"), "choices": [choice],
                    "usage": usage_dict(usage)}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**self._base("text_completion"), "choices": [choice], "usage": usage_dict(usage)}


def finish_reason(reason: str) -> str:
    # "cancelled" never reaches a connected client; map defensively anyway.
    return reason if reason in ("stop", "length") else "stop"
