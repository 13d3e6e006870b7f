"""Requests that once hung, wedged, exhausted or crashed `llmctl serve`, as a
catalogue: each is a few hundred bytes to a few megabytes, and each must now
get a 4xx (or a normal answer) quickly without hurting anyone else.

scripts/load_attacks.py sends them one per second beside healthy clients;
tests/test_server_fuzz.py reuses the schemas. Every request carries its own
timeout, so a server that still hangs costs the sender that timeout, never
more."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

ATTACK_TIMEOUT_S = 30.0     # a hang shows as "timeout", not as a stuck load
HANGUP_AFTER_S = 1.0        # the embeddings attack leaves after this

# 1. A $ref cycle inside allOf (once an endless loop on the event loop).
CYCLE_SCHEMA = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]}

# 2. Eight ambiguous recursive alternatives: llama.cpp's grammar keeps one
# parse stack per live alternative, so each "[" multiplies them.
WEDGE_SCHEMA = {"$ref": "#/$defs/n", "$defs": {"n": {"anyOf": [
    {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}] * 8}}}


def big_schema() -> dict:
    """3. anyOf x1999 beside a 13,000-value enum: about 99 KB."""
    return {"enum": list(range(13_000)), "anyOf": [{} for _ in range(1999)]}


def _chat(model: str, **fields: Any) -> dict:
    return {"model": model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hi."}], **fields}


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}


def _tool(schema: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": schema}}]


def _ollama(model: str, **fields: Any) -> dict:
    return {"model": model, "stream": False, "options": {"num_predict": 4},
            "messages": [{"role": "user", "content": "Say hi."}], **fields}


@dataclass(frozen=True)
class Attack:
    """One request of the catalogue: its finding's number and a name."""

    finding: int
    name: str
    method: str
    path: str
    body: Any = None            # JSON-encoded unless it is bytes
    leave_after_s: float | None = None

    def content(self) -> bytes | None:
        if self.body is None or isinstance(self.body, bytes):
            return self.body
        return json.dumps(self.body).encode()


def catalogue(model: str) -> list[Attack]:
    """Every attack against MODEL. Finding 4 (waits for a second model's
    room) is left to its test: under load it would load and evict models,
    which is the pool doing its job, not an attack on it."""
    nested_args = "[" * 100_000 + "]" * 100_000
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": nested_args}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    eight_mb = json.dumps(_chat(model, messages=[
        {"role": "user", "content": "x " * ((4 << 20) - 1024)}])).encode()   # just under the cap
    chat, api = "/v1/chat/completions", "/api/chat"
    return [
        Attack(1, "cycle-response-format", "POST", chat,
               _chat(model, response_format=_schema_format(CYCLE_SCHEMA))),
        Attack(1, "cycle-tool-parameters", "POST", chat,
               _chat(model, tools=_tool(CYCLE_SCHEMA), tool_choice="required")),
        Attack(1, "cycle-ollama-format", "POST", api, _ollama(model, format=CYCLE_SCHEMA)),
        Attack(2, "ambiguous-recursion", "POST", chat,
               _chat(model, max_tokens=16, response_format=_schema_format(WEDGE_SCHEMA))),
        Attack(3, "99kb-schema", "POST", chat,
               _chat(model, response_format=_schema_format(big_schema()))),
        Attack(5, "embeddings-then-leave", "POST", "/v1/embeddings",
               {"model": model, "input": ["word " * 900] * 16}, leave_after_s=HANGUP_AFTER_S),
        Attack(6, "8mb-body", "POST", chat, eight_mb),
        Attack(7, "repeat-last-n-huge", "POST", api,
               _ollama(model, options={"repeat_last_n": 250_000_000, "num_predict": 4})),
        Attack(7, "num-ctx-huge", "POST", api,
               _ollama(model, options={"num_ctx": 2**31 - 1, "num_predict": 4})),
        Attack(9, "keep-alive-forever", "POST", api, _ollama(model, keep_alive="99999999h")),
        Attack(9, "ps-after-keep-alive", "GET", "/api/ps"),
        Attack(10, "logit-bias-unicode-digit", "POST", chat, _chat(model, logit_bias={"²": 1})),
        Attack(10, "logit-bias-5000-digits", "POST", chat,
               _chat(model, logit_bias={"9" * 5000: 1})),
        Attack(10, "tool-arguments-100k-brackets", "POST", chat, _chat(model, messages=history)),
        Attack(11, "role-wizard", "POST", chat,
               _chat(model, messages=[{"role": "wizard", "content": "hi"}])),
        Attack(11, "user-without-content", "POST", chat, _chat(model, messages=[{"role": "user"}])),
        Attack(12, "model-is-a-path", "POST", chat, _chat("scripts/llmctl")),
        Attack(12, "model-is-a-gguf-dir", "POST", chat, _chat("x.gguf/")),
    ]


async def send(http: httpx.AsyncClient, base: str, attack: Attack,
               timeout_s: float = ATTACK_TIMEOUT_S) -> str:
    """The status the attack got, as text: a code, "left" (it hung up on
    purpose), "timeout" or the client error's name. `timeout_s`: longer
    where a valid request may wait its turn behind a burst."""
    timeout = attack.leave_after_s or timeout_s
    try:
        resp = await http.request(attack.method, base + attack.path, content=attack.content(),
                                  headers={"Content-Type": "application/json"}, timeout=timeout)
    except httpx.TimeoutException:
        return "left" if attack.leave_after_s else "timeout"
    except httpx.HTTPError as e:
        return f"client-error:{type(e).__name__}"
    return str(resp.status_code)


async def send_all(http: httpx.AsyncClient, base: str, attacks: list[Attack]) -> dict[str, str]:
    """Each attack once, concurrently: name -> status."""
    results = await asyncio.gather(*(send(http, base, a) for a in attacks))
    return {a.name: r for a, r in zip(attacks, results, strict=False)}
