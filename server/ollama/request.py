"""Ollama's request fields, validated and translated into what the runtime
takes: `options` into SamplingParams, `format` and `tools` into a
Structured (the same path as OpenAI's response_format and tools), Ollama's
messages into OpenAI-style ones, `think` into a reasoning format. Every
mistake is an InvalidParams naming the field; an option llmctl cannot
honour is refused by name, never dropped. Errors on /api/* routes leave in
Ollama's shape, {"error": "..."}, through OllamaRoute."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from llmctl.errors import InvalidParams, LlmctlError
from llmctl.runtime.sampling import INT32_MAX, SamplingParams
from llmctl.server.errors import retry_headers
from llmctl.server.fields import parse_sampling, typed_field
from llmctl.server.keep_alive import request_keep_alive
from llmctl.server.tool_protocol import Structured, parse_structured

log = logging.getLogger("llmctl.server")

# The roles Ollama's API documents for /api/chat messages.
OLLAMA_ROLES = ("system", "user", "assistant", "tool")
# Ollama's options that are also OpenAI body fields of the same meaning:
# protocol.parse_sampling checks them under their own names.
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "repeat_penalty",
             "presence_penalty", "frequency_penalty")


def _given(value: Any) -> bool:
    return True


# Options llmctl has no equivalent for, each with the test for a value that
# asks for something; the values that mean "off" pass.
_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    **dict.fromkeys(("num_keep", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap",
                     "draft_num_predict", "mirostat_tau", "mirostat_eta"), _given),
    **dict.fromkeys(("numa", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mlock",
                     "embedding_only", "penalize_newline"), lambda v: v is not False),
    "mirostat": lambda v: v != 0,
    "tfs_z": lambda v: v != 1,
    "typical_p": lambda v: v != 1,
}


class OllamaRoute(APIRoute):
    """A route whose failures answer in Ollama's shape, {"error": message},
    with the status the error type maps to (core/errors.py)."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def route(request: Request):
            try:
                return await handler(request)
            except LlmctlError as e:
                return error(e.message, e.http_status, retry_headers(e))
            except HTTPException as e:
                return error(str(e.detail), e.status_code, getattr(e, "headers", None))
            except Exception as e:
                log.exception("internal error")
                return error(f"internal error: {type(e).__name__}", 500)

        return route


