"""/v1/chat/completions and /v1/completions: translate an HTTP request into
one LLM.open_stream call and its events into one JSON body or server-sent
events. The runtime owns generation, cancellation and statistics; this file
only watches the connection and writes frames."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from llmctl import config
from llmctl.errors import InvalidParams
from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, TokenEvent, Usage
from llmctl.runtime.formats.reasoning import THINK_OPEN, opens_thought
from llmctl.runtime.llm import LLM, AsyncStream
from llmctl.runtime.pool.model_pool import Lease
from llmctl.runtime.sampling import SamplingParams
from llmctl.server import errors
from llmctl.server.body import json_body
from llmctl.server.chat_output import ChatShaper
from llmctl.server.openai.choices import ChoiceWriter
from llmctl.server.protocol import ParsedRequest, ResponseIds, parse_request
from llmctl.server.state import ServerState, leased, state_of
from llmctl.server.workers import converting_field, parse_within_deadline, run_on

router = APIRouter()

# A comment line this often while nothing else is sent (a long CPU prefill),
# so proxies and clients with read timeouts don't cut the stream.
KEEPALIVE_S = float(config.env("SSE_KEEPALIVE_S", "15"))


@router.post("/v1/chat/completions")
async def chat(request: Request):
    return await _generate(request, chat=True)


@router.post("/v1/completions")
async def completions(request: Request):
    return await _generate(request, chat=False)


def _prompt_tokens(llm: LLM, req: ParsedRequest) -> list[int]:
    if req.messages is not None:
        return llm.chat_tokens(req.messages, req.structured.tools)
    if isinstance(req.prompt, str):
        return llm.text_tokens(req.prompt)
    if not all(t < llm.model.n_vocab for t in req.prompt):
        raise InvalidParams("'prompt' has token ids outside the vocabulary", param="prompt")
    return list(req.prompt)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _generate(request: Request, chat: bool) -> Response:
    state = state_of(request)
    body = await json_body(request)
    # Converting schemas to grammars is CPU work of unbounded cost: never on
    # the loop, and a 400 past the deadline.
    req = await parse_within_deadline(
        state.workers, converting_field(body, ("response_format", "tools")),
        parse_request, body, chat, state.defaults)
    lease = await state.lease(req.model, req.keep_alive)
    return await leased(lease, _respond(request, state, req, lease, chat))


async def _respond(request: Request, state: ServerState, req: ParsedRequest, lease: Lease,
                   chat: bool) -> Response:
    """The response on a leased model; a streaming one releases the lease
    when its stream ends."""
    llm = lease.llm
    fmt = llm.template.tool_format
    # Tools become a grammar only now, for this model's format: off the loop too.
    params = await parse_within_deadline(state.workers, "tools" if req.structured.tools else None,
                                         req.structured.sampling, req.params, fmt)
    # Rendering and tokenizing a large prompt takes a while: off the loop.
    tokens = await run_on(state.workers.render, _prompt_tokens, llm, req)
    streams = _open_streams(llm, tokens, params, req.n)
    watcher = asyncio.create_task(cancel_on_disconnect(request, streams))
    setup = req.structured.setup(
        fmt, state.reasoning_format, thinks=THINK_OPEN in llm.template.source,
        started_in_thought=chat and opens_thought(llm.model.detokenize(tokens[-8:])))
    writers = [ChoiceWriter(i, ChatShaper(setup) if chat else None,
                            params.logprobs is not None) for i in range(req.n)]
    reply = _Reply(ResponseIds(lease.name, chat), writers, req.include_usage)
    if req.stream:
        # The stream releases the lease when it ends; the background task
        # also does, should the stream never start (release is idempotent).
        return StreamingResponse(_stream(_Merged(streams), watcher, reply, lease),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"},
                                 background=BackgroundTask(lease.release))
    try:
        return await _collect(_Merged(streams), reply)
    finally:
        watcher.cancel()
        _close(streams)


def _open_streams(llm: LLM, tokens: list[int], params: SamplingParams,
                  n: int) -> list[AsyncStream]:
    """n requests for one prompt, submitted together so the prefix sharing
    computes the prompt once. A request seed gives choice i seed + i: the
    same answers on a rerun, not n copies of one answer."""
    streams: list[AsyncStream] = []
    try:
        for i in range(n):
            seed = None if params.seed is None else (params.seed + i) & 0xFFFFFFFF
            streams.append(llm.open_stream(tokens, params if i == 0 else
                                           params.replace(seed=seed)))
    except BaseException:
        _close(streams)
        raise
    return streams


def _close(streams: list[AsyncStream]) -> None:
    for stream in streams:
        stream.close()


async def cancel_on_disconnect(request: Request, streams: list[AsyncStream]) -> None:
    """Cancel the request the moment its client hangs up, streaming or not:
    an abandoned request must not hold a slot until it would have ended."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            _close(streams)
            return


