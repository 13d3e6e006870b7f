"""/v1/chat/completions and /v1/completions: parse the request, hand tokens
to the engine, relay its events as one JSON body or as server-sent events."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmctl.errors import InvalidParams, ModelNotFound
from llmctl.runtime.events import ErrorEvent, FinishEvent, TokenEvent
from llmctl.runtime.llm import LLM
from llmctl.runtime.sequence import Sequence
from llmctl.server import errors
from llmctl.server.protocol import ResponseIds, finish_reason, parse_sampling, stream_options
from llmctl.server.body import json_body
from llmctl.server.state import ServerState, state_of

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(request: Request):
    return await _generate(request, chat=True)


@router.post("/v1/completions")
async def completions(request: Request):
    return await _generate(request, chat=False)


def _prompt_tokens(llm: LLM, body: dict, chat: bool) -> list[int]:
    if chat:
        if "messages" not in body:
            raise InvalidParams("'messages' is required", param="messages")
        return llm.chat_tokens(body["messages"])
    prompt = body.get("prompt")
    if prompt is None:
        raise InvalidParams("'prompt' is required", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        if not all(0 <= t < llm.model.n_vocab for t in prompt):
            raise InvalidParams("'prompt' has token ids outside the vocabulary", param="prompt")
        return list(prompt)
    if not isinstance(prompt, str):
        raise InvalidParams("'prompt' must be a string, a one-string list or token ids",
                            param="prompt")
    return llm.text_tokens(prompt)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _generate(request: Request, chat: bool) -> Response:
    state = state_of(request)
    body = await json_body(request)
    llm = state.ready()
    model = body.get("model")
    if model not in (None, "") and model not in state.aliases:
        raise ModelNotFound(f"model {model!r} is not served here; this server serves "
                            f"{state.name!r}", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidParams("'stream' must be a boolean", param="stream")
    params = parse_sampling(body, state.defaults)
    include_usage = stream_options(body)
    tokens = _prompt_tokens(llm, body, chat)
    queue: asyncio.Queue = asyncio.Queue()
    seq = llm.engine.submit(tokens, params, state.bridge().sink(queue))
    ids = ResponseIds(state.name, chat)
    if stream:
        return StreamingResponse(_stream(state, seq, queue, ids, include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _collect(request, state, seq, queue, ids)


async def _stream(state: ServerState, seq: Sequence, queue: asyncio.Queue, ids: ResponseIds,
                  include_usage: bool):
    done = False
    try:
        yield _sse(ids.chunk("", first=True))
        while not done:
            # Events that queued up while we were sending go out in one
            # write: fewer syscalls and wake-ups, same chunks for the client.
            events = [await queue.get()]
            while not queue.empty():
                events.append(queue.get_nowait())
            frames: list[str] = []
            for event in events:
                done = _frames(state, event, seq, ids, include_usage, frames) or done
            yield "".join(frames)
    finally:
        if not done:   # the client went away: free the slot at the next step
            _cancel(state, seq)


def _frames(state: ServerState, event, seq: Sequence, ids: ResponseIds, include_usage: bool,
            frames: list[str]) -> bool:
    """Append the SSE frames for one event; True once the stream is over."""
    if isinstance(event, TokenEvent):
        frames.append(_sse(ids.chunk(event.text)))
        return False
    if isinstance(event, FinishEvent):
        _record(state, event)
        if event.tail:
            frames.append(_sse(ids.chunk(event.tail)))
        frames.append(_sse(ids.chunk(None, finish_reason(event.reason))))
        if include_usage:
            frames.append(_sse(ids.usage_chunk(event.usage)))
    else:
        state.metrics.finished("error", len(seq.prompt), 0, 0, None, 0)
        e = event.error
        frames.append(_sse(errors.error_body(e.message, e.error_type, e.code)))
    frames.append("data: [DONE]\n\n")
    return True


async def _collect(request: Request, state: ServerState, seq: Sequence, queue: asyncio.Queue,
                   ids: ResponseIds) -> Response:
    parts: list[str] = []
    while True:
        try:
            event = await asyncio.wait_for(queue.get(), timeout=1.0)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                _cancel(state, seq)
                return Response(status_code=499)
            continue
        if isinstance(event, TokenEvent):
            parts.append(event.text)
        elif isinstance(event, FinishEvent):
            _record(state, event)
            parts.append(event.tail)
            return JSONResponse(ids.full("".join(parts), finish_reason(event.reason), event.usage))
        elif isinstance(event, ErrorEvent):
            state.metrics.finished("error", len(seq.prompt), 0, 0, None, 0)
            raise event.error


def _cancel(state: ServerState, seq: Sequence) -> None:
    state.ready().engine.cancel(seq)
    state.metrics.finished("cancelled", len(seq.prompt), 0, len(seq.output), None, 0)


def _record(state: ServerState, event: FinishEvent) -> None:
    u = event.usage
    state.metrics.finished("ok", u.prompt_tokens, u.cached_tokens, u.completion_tokens,
                           event.ttft_s, event.decode_s)
