"""Request bodies: read and parse JSON from an untrusted client."""

from __future__ import annotations

import json

from fastapi import Request

from llmctl.errors import InvalidParams


async def json_body(request: Request) -> dict:
    """The body as a JSON object. Raises InvalidParams when it is not one."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidParams("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidParams("the request body must be a JSON object")
    return body