class _Merged:
    """The events of n streams as (choice index, event) pairs in arrival
    order. One stream is read directly; several through a pump task each."""

    def __init__(self, streams: list[AsyncStream]):
        self.streams = streams
        self._queue: asyncio.Queue | None = None
        self._pumps: list[asyncio.Task] = []

    @property
    def done(self) -> bool:
        return all(s.done for s in self.streams) and (self._queue is None
                                                       or self._queue.empty())

    async def next_batch(self, timeout: float | None = None) -> list[tuple[int, object]]:
        """Raises asyncio.TimeoutError when nothing comes within `timeout`."""
        if len(self.streams) == 1:
            return [(0, e) for e in await self.streams[0].next_batch(timeout)]
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._pumps = [asyncio.create_task(self._pump(i, s))
                           for i, s in enumerate(self.streams)]
        async with asyncio.timeout(timeout or None):
            batch = [await self._queue.get()]
        while not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch

    async def _pump(self, index: int, stream: AsyncStream) -> None:
        while not stream.done:
            for event in await stream.next_batch():
                self._queue.put_nowait((index, event))

    def close(self) -> None:
        for task in self._pumps:
            task.cancel()
        _close(self.streams)


def _total(usages: list[Usage]) -> Usage:
    """One response's usage: the prompt counts once (the choices share it and
    its cache use), the completions add up."""
    first = usages[0]
    return Usage(first.prompt_tokens, sum(u.completion_tokens for u in usages),
                 first.cached_tokens)


class _Reply:
    """One response's frames: OpenAI's chunks or whole body, one
    ChoiceWriter per choice."""

    def __init__(self, ids: ResponseIds, writers: list[ChoiceWriter], include_usage: bool):
        self.ids, self.writers, self.include_usage = ids, writers, include_usage
        self.usages: list[Usage | None] = [None] * len(writers)

    def first(self) -> str:
        choices = [c for w in self.writers if (c := w.first()) is not None]
        return _sse(self.ids.chunk(choices)) if choices else ""

    def frames(self, batch: list[tuple[int, object]]) -> tuple[str, bool]:
        """The SSE frames for a batch of events, and whether the stream ends."""
        frames = []
        for index, event in batch:
            if isinstance(event, ErrorEvent):
                e = event.error
                frames.append(_sse(errors.error_body(e.message, e.error_type, e.code)))
                return "".join(frames) + "data: [DONE]\n\n", True
            frames += [_sse(self.ids.chunk([c])) for c in self.writers[index].chunks(event)]
            if isinstance(event, FinishEvent):
                self.usages[index] = event.usage
        if any(u is None for u in self.usages):
            return "".join(frames), False
        if self.include_usage:
            frames.append(_sse(self.ids.usage_chunk(_total(self.usages))))
        frames.append("data: [DONE]\n\n")
        return "".join(frames), True


async def _stream(merged: _Merged, watcher: asyncio.Task, reply: _Reply, lease: Lease):
    try:
        yield reply.first()
        ended = False
        while not ended:
            try:
                batch = await merged.next_batch(timeout=KEEPALIVE_S)
            except asyncio.TimeoutError:
                yield ": keep-alive\n\n"
                continue
            # Events that queued up while we were sending go out in one
            # write: fewer syscalls and wake-ups, same chunks for the client.
            frames, ended = reply.frames(batch)
            yield frames
    finally:
        watcher.cancel()
        merged.close()
        lease.release()


async def _collect(merged: _Merged, reply: _Reply) -> Response:
    n = len(reply.writers)
    parts: list[list[str]] = [[] for _ in range(n)]
    logprobs: list[list] = [[] for _ in range(n)]
    choices: list[dict | None] = [None] * n
    while any(c is None for c in choices):
        for index, event in await merged.next_batch():
            if isinstance(event, ErrorEvent):
                raise event.error
            logprobs[index] += event.logprobs
            if isinstance(event, TokenEvent):
                parts[index].append(event.text)
                continue
            if event.reason == "cancelled":    # the client is gone: nobody reads this
                return Response(status_code=499)
            parts[index].append(event.tail)
            reply.usages[index] = event.usage
            choices[index] = reply.writers[index].whole("".join(parts[index]), event,
                                                        logprobs[index])
    return JSONResponse(reply.ids.body(choices, _total(reply.usages)))
