"""Ollama's keep_alive: how long a model stays loaded after its last
request, as a number of seconds or a Go-style duration, within the range
Ollama itself accepts. Every protocol's requests may send it, and `serve
--keep-alive` takes the same forms; the pool takes only seconds."""

from __future__ import annotations

import re

from llmctl.errors import InvalidParams
from llmctl.runtime.pool.room import FOREVER

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
# The longest keep-alive: Go's longest time.Duration (2^63 - 1 ns, about 292
# years), the most Ollama itself accepts ("99999999h" is an error there
# too). Anything longer is a mistake, not a wish for a longer forever: -1
# keeps a model loaded forever in both.
MAX_KEEP_ALIVE_S = (2**63 - 1) / 1e9


def parse_keep_alive(value: object) -> float:
    """Seconds from Ollama's keep_alive forms: a number of seconds, or a
    duration such as "5m", "90s", "1h30m"; any negative value means forever
    (FOREVER). Raises ValueError naming the accepted forms, and for more
    than MAX_KEEP_ALIVE_S."""
    if isinstance(value, bool):
        raise ValueError("must be a number of seconds or a duration like '5m'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        seconds = _duration(value.strip())
    else:
        raise ValueError("must be a number of seconds or a duration like '5m'")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError("must be finite")
    if seconds > MAX_KEEP_ALIVE_S:
        raise ValueError(f"must be at most {MAX_KEEP_ALIVE_S:.0f} seconds (about 292 years, "
                         "Ollama's longest duration); use -1 to keep the model loaded forever")
    return FOREVER if seconds < 0 else seconds


def _duration(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text.lstrip("-"))
    if not parts or "".join(n + u for n, u in parts) != text.lstrip("-"):
        raise ValueError(f"{text!r} is not a duration (use e.g. 30s, 5m, 1h, -1)")
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


def request_keep_alive(raw: object) -> float | None:
    """Seconds (FOREVER: -1) from a request's `keep_alive`; None when absent.
    Raises InvalidParams naming the field."""
    if raw is None:
        return None
    try:
        return parse_keep_alive(raw)
    except ValueError as e:
        raise InvalidParams(f"'keep_alive' {e}", param="keep_alive") from None
