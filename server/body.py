"""Request bodies: read and parse JSON from an untrusted client, refusing
what Python's json module accepts but no JSON peer could send back or
handle: NaN/Infinity, lone UTF-16 surrogates and absurd nesting. Nesting
is measured on the raw bytes before anything recurses, and a large body
is parsed on a parse worker, off the event loop."""

from __future__ import annotations

import json
import math
import re

from fastapi import Request

from llmctl.errors import InvalidParams

# Deeper than any real request; the walk below is iterative, but code
# further on (templates, json.dumps) recurses.
MAX_DEPTH = 64
# Bodies up to this size parse inline. Measured on this 2-core machine under
# load: parse_json takes ~60 us at 1 KiB, ~0.3 ms at 16 KiB and ~0.9 ms at
# 64 KiB, and a worker hand-off alone ~0.12 ms; at 16 KiB the loop is held
# for no more than a couple of hand-offs.
INLINE_BYTES = 16 << 10
_CONSTANTS = {math.inf: "Infinity", -math.inf: "-Infinity"}
# A bracket or a string's opening quote; the rest of the body is skipped in C.
_STRUCTURE = re.compile(rb'[\[\]{}"]')
# The rest of a string after its opening quote, through the closing one.
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPENS = frozenset(b"[{")


async def json_body(request: Request) -> dict:
    """The body as a JSON object, parsed on the app's parse workers when it
    is large. Raises InvalidParams when it is not one, or holds a non-finite
    number, a lone surrogate or nesting over MAX_DEPTH; PayloadTooLarge
    (from the body cap) propagates."""
    raw = await request.body()
    workers = getattr(getattr(request.app.state, "llmctl", None), "workers", None)
    if len(raw) <= INLINE_BYTES or workers is None:
        return parse_json(raw)
    from llmctl.server.workers import run_on

    return await run_on(workers.parse, parse_json, raw)


def nesting_depth(raw: bytes, limit: int = MAX_DEPTH) -> int:
    """How deeply `raw`'s arrays and objects nest, brackets inside strings
    (escapes included) not counted; the scan stops as soon as it passes
    `limit`, so `[` x 100000 costs limit + 1 steps and no recursion. An
    unterminated string ends the scan (json.loads then refuses it)."""
    return _scan(raw, limit)[0]


def _scan(raw: bytes, limit: int) -> tuple[int, bytes | None]:
    """(nesting_depth, the raw top-level key whose value it is in when it
    passes `limit`, else None)."""
    depth = deepest = 0
    key = None
    pos, find, rest = 0, _STRUCTURE.search, _STRING_REST.match
    while (m := find(raw, pos)) is not None:
        c = raw[m.start()]
        pos = m.end()
        if c == 0x22:           # '"': skip the string whole
            end = rest(raw, pos)
            if end is None:
                break
            if depth == 1 and raw[end.end():end.end() + 64].lstrip()[:1] == b":":
                key = raw[pos:end.end() - 1]      # a key of the body's own object
            pos = end.end()
        elif c in _OPENS:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest, key if depth > 1 else None
        else:
            depth -= 1
    return deepest, None


def parse_json(raw: bytes) -> dict:
    """See json_body; `param` names the top-level field at fault."""
    # The body's own braces are one level more than its fields' MAX_DEPTH:
    # a body within it goes on to the walk, which names the field at fault.
    deepest, key = _scan(raw, MAX_DEPTH + 1)
    if deepest > MAX_DEPTH + 1:
        field = _key_name(key)
        if field is None:
            raise InvalidParams(f"the request body is nested deeper than {MAX_DEPTH} levels")
        raise InvalidParams(f"'{field}' is nested deeper than {MAX_DEPTH} levels", param=field)
    try:
        body = json.loads(raw)
    except RecursionError:
        raise InvalidParams("the request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError):
        raise InvalidParams("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidParams("the request body must be a JSON object")
    for key, value in body.items():
        # The name goes back in the error body, which must itself encode.
        _check(key.encode("utf-8", "backslashreplace").decode("utf-8"), key, value)
    return body


def _key_name(key: bytes | None) -> str | None:
    """A raw JSON key as the text an error may name; None if it isn't one."""
    if key is None:
        return None
    try:
        name = json.loads(b'"' + key + b'"')
    except (ValueError, UnicodeDecodeError):
        return None
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


def _check(field: str, key: str, root) -> None:
    stack = [(key, 0), (root, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidParams(f"'{field}' is nested deeper than {MAX_DEPTH} levels", param=field)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidParams(f"'{field}' holds a lone UTF-16 surrogate (\\ud800-\\udfff)",
                                    param=field) from None
        elif isinstance(value, float) and not math.isfinite(value):
            name = _CONSTANTS.get(value, "NaN")
            raise InvalidParams(f"'{field}' holds {name}: JSON numbers must be finite",
                                param=field)
        elif isinstance(value, dict):
            stack.extend((k, depth + 1) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
