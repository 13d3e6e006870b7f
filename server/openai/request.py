"""OpenAI's completion requests, parsed: strict about types, so a client's
mistake is a 400 that names the parameter, never a 500."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from llmctl.errors import InvalidParams
from llmctl.runtime.sampling import MAX_TOP_LOGPROBS, SamplingParams
from llmctl.server.fields import ThinkingAsk, effort_thinking, parse_sampling, typed_field
from llmctl.server.tool_protocol import Structured, parse_structured

# Choices per request: each is a sequence in the batch, so this bounds what
# one request can take from everyone else.
MAX_CHOICES = 16


def _given(value: Any) -> bool:
    return value is not None


# OpenAI fields llmctl does not implement, each with the test for a value
# that asks for something (null, and the values that mean "off", pass).
# Dropping them silently would hand the client an answer it did not ask for.
_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "functions": _given,
    "function_call": _given,
    "audio": _given,
    "modalities": lambda v: v not in (None, ["text"]),
    "echo": lambda v: v is not None and v is not False,
    "suffix": lambda v: v not in (None, ""),
}


def parse_n(body: dict) -> int:
    """How many choices to generate (`n`). best_of is accepted only where it
    changes nothing (equal to n): ranking by log-probability is not built.
    Raises InvalidParams naming the field."""
    n = typed_field(body, "n", (int,))
    n = 1 if n is None else n
    if not 1 <= n <= MAX_CHOICES:
        raise InvalidParams(f"'n' must be in [1, {MAX_CHOICES}]", param="n")
    best_of = typed_field(body, "best_of", (int,))
    if best_of is not None and best_of != n:
        raise InvalidParams("'best_of' other than 'n' is not supported by llmctl",
                            param="best_of")
    return n


def parse_logprobs(body: dict, chat: bool) -> int | None:
    """SamplingParams.logprobs for a request: None when not asked for, else
    how many alternatives each token reports. Chat takes `logprobs: true`
    with `top_logprobs`; completions take `logprobs: N`. Raises
    InvalidParams naming the field."""
    if not chat:
        if body.get("top_logprobs") not in (None, 0):
            raise InvalidParams("'top_logprobs' is a chat field; /v1/completions takes "
                                "'logprobs': N", param="top_logprobs")
        # false is what "off" looks like to clients that send every field.
        n = None if body.get("logprobs") is False else typed_field(body, "logprobs", (int,))
    else:
        wanted = typed_field(body, "logprobs", (bool,))
        n = typed_field(body, "top_logprobs", (int,))
        if n is not None and not wanted:
            raise InvalidParams("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        n = (n or 0) if wanted else None
    key = "top_logprobs" if chat else "logprobs"
    if n is not None and not 0 <= n <= MAX_TOP_LOGPROBS:
        raise InvalidParams(f"'{key}' must be in [0, {MAX_TOP_LOGPROBS}]", param=key)
    return n


def stream_options(body: dict) -> bool:
    """Whether the client asked for a final usage chunk."""
    opts = typed_field(body, "stream_options", (dict,))
    if opts is None:
        return False
    include = opts.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise InvalidParams("'stream_options.include_usage' must be a boolean",
                            param="stream_options")
    return bool(include)


def parse_common(body: dict) -> tuple[str | None, bool, bool]:
    """(model, stream, include_usage) of a completion request; model is None
    when absent, null or empty. Raises InvalidParams naming the field."""
    model = typed_field(body, "model", (str,))
    stream = typed_field(body, "stream", (bool,))
    return model or None, bool(stream), stream_options(body)


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise InvalidParams("'prompt' is required", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
        return list(prompt)
    if not isinstance(prompt, str):
        raise InvalidParams("'prompt' must be a string, a one-string list or token ids",
                            param="prompt")
    return prompt


@dataclass(frozen=True)
class ParsedRequest:
    """A validated /v1/chat/completions or /v1/completions request."""

    model: str | None               # None: whatever this server serves
    stream: bool
    include_usage: bool
    n: int                          # choices, each sampled with its own seed
    params: SamplingParams          # with logprobs set when they were asked for
    structured: Structured          # tools, tool_choice, response_format, logit_bias
    messages: list | None           # chat: as sent; LLM.chat_tokens validates them
    prompt: str | list[int] | None  # completions: text, or token ids >= 0 (the
                                    # caller checks them against the vocabulary)
    keep_alive: object = None       # Ollama's field, as sent; ServerState.lease checks it
    think: ThinkingAsk = ThinkingAsk()  # chat: reasoning_effort, for the template


def parse_request(body: dict, chat: bool, defaults: SamplingParams) -> ParsedRequest:
    """Validate a whole completion request. Raises InvalidParams with `param`
    naming the field: a wrong type, a value out of range, a missing
    messages/prompt, a reasoning_effort outside OpenAI's (or on a
    completion), or a field llmctl does not implement (logprobs,
    n > 1, ...). Fields that change nothing (user, metadata, store, ...)
    are accepted."""
    for key, asks in _UNSUPPORTED.items():
        if asks(body.get(key)):
            raise InvalidParams(f"'{key}' is not supported by llmctl yet", param=key)
    model, stream, include_usage = parse_common(body)
    n = parse_n(body)
    params = parse_sampling(body, defaults).replace(logprobs=parse_logprobs(body, chat))
    structured = parse_structured(body, chat)
    head = (model, stream, include_usage, n, params, structured)
    effort = typed_field(body, "reasoning_effort", (str,))
    if chat:
        if body.get("messages") is None:
            raise InvalidParams("'messages' is required", param="messages")
        return ParsedRequest(*head, body["messages"], None, body.get("keep_alive"),
                             effort_thinking(effort, "reasoning_effort"))
    if effort is not None:
        raise InvalidParams("'reasoning_effort' is a chat field: a prompt has no template "
                            "to think in", param="reasoning_effort")
    return ParsedRequest(*head, None, _prompt(body), body.get("keep_alive"))
