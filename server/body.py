"""Request bodies: read and parse JSON from an untrusted client, refusing
what Python's json module accepts but no JSON peer could send back or
handle: NaN/Infinity, lone UTF-16 surrogates and absurd nesting."""

from __future__ import annotations

import json
import math

from fastapi import Request

from llmctl.errors import InvalidParams

# Deeper than any real request; the walk below is iterative, but code
# further on (templates, json.dumps) recurses.
MAX_DEPTH = 64
_CONSTANTS = {math.inf: "Infinity", -math.inf: "-Infinity"}


async def json_body(request: Request) -> dict:
    """The body as a JSON object. Raises InvalidParams when it is not one, or
    holds a non-finite number, a lone surrogate or nesting over MAX_DEPTH;
    PayloadTooLarge (from the body cap) propagates."""
    return parse_json(await request.body())


def parse_json(raw: bytes) -> dict:
    """See json_body; `param` names the top-level field at fault."""
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
