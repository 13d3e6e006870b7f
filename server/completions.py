"""/v1/chat/completions and /v1/completions: translate an HTTP request into
one LLM.open_stream call and its events into one JSON body or server-sent
events. The runtime owns generation, cancellation and statistics; this file
only watches the connection and writes frames."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmctl import config
from llmctl.errors import InvalidParams, ModelNotFound
from llmctl.runtime.events import ErrorEvent, FinishEvent, TokenEvent
from llmctl.runtime.llm import LLM, AsyncStream
from llmctl.server import errors
from llmctl.server.body import json_body
from llmctl.server.chat_output import ChatShaper
from llmctl.server.protocol import ParsedRequest, ResponseIds, finish_reason, parse_request
from llmctl.server.state import state_of

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
    req = parse_request(await json_body(request), chat, state.defaults)
    llm = state.ready()
    if req.model is not None and req.model not in state.aliases:
        raise ModelNotFound(f"model {req.model!r} is not served here; this server serves "
                            f"{state.name!r}", param="model")
    fmt = llm.template.tool_format
    params = req.structured.sampling(req.params, fmt)
    # Rendering and tokenizing a large prompt takes a while: off the loop.
    tokens = await asyncio.to_thread(_prompt_tokens, llm, req)
    stream = llm.open_stream(tokens, params)
    watcher = asyncio.create_task(_cancel_on_disconnect(request, stream))
    reply = _Reply(ResponseIds(state.name, chat),
                   ChatShaper(req.structured.setup(fmt)) if chat else None, req.include_usage)
    if req.stream:
        return StreamingResponse(_stream(stream, watcher, reply),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    try:
        return await _collect(stream, reply)
    finally:
        watcher.cancel()
        stream.close()


async def _cancel_on_disconnect(request: Request, stream: AsyncStream) -> None:
    """Cancel the request the moment its client hangs up, streaming or not:
    an abandoned request must not hold a slot until it would have ended."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            stream.close()
            return


class _Reply:
    """One response's frames: OpenAI's chunks or whole body, with the chat
    answer read through a ChatShaper (tool calls, reasoning)."""

    def __init__(self, ids: ResponseIds, shaper: ChatShaper | None, include_usage: bool):
        self.ids, self.shaper, self.include_usage = ids, shaper, include_usage

    def first(self) -> str:
        return _sse(self.ids.chunk("", first=True))

    def frames(self, event) -> str:
        """The SSE frames for one event."""
        ids, shaper = self.ids, self.shaper
        if isinstance(event, TokenEvent):
            if shaper is None:
                return _sse(ids.chunk(event.text))
            return "".join(_sse(ids.delta_chunk(d)) for d in shaper.feed(event.text))
        frames = []
        if isinstance(event, FinishEvent):
            if shaper is None:
                frames += [_sse(ids.chunk(event.tail))] if event.tail else []
                frames.append(_sse(ids.chunk(None, finish_reason(event.reason))))
            else:
                frames += [_sse(ids.delta_chunk(d)) for d in shaper.finish(event.tail)]
                frames.append(_sse(ids.delta_chunk({}, shaper.finish_reason(event.reason))))
            if self.include_usage:
                frames.append(_sse(ids.usage_chunk(event.usage)))
        elif isinstance(event, ErrorEvent):
            e = event.error
            frames.append(_sse(errors.error_body(e.message, e.error_type, e.code)))
        frames.append("data: [DONE]\n\n")
        return "".join(frames)

    def whole(self, text: str, event: FinishEvent) -> dict:
        if self.shaper is None:
            return self.ids.full(text, finish_reason(event.reason), event.usage)
        message = self.shaper.message(text)
        return self.ids.full_message(message, self.shaper.finish_reason(event.reason),
                                     event.usage)


async def _stream(stream: AsyncStream, watcher: asyncio.Task, reply: _Reply):
    try:
        yield reply.first()
        while not stream.done:
            try:
                events = await stream.next_batch(timeout=KEEPALIVE_S)
            except asyncio.TimeoutError:
                yield ": keep-alive\n\n"
                continue
            # Events that queued up while we were sending go out in one
            # write: fewer syscalls and wake-ups, same chunks for the client.
            yield "".join(reply.frames(event) for event in events)
    finally:
        watcher.cancel()
        stream.close()


async def _collect(stream: AsyncStream, reply: _Reply) -> Response:
    parts: list[str] = []
    while True:
        for event in await stream.next_batch():
            if isinstance(event, TokenEvent):
                parts.append(event.text)
            elif isinstance(event, FinishEvent):
                if event.reason == "cancelled":    # the client is gone: nobody reads this
                    return Response(status_code=499)
                parts.append(event.tail)
                return JSONResponse(reply.whole("".join(parts), event))
            elif isinstance(event, ErrorEvent):
                raise event.error