def error(message: str, status: int, headers: dict | None = None) -> JSONResponse:
    """Ollama's error response: {"error": message} with `status`."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def rfc3339(when: float | None = None) -> str:
    """`when` (Unix seconds; now when None) as Ollama writes times: RFC 3339
    in UTC with the fraction."""
    moment = datetime.now(timezone.utc) if when is None else \
        datetime.fromtimestamp(when, timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


def far_future() -> str:
    """Ollama's expiry of a model kept forever: now plus the longest Go duration."""
    return (datetime.now(timezone.utc) + timedelta(microseconds=(2**63 - 1) // 1000)) \
        .isoformat().replace("+00:00", "Z")


def ns(seconds: float) -> int:
    """Ollama's durations are integer nanoseconds."""
    return max(int(seconds * 1e9), 0)


@dataclass(frozen=True)
class Options:
    """A request's `options`: the sampling parameters, the num_ctx asked
    for, and repeat_last_n as sent (-1 meaning the whole context, as in
    Ollama; None: the server's default)."""

    params: SamplingParams
    num_ctx: int | None = None
    repeat_last_n: int | None = None
    num_predict: int | None = None      # as a limit: None also for -1 and -2

    def for_context(self, n_ctx: int) -> SamplingParams:
        """The parameters on a model with `n_ctx` tokens per sequence. A
        repeat_last_n of -1 or over n_ctx becomes n_ctx: no sequence holds
        more tokens, so the window means the same, and llama.cpp sizes the
        penalty's buffer by it. Raises InvalidParams when num_ctx asks for
        more than n_ctx, or num_predict more than it could ever hold (a
        num_predict that fits n_ctx but not beside the prompt is the
        engine's ContextOverflow)."""
        for key, value in (("num_ctx", self.num_ctx), ("num_predict", self.num_predict)):
            if value is not None and value > n_ctx:
                raise InvalidParams(f"options: '{key}' {value} is over the {n_ctx} tokens this "
                                    "model is loaded with; restart the server with a larger "
                                    "--ctx-size", param=f"options.{key}")
        n = self.repeat_last_n
        if n is None:
            return self.params
        return self.params.replace(repeat_last_n=n_ctx if n == -1 or n > n_ctx else n)


def parse_options(raw: Any, defaults: SamplingParams) -> Options:
    """Ollama's `options` over the server's `defaults`. Raises InvalidParams
    naming the option: a wrong type or range (docs/limits.md), an unknown
    option, or one llmctl does not implement (mirostat, num_gpu, ...)."""
    if raw is None:
        return Options(defaults)
    if not isinstance(raw, dict):
        raise InvalidParams("'options' must be an object", param="options")
    body: dict[str, Any] = {}
    num_predict = None
    for key, value in raw.items():
        if value is None or key in ("num_ctx", "repeat_last_n"):
            continue
        if key == "seed" and type(value) is int and value < 0:
            continue                    # Ollama's -1: a random seed, llmctl's default
        if key in _SAMPLING:
            body[key] = value
        elif key == "num_predict":
            body["max_tokens"] = num_predict = _num_predict(raw)
        elif key in _UNSUPPORTED:
            if _UNSUPPORTED[key](value):
                raise InvalidParams(f"option '{key}' is not supported by llmctl",
                                    param=f"options.{key}")
        else:
            raise InvalidParams(f"unknown option '{_shown(key)}'", param=f"options.{_shown(key)}")
    num_ctx = _option_int(raw, "num_ctx", 1, "at least 1")
    repeat_last_n = _option_int(raw, "repeat_last_n", -1,
                                "-1 (the context), 0 (off) or a window of tokens")
    try:
        return Options(parse_sampling(body, defaults), num_ctx, repeat_last_n, num_predict)
    except InvalidParams as e:
        raise InvalidParams(f"options: {e.message}", param=f"options.{e.param}") from None


def _option_int(raw: dict, key: str, low: int, meaning: str) -> int | None:
    """raw[key] as an integer in [low, INT32_MAX] (llama.cpp takes both as a
    C int), None when absent. Raises InvalidParams naming options.key."""
    try:
        value = typed_field(raw, key, (int,))
    except InvalidParams as e:
        raise InvalidParams(f"options: {e.message}", param=f"options.{key}") from None
    if value is not None and not low <= value <= INT32_MAX:
        raise InvalidParams(f"options: '{key}' must be {meaning}, at most {INT32_MAX}",
                            param=f"options.{key}")
    return value


def _shown(key: str) -> str:
    # An unknown option's name goes back in the error; a client may send 8 MB of it.
    return key if len(key) <= 64 else key[:64] + "..."


def _num_predict(raw: dict) -> int | None:
    """max_tokens for Ollama's num_predict: -1 (and -2, "fill the
    context") mean no limit. Raises InvalidParams naming options.num_predict."""
    try:
        n = typed_field(raw, "num_predict", (int,))
    except InvalidParams as e:
        raise InvalidParams(f"options: {e.message}", param="options.num_predict") from None
    if n in (-1, -2):
        return None
    if n < 1:
        raise InvalidParams("options: 'num_predict' must be at least 1, or -1 for no limit",
                            param="options.num_predict")
    return n


def parse_structured_fields(body: dict, tools: Any = None) -> Structured:
    """`format` ("json" or a JSON schema) and `tools` as a Structured.
    Raises InvalidParams naming `format` or `tools`."""
    fmt = body.get("format")
    response_format: dict | None
    if fmt in (None, ""):
        response_format = None
    elif fmt == "json":
        response_format = {"type": "json_object"}
    elif isinstance(fmt, dict):
        response_format = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    else:
        raise InvalidParams("'format' must be \"json\" or a JSON schema object", param="format")
    try:
        return parse_structured({"tools": tools, "response_format": response_format}, chat=True)
    except InvalidParams as e:
        if e.param != "response_format":
            raise
        raise InvalidParams(e.message.replace("response_format", "format"), param="format") from None


def keep_alive_is_zero(raw: Any) -> bool:
    """Whether a request's keep_alive asks to unload at once. Raises
    InvalidParams for a value parse_keep_alive refuses."""
    return request_keep_alive(raw) == 0


def parse_think(body: dict) -> bool | None:
    """`think`: None (the server's --reasoning-format decides), or a
    boolean. Ollama's levels ("low", "high", ...) are refused by name:
    llmctl cannot set how long a model thinks."""
    think = body.get("think")
    if think is None or isinstance(think, bool):
        return think
    raise InvalidParams("'think' must be a boolean; thinking levels are not supported by llmctl",
                        param="think")


def reasoning_format(think: bool | None, thinks: bool, model: str) -> str | None:
    """The reasoning format for `think` on a model that `thinks` (or not):
    true splits the thought into `thinking`; false is refused for a model
    that thinks, since llmctl cannot stop it. Raises InvalidParams."""
    if think is None:
        return None
    if think and not thinks:
        raise InvalidParams(f"{model!r} does not support thinking", param="think")
    if not think and thinks:
        raise InvalidParams(f"'think': false is not supported for {model!r}: llmctl cannot stop "
                            "this model from thinking", param="think")
    return "deepseek" if think else "none"


def common_fields(body: dict) -> tuple[str | None, bool]:
    """(model, stream) of a generation request; Ollama streams unless told
    not to. Raises InvalidParams naming the field."""
    model = typed_field(body, "model", (str,))
    stream = typed_field(body, "stream", (bool,))
    return model or None, stream is not False


def chat_messages(messages: Any) -> list[dict]:
    """Ollama's messages as OpenAI's, for LLM.chat_tokens (which validates
    the rest): a missing or null content is "" (Ollama's default), tool
    calls get ids where they have none, a tool result is tied to the call it
    answers by `tool_name`, a past `thinking` is left out (templates drop
    past thoughts too). Raises InvalidParams for images, a role other than
    OLLAMA_ROLES, and anything that is not a list of objects."""
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise InvalidParams("'messages' must be a list", param="messages")
    out: list[dict] = []
    unanswered: list[tuple[str, str | None]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidParams(f"messages[{i}] must be an object", param="messages")
        if message.get("images"):
            raise InvalidParams(f"messages[{i}].images: images are not supported by llmctl "
                                "(text models only)", param="images")
        m = {k: v for k, v in message.items() if k not in ("images", "thinking", "tool_name")}
        m["role"] = _ollama_role(i, m.get("role"))
        if m.get("content") is None:
            m["content"] = ""
        if isinstance(m.get("tool_calls"), list):
            m["tool_calls"] = [_with_id(call, f"call_{i}_{j}", unanswered)
                               for j, call in enumerate(m["tool_calls"])]
        if m.get("role") == "tool":
            name = message.get("tool_name")
            if not m.get("tool_call_id"):
                m["tool_call_id"] = _answered(unanswered, name) or f"call_{i}"
            if isinstance(name, str):
                m["name"] = name
        out.append(m)
    return out


def _ollama_role(i: int, role: Any) -> str:
    """messages[i].role, lower-cased. Ollama hands any other role to its
    template, where most templates drop the message unseen; llmctl refuses
    it instead of answering a conversation the model never saw."""
    if isinstance(role, str) and role.lower() in OLLAMA_ROLES:
        return role.lower()
    shown = role[:32] if isinstance(role, str) else role if role is None else type(role).__name__
    raise InvalidParams(f"messages[{i}].role must be one of {', '.join(OLLAMA_ROLES)}, "
                        f"got {shown!r}", param="messages")


def _with_id(call: Any, new_id: str, unanswered: list[tuple[str, str | None]]) -> Any:
    if not isinstance(call, dict):
        return call             # normalize_tool_calls names the mistake
    call = call if call.get("id") else {**call, "id": new_id}
    fn = call.get("function")
    unanswered.append((call["id"], fn.get("name") if isinstance(fn, dict) else None))
    return call


def _answered(unanswered: list[tuple[str, str | None]], name: Any) -> str | None:
    """The id of the earliest unanswered call to `name` (to any, without a
    name), taken off the list."""
    for k, (call_id, called) in enumerate(unanswered):
        if name is None or called == name:
            del unanswered[k]
            return call_id
    return None


@dataclass(frozen=True)
class GeneratePrompt:
    """/api/generate's prompt: its text, and whether it goes through the
    chat template (with `system`) or to the model as it is (`raw`)."""

    prompt: str
    system: str | None
    raw: bool

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": "user", "content": self.prompt}]


def parse_generate_prompt(body: dict) -> GeneratePrompt:
    """The prompt fields of /api/generate. suffix (fill-in-the-middle),
    template, context and images are refused by name; so are system and
    template in raw mode, as Ollama does. Raises InvalidParams."""
    for key, why in (("suffix", "fill-in-the-middle"),
                     ("template", "llmctl renders the model's own chat template"),
                     ("context", "send the conversation to /api/chat instead"),
                     ("images", "text models only")):
        if body.get(key) not in (None, "", []):
            raise InvalidParams(f"'{key}' is not supported by llmctl ({why})", param=key)
    prompt = typed_field(body, "prompt", (str,)) or ""
    system = typed_field(body, "system", (str,))
    raw = bool(typed_field(body, "raw", (bool,)))
    if raw and system:
        raise InvalidParams("raw mode does not support template, system, or context", param="raw")
    return GeneratePrompt(prompt, system, raw)
