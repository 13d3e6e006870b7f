"""The clients of the fault-load benchmark (scripts/load_faults.py): healthy
chat requests, clients that hang up mid-request, and a side stream of
malformed and oversized bodies, all tallied by request kind.

Every request has a timeout and every phase a fixed request count, so a load
is bounded whatever the server does."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

CLIENTS = 32                # the first half stream, the second half do not
HANGUP_MAX_TOKENS = 384     # long enough that generation outlives the hang-up
HANGUP_CHUNKS = 3           # streaming hang-ups close after this many chunks
HANGUP_TIMEOUT_S = 0.7      # non-streaming hang-ups give up after this
BAD_TIMEOUT_S = 60.0
OVERSIZED_BYTES = 10 * 1024 * 1024
MAX_SAMPLES = 10            # 5xx bodies kept for the report
TOPICS = ("a lighthouse keeper", "a lost robot", "the first city on Mars", "a river",
          "an old clock", "a chess match", "a dragon who hates gold", "a night train")


def is_streaming(client: int) -> bool:
    return client < CLIENTS // 2


def hangs_up(client: int) -> bool:
    """A third of the clients (11 of 32: 6 streaming, 5 not) hang up."""
    return client % 3 == 0


def healthy_clients() -> list[int]:
    return [c for c in range(CLIENTS) if not hangs_up(c)]


def quota(position: int, requests: int, clients: int) -> int:
    """The share of REQUESTS of the client at POSITION among CLIENTS: an even
    split, so the request mix is the client mix (11 hang-ups in 32) whatever
    the clients' speeds."""
    return requests // clients + (position < requests % clients)


class Progress:
    """How many healthy requests a phase has started, out of how many.
    Hang-ups and bad bodies pace themselves by it, so they are spread over
    the whole phase rather than all sent at its start (a hang-up takes
    0.7 s, a healthy request many seconds)."""

    def __init__(self, total: int):
        self.total, self.issued = total, 0

    async def reach(self, fraction: float) -> None:
        """Return once FRACTION (< 1) of the healthy requests have started."""
        while self.issued < min(fraction, 1.0) * self.total:
            await asyncio.sleep(0.05)


@dataclass
class Tally:
    """What came back, by request kind (stream, nonstream, hangup-stream,
    hangup-nonstream, bad:NAME)."""

    max_tokens: int
    statuses: dict[str, Counter] = field(default_factory=dict)
    server_errors: list[dict] = field(default_factory=list)
    healthy_done: int = 0
    exact_tokens: int = 0
    usage_missing: int = 0
    healthy_tokens: int = 0
    last_healthy_end: float = 0.0

    def record(self, kind: str, status: int | str, body: bytes | str = b"") -> None:
        self.statuses.setdefault(kind, Counter())[str(status)] += 1
        is_5xx = isinstance(status, int) and status >= 500
        if (is_5xx or status == "stream-error") and len(self.server_errors) < MAX_SAMPLES:
            text = body.decode(errors="replace") if isinstance(body, bytes) else body
            self.server_errors.append({"kind": kind, "status": status, "body": text[:300]})

    def healthy(self, kind: str, usage: dict | None, chunks: int) -> None:
        """A healthy request that completed: usage's completion_tokens when
        the server reported it, else the count of content chunks."""
        self.record(kind, 200)
        tokens = usage.get("completion_tokens") if usage else None
        if tokens is None:
            self.usage_missing += 1
            tokens = chunks
        self.healthy_done += 1
        self.exact_tokens += tokens == self.max_tokens
        self.healthy_tokens += tokens
        self.last_healthy_end = time.perf_counter()

    def count_5xx(self) -> dict[str, int]:
        """5xx responses (and errors sent inside a 200 stream) per kind."""
        out = {kind: sum(n for s, n in c.items() if s.startswith("5") or s == "stream-error")
               for kind, c in self.statuses.items()}
        return {kind: n for kind, n in out.items() if n}


