"""Request bodies: read and parse JSON from an untrusted client, refusing
what Python's json module accepts but no JSON peer could send back or
handle: NaN/Infinity, lone UTF-16 surrogates and absurd nesting. Nesting
is measured on the raw bytes, at C speed, before anything recurses, and a
large body is parsed on a body worker, off the event loop, under a
deadline."""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import re
import threading

import numpy as np
from fastapi import Request

from llmctl.errors import InvalidParams
from llmctl.server.workers import QUEUE_PER_WORKER, DaemonExecutor, run_with_deadline
from llmctl.settings import Settings

# Deeper than any real request; the walk below is iterative, but code
# further on (templates, json.dumps) recurses.
MAX_DEPTH = 64
# Bodies up to this size parse inline: parsing one costs the loop no more
# than a couple of hand-offs to a worker would, and larger ones cost more.
INLINE_BYTES = 16 << 10
_CONSTANTS = {math.inf: "Infinity", -math.inf: "-Infinity"}
# A whole string, escapes included; each becomes one STRING byte before the
# brackets are counted, so brackets inside strings never count.
_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STRING = b"\x01"          # never valid outside a JSON string
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# What could parse to a non-finite float or a lone surrogate: NaN, Infinity,
# an exponent or a 309-digit number (1e999 is inf), a \\uD800-\\uDFFF
# escape or UTF-8-encoded surrogate bytes (json.loads passes them). A body
# with none of them skips the Python walk; strings may match (harmlessly).
_MAYBE_BAD = re.compile(rb"NaN|Infinity|[0-9][eE]|[0-9]{309}|\\[uU][dD][89a-fA-F]|\xed[\xa0-\xbf]")
_KEY_END = re.compile(rb"\x01\s*:\s*$")


async def json_body(request: Request) -> dict:
    """The body as a JSON object, parsed on the app's body workers when it
    is large. Raises InvalidParams when it is not one, holds a non-finite
    number, a lone surrogate or nesting over MAX_DEPTH, or takes its worker
    past the deadline; ServerBusy when the body workers are too busy to
    start it; PayloadTooLarge (from the body cap) propagates."""
    raw = await request.body()
    workers = getattr(getattr(request.app.state, "llmctl", None), "workers", None)
    if workers is None:     # an app without the server's state: the defaults' lane
        return await parse_body(raw, *_default_lane())
    return await parse_body(raw, workers.body, workers.body_deadline_s)


_default: list[tuple[DaemonExecutor, float]] = []
_default_lock = threading.Lock()


def body_lane(settings: Settings) -> tuple[DaemonExecutor, float]:
    """Body workers and their deadline for a process without Workers (the
    cluster ingress): `workers_body` threads, 4 calls queued per thread."""
    size = settings.workers_body
    return DaemonExecutor("llmctl-body", size, QUEUE_PER_WORKER * size), settings.body_deadline_s


def _default_lane() -> tuple[DaemonExecutor, float]:
    with _default_lock:
        if not _default:
            _default.append(body_lane(Settings()))
        return _default[0]


async def parse_body(raw: bytes, executor: cf.Executor, deadline_s: float) -> dict:
    """parse_json(raw): inline up to INLINE_BYTES, else on `executor`
    under `deadline_s`, counted from when a worker starts it. Raises what
    parse_json raises, InvalidParams past the deadline and ServerBusy when
    the executor is too busy to start it."""
    if len(raw) <= INLINE_BYTES:
        return parse_json(raw)
    try:
        return await run_with_deadline(executor, deadline_s, parse_json, raw)
    except TimeoutError:
        raise InvalidParams(f"the request body took longer than {deadline_s:g} s to "
                            "parse") from None


def nesting_depth(raw: bytes, limit: int = MAX_DEPTH) -> int:
    """How deeply `raw`'s arrays and objects nest, brackets inside strings
    (escapes included) not counted, capped at `limit` + 1; an unterminated
    string ends the count (json.loads then refuses it). Every step runs in
    C (re, bytes.translate, numpy): no recursion, and no Python loop over
    the body."""
    return min(_scan(raw, limit)[0], limit + 1)


def _strip(raw: bytes) -> bytes:
    """`raw` with each string as one _STRING byte, cut at an unterminated one."""
    text = _STRING_RE.sub(_STRING, raw)
    cut = text.find(b'"')       # a quote no string matched: the rest is unterminated
    return text if cut < 0 else text[:cut]


def _depths(text: bytes) -> np.ndarray:
    """The nesting depth after each of `text`'s bytes (its brackets only)."""
    a = np.frombuffer(text, np.uint8)
    return np.cumsum(np.where((a == 0x5B) | (a == 0x7B), 1, -1).astype(np.int32))


def _scan(raw: bytes, limit: int) -> tuple[int, bytes | None]:
    """(nesting depth, the raw top-level key whose value it is in when it
    passes `limit`, else None)."""
    text = _strip(raw)
    brackets = text.translate(None, _NOT_BRACKETS)
    if len(brackets) <= limit:      # too few to nest past it
        return (int(_depths(brackets).max(initial=0)), None)
    deepest = int(_depths(brackets).max(initial=0))
    if deepest <= limit:
        return deepest, None
    return deepest, _deep_key(raw, text, limit)


def _deep_key(raw: bytes, text: bytes, limit: int) -> bytes | None:
    """The raw top-level key (of the body's own object) whose value nests
    past `limit`; None when the body is no object or the key is not found.
    Only bodies already refused come here."""
    a = np.frombuffer(text, np.uint8)
    is_bracket = (a == 0x5B) | (a == 0x7B) | (a == 0x5D) | (a == 0x7D)
    if not is_bracket.any() or a[is_bracket.argmax()] != 0x7B:
        return None             # the body is not an object
    depth = np.cumsum(np.where((a == 0x5B) | (a == 0x7B), 1,
                               np.where(is_bracket, -1, 0)).astype(np.int32))
    past = int(np.argmax(depth > limit))
    # The last bracket before `past` that opened a top-level field's value.
    opened = np.flatnonzero((depth[:past + 1] == 2) & ((a[:past + 1] == 0x5B)
                                                       | (a[:past + 1] == 0x7B)))
    if not len(opened):
        return None
    start = int(opened[-1])
    m = _KEY_END.search(text, max(0, start - 4096), start)
    if m is None:
        return None
    nth = text.count(_STRING, 0, m.start())     # the key is raw's string number nth
    # Skip nth strings and what lies between them, all in one C match.
    skip = re.compile(rb'(?:[^"]*' + _STRING_RE.pattern + rb"){%d}[^\"]*" % nth, re.DOTALL)
    at = skip.match(raw)
    key = _STRING_RE.match(raw, at.end()) if at else None
    return key.group()[1:-1] if key else None


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
    # The walk counts a field's innermost scalar as a level too, so only a
    # body that nests to MAX_DEPTH + 1 may still be too deep for it.
    if deepest <= MAX_DEPTH and _MAYBE_BAD.search(raw) is None:
        return body             # nothing the walk looks for can be there
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
