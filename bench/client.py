"""The load generator: streamed /v1/completions requests, timed per token.

Raw completions rather than chat, because a chat template would add tokens
the prompt builder cannot see, and exact input sizes are the point."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlsplit

import httpx

from llmctl.errors import AuthError, ServerUnreachable, UsageError


@dataclass
class Target:
    base: str                 # the OpenAI root, ending in /v1
    model: str
    ignore_eos: bool = True   # the server accepts the ignore_eos extension
    usage: bool = True        # it accepts stream_options.include_usage
    api_key: str | None = None
    chat: bool = False        # prompts go out as one chat message each

    @property
    def path(self) -> str:
        return "/chat/completions" if self.chat else "/completions"

    @property
    def headers(self) -> dict:
        return auth_headers(self.api_key)


@dataclass
class RequestResult:
    index: int
    start: float                  # seconds from the level's start
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)   # gaps between token chunks
    prompt_tokens: int | None = None
    completion_tokens: int | None = None   # from usage; chunk count if none
    usage_reported: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        return asdict(self)


def normalize_url(url: str) -> str:
    """Accept `http://host:port` or `http://host:port/v1` (as Ollama's docs
    write it); return the /v1 root."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"invalid --url {url!r}: expected http://HOST:PORT[/v1]")
    base = url.strip().rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def auth_headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _unreachable(base: str, e: Exception) -> ServerUnreachable:
    reason = str(e) or type(e).__name__
    return ServerUnreachable(f"cannot reach {base}: {reason}")


def discover_model(base: str, model: str | None, api_key: str | None = None,
                   timeout: float = 10.0) -> str:
    """The model to ask for: the one named, else the first the server lists."""
    try:
        r = httpx.get(f"{base}/models", headers=auth_headers(api_key), timeout=timeout)
    except httpx.TransportError as e:
        raise _unreachable(base, e) from e
    if model:
        return model
    try:
        return r.json()["data"][0]["id"] if r.status_code == 200 else "default"
    except (ValueError, KeyError, IndexError, TypeError):
        return "default"


def payload(target: Target, prompt: str, max_tokens: int) -> dict:
    body: dict = {"model": target.model, "max_tokens": max_tokens, "temperature": 0,
                  "stream": True}
    if target.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if target.usage:
        body["stream_options"] = {"include_usage": True}
    if target.ignore_eos:
        body["ignore_eos"] = True
    return body


def probe_features(base: str, model: str, timeout: float, api_key: str | None = None,
                   chat: bool = False) -> Target:
    """Find which extensions the server accepts by asking with each, then
    without; this first request also warms the model up."""
    for ignore_eos, usage in ((True, True), (False, True), (False, False)):
        target = Target(base, model, ignore_eos, usage, api_key, chat)
        try:
            r = httpx.post(base + target.path, json=payload(target, "Hello", 2),
                           headers=target.headers, timeout=timeout)
        except httpx.TransportError as e:
            raise _unreachable(base, e) from e
        if r.status_code in (401, 403):
            raise AuthError(f"{base} refused the request ({_error_text(r.status_code, r.content)});"
                            f" pass --api-key or set LLMCTL_API_KEY")
        # A 5xx says nothing about the fields; the run will count those.
        if not 400 <= r.status_code < 500:
            return target
    if r.status_code == 404:
        raise UsageError(f"{base}{target.path} answers 404: is {base} an OpenAI-compatible "
                         f"server (and is model {model!r} served there)?")
    return target


def _error_text(status: int, body: bytes) -> str:
    try:
        data = json.loads(body)
        err = data.get("error", data)
        message = err.get("message", err) if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        message = body.decode(errors="replace")
    return f"HTTP {status}: {str(message).strip()[:160]}"


def sse_chunks(lines: Iterable[str]) -> Iterator[dict]:
    """The JSON objects of an OpenAI-style server-sent event stream's
    `data:` lines, up to `[DONE]`. Raises ValueError for a data line that is
    not JSON."""
    for line in lines:
        if line == "data: [DONE]":
            return
        if line.startswith("data: "):
            yield json.loads(line[6:])


def stream_chat(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One greedy streamed chat request to an OpenAI-compatible server: its
    text, completion tokens, decode rate (tokens after the first over the
    time after the first) and llama-server's draft counters when it reports
    them. Raises httpx.HTTPStatusError for an error status."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    text, first, last, usage = [], None, None, None
    timings: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=1800) as r:
        r.raise_for_status()
        for chunk in sse_chunks(r.iter_lines()):
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            piece = _chunk_text(chunk)
            if piece:
                now = time.perf_counter()
                first = first or now
                last = now
                text.append(piece)
    n = (usage or {}).get("completion_tokens", 0)
    decode_s = (last - first) if first and last else 0.0
    return {"text": "".join(text), "tokens": n,
            "decode_tok_s": (n - 1) / decode_s if decode_s > 0 else None,
            "drafted": timings.get("draft_n"), "accepted": timings.get("draft_n_accepted")}


def _chunk_text(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    first = choices[0]
    return first.get("text") or (first.get("delta") or {}).get("content") or ""


async def _stream(client: httpx.AsyncClient, target: Target, prompt: str,
                  max_tokens: int, res: RequestResult, t0: float) -> None:
    last = None
    chunks = 0
    async with client.stream("POST", target.base + target.path,
                             json=payload(target, prompt, max_tokens)) as resp:
        if resp.status_code != 200:
            res.error = _error_text(resp.status_code, await resp.aread())
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("error"):
                res.error = _error_text(200, data.encode())
                return
            now = time.perf_counter()
            if chunk.get("usage"):
                res.usage_reported = True
                res.prompt_tokens = chunk["usage"].get("prompt_tokens")
                res.completion_tokens = chunk["usage"].get("completion_tokens")
            if _chunk_text(chunk):
                chunks += 1
                if last is None:
                    res.ttft = now - t0
                else:
                    res.itl.append(now - last)
                last = now
    res.e2e = time.perf_counter() - t0
    if not res.usage_reported:
        res.completion_tokens = chunks
    if res.ttft is None:
        res.error = "no tokens in the response"


async def one_request(client: httpx.AsyncClient, target: Target, index: int,
                      prompt: str, max_tokens: int, level_start: float) -> RequestResult:
    t0 = time.perf_counter()
    res = RequestResult(index=index, start=t0 - level_start)
    try:
        await _stream(client, target, prompt, max_tokens, res, t0)
    except httpx.TimeoutException as e:
        res.error = f"timeout: {type(e).__name__}"
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}"[:200]
    except (ValueError, KeyError, TypeError) as e:
        res.error = f"bad stream: {type(e).__name__}: {e}"[:200]
    return res


async def run_level(target: Target, prompts: list[str], concurrency: int, max_tokens: int,
                    timeout: float, on_done: Callable[[RequestResult], None] | None = None,
                    ) -> tuple[list[RequestResult], float]:
    """Send every prompt, `concurrency` in flight at a time (closed loop).
    Returns the results in prompt order and the wall time until all finished."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(prompts)):
        queue.put_nowait(i)
    results: list[RequestResult | None] = [None] * len(prompts)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, headers=target.headers,
                                 timeout=httpx.Timeout(timeout, connect=30.0)) as client:
        start = time.perf_counter()

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                result = await one_request(client, target, i, prompts[i], max_tokens, start)
                results[i] = result
                if on_done:
                    on_done(result)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
        duration = time.perf_counter() - start
    return [r for r in results if r is not None], duration