def chat_body(model: str, n: int, max_tokens: int, stream: bool) -> dict:
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream, "messages": [{"role": "user", "content":
                                            f"Request {n}. Tell a long story about "
                                            f"{TOPICS[n % len(TOPICS)]}."}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _sse_json(line: str) -> dict | None:
    """The JSON of one SSE data line; None for other lines and [DONE]."""
    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
        return None
    return json.loads(line[5:])


def _has_content(chunk: dict) -> bool:
    choices = chunk.get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


async def _stream(http: httpx.AsyncClient, url: str, body: dict, tally: Tally,
                  hang_up: bool) -> None:
    kind = "hangup-stream" if hang_up else "stream"
    async with http.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            tally.record(kind, resp.status_code, await resp.aread())
            return
        chunks, usage = 0, None
        async for line in resp.aiter_lines():
            chunk = _sse_json(line)
            if chunk is None:
                continue
            if "error" in chunk:
                tally.record(kind, "stream-error", json.dumps(chunk))
                return
            usage = chunk.get("usage") or usage
            chunks += _has_content(chunk)
            if hang_up and chunks >= HANGUP_CHUNKS:
                tally.record(kind, "hung-up")
                return   # leaving the block closes the connection mid-stream
    if hang_up:
        tally.record(kind, "finished")   # ended before the hang-up point
    else:
        tally.healthy(kind, usage, chunks)


async def _plain(http: httpx.AsyncClient, url: str, body: dict, tally: Tally,
                 hang_up: bool) -> None:
    kind = "hangup-nonstream" if hang_up else "nonstream"
    try:
        resp = await http.post(url, json=body, timeout=HANGUP_TIMEOUT_S if hang_up
                               else httpx.USE_CLIENT_DEFAULT)
    except httpx.TimeoutException:
        if not hang_up:
            raise
        tally.record(kind, "hung-up")
        return
    if resp.status_code != 200 or hang_up:
        tally.record(kind, resp.status_code, resp.content)
        return
    tally.healthy(kind, resp.json().get("usage"), 0)


async def client(http: httpx.AsyncClient, url: str, model: str, index: int, count: int,
                 progress: Progress, tally: Tally) -> None:
    """Client INDEX: send its COUNT requests one after another."""
    hang_up, stream = hangs_up(index), is_streaming(index)
    kind = ("hangup-" if hang_up else "") + ("stream" if stream else "nonstream")
    for k in range(count):
        if hang_up:
            await progress.reach((k + 1) / (count + 1))
        else:
            progress.issued += 1
        body = chat_body(model, k * CLIENTS + index,
                         HANGUP_MAX_TOKENS if hang_up else tally.max_tokens, stream)
        try:
            await (_stream if stream else _plain)(http, url, body, tally, hang_up)
        except httpx.TimeoutException:
            tally.record(kind, "timeout")
        except (httpx.HTTPError, ValueError) as e:
            tally.record(kind, f"client-error:{type(e).__name__}")


def bad_bodies(model: str) -> list[tuple[str, bytes]]:
    """One of each malformed body, and one oversized, as raw request bytes."""
    msg = [{"role": "user", "content": "hi"}]

    def js(**fields) -> bytes:
        return json.dumps({"model": model, "max_tokens": 8, **fields}).encode()

    return [
        ("invalid-json", b'{"messages": [{"role": "user", "content": "hi"}'),
        ("temperature-str", js(messages=msg, temperature="hot")),
        ("messages-not-list", js(messages="hi")),
        ("temperature-nan", js(messages=msg)[:-1] + b', "temperature": NaN}'),
        ("content-number", js(messages=[{"role": "user", "content": 5}])),
        ("max-tokens-str", js(messages=msg, max_tokens="many")),
        ("stream-str", js(messages=msg, stream="yes")),
        ("oversized-10mb", js(messages=[{"role": "user", "content": "x " * (OVERSIZED_BYTES // 2)}])),
    ]


async def bad_stream(http: httpx.AsyncClient, url: str, model: str, rounds: int,
                     progress: Progress, tally: Tally) -> None:
    """ROUNDS of every bad body, spread over the phase."""
    items = bad_bodies(model) * rounds
    for i, (name, content) in enumerate(items):
        await progress.reach(i / len(items))
        try:
            resp = await http.post(url, content=content, timeout=BAD_TIMEOUT_S,
                                   headers={"Content-Type": "application/json"})
            tally.record(f"bad:{name}", resp.status_code, resp.content)
        except httpx.TimeoutException:
            tally.record(f"bad:{name}", "timeout")
        except httpx.HTTPError as e:
            tally.record(f"bad:{name}", f"client-error:{type(e).__name__}")


async def run_phase(http: httpx.AsyncClient, base: str, model: str, requests: int,
                    max_tokens: int, faults: bool, bad_rounds: int = 0) -> tuple[Tally, float]:
    """REQUESTS chat requests split over every client (FAULTS) or over the
    healthy ones only; returns the tally and the healthy clients' output
    tok/s (from the phase's start to the last healthy response)."""
    url = base + "/v1/chat/completions"
    clients = list(range(CLIENTS)) if faults else healthy_clients()
    counts = {c: quota(i, requests, len(clients)) for i, c in enumerate(clients)}
    tally = Tally(max_tokens)
    progress = Progress(sum(n for c, n in counts.items() if not hangs_up(c)))
    start = time.perf_counter()
    tasks = [client(http, url, model, c, n, progress, tally) for c, n in counts.items()]
    if faults and bad_rounds:
        tasks.append(bad_stream(http, url, model, bad_rounds, progress, tally))
    await asyncio.gather(*tasks)
    wall = (tally.last_healthy_end or time.perf_counter()) - start
    return tally, tally.healthy_tokens / wall if wall > 0 else 0.0
