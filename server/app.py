"""Routes. Each handler parses the request, hands tokens to the engine and
relays its events; no generation logic lives here."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from llmctl.errors import AuthError, InvalidParams, LlmctlError, ModelNotFound
from llmctl.runtime.events import ErrorEvent, FinishEvent, TokenEvent
from llmctl.runtime.llm import LLM
from llmctl.runtime.sampling import SamplingParams
from llmctl.server import errors
from llmctl.server.bridge import EventBridge
from llmctl.server.metrics import Metrics
from llmctl.server.protocol import ResponseIds, finish_reason, parse_sampling, stream_options


class Loading(LlmctlError):
    http_status = 503
    error_type = "service_unavailable"
    code = "model_loading"


@dataclass
class ServerState:
    name: str
    aliases: set[str] = field(default_factory=set)
    api_key: str | None = None
    defaults: SamplingParams = field(default_factory=SamplingParams)
    llm: LLM | None = None
    load_error: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    started: float = field(default_factory=time.time)

    def ready(self) -> LLM:
        if self.llm is None:
            raise Loading(self.load_error or "the model is still loading")
        return self.llm


async def _json_body(request: Request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidParams("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidParams("the request body must be a JSON object")
    return body


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


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="llmctl", docs_url=None, redoc_url=None)
    errors.install(app)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if state.api_key and request.url.path.startswith("/v1"):
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(token.encode(), state.api_key.encode()):
                return errors.error_response(AuthError("invalid or missing API key"))
        return await call_next(request)

    @app.get("/health")
    async def health():
        if state.llm is None:
            return JSONResponse({"status": "loading" if not state.load_error else "error",
                                 "error": state.load_error}, status_code=503)
        return {"status": "ok", "model": state.name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.name, "object": "model",
                                             "created": int(state.started), "owned_by": "llmctl"}]}

    @app.get("/metrics")
    async def metrics():
        llm = state.llm
        text = state.metrics.render(llm.engine.n_running if llm else 0,
                                    llm.engine.n_waiting if llm else 0)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/stats")
    async def stats():
        m = state.metrics
        return {"model": state.name, "requests": m.requests, "prompt_tokens": m.prompt_tokens,
                "prefix_cache_hit_tokens": m.cached_tokens,
                "generation_tokens": m.generation_tokens}

    # llama-server's tokenizer endpoints, so benchmarks can build prompts of
    # exact token counts against any server that speaks them.
    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await _json_body(request)
        content = body.get("content")
        if not isinstance(content, str):
            raise InvalidParams("'content' must be a string", param="content")
        add_special = body.get("add_special", False)
        tokens = state.ready().model.tokenize(content, add_special=bool(add_special),
                                              parse_special=True)
        return {"tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await _json_body(request)
        llm = state.ready()
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
                type(t) is int and 0 <= t < llm.model.n_vocab for t in tokens):
            raise InvalidParams("'tokens' must be a list of token ids", param="tokens")
        return {"content": llm.model.detokenize(tokens)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await _generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(request, chat=False)

    async def _generate(request: Request, chat: bool) -> Response:
        body = await _json_body(request)
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
        seq = llm.engine.submit(tokens, params, _bridge().sink(queue))
        ids = ResponseIds(state.name, chat)
        if stream:
            return StreamingResponse(_stream(llm, seq, queue, ids, include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _collect(request, llm, seq, queue, ids)

    async def _stream(llm, seq, queue, ids: ResponseIds, include_usage: bool):
        done = False
        try:
            yield _sse(ids.chunk("", first=True))
            while not done:
                # Events that queued up while we were sending go out in one
                # write: fewer syscalls and wake-ups, same chunks for the client.
                events = [await queue.get()]
                while not queue.empty():
                    events.append(queue.get_nowait())
                frames = []
                for event in events:
                    done = _frames(event, seq, ids, include_usage, frames) or done
                yield "".join(frames)
        finally:
            if not done:   # the client went away: free the slot at the next step
                llm.engine.cancel(seq)
                state.metrics.finished("cancelled", len(seq.prompt), 0, len(seq.output), None, 0)

    def _frames(event, seq, ids: ResponseIds, include_usage: bool, frames: list[str]) -> bool:
        """Append the SSE frames for one event; True once the stream is over."""
        if isinstance(event, TokenEvent):
            frames.append(_sse(ids.chunk(event.text)))
            return False
        if isinstance(event, FinishEvent):
            _record(event)
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

    async def _collect(request: Request, llm, seq, queue, ids: ResponseIds) -> Response:
        parts: list[str] = []
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), timeout=1.0)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    llm.engine.cancel(seq)
                    state.metrics.finished("cancelled", len(seq.prompt), 0, len(seq.output), None, 0)
                    return Response(status_code=499)
                continue
            if isinstance(event, TokenEvent):
                parts.append(event.text)
            elif isinstance(event, FinishEvent):
                _record(event)
                parts.append(event.tail)
                return JSONResponse(ids.full("".join(parts), finish_reason(event.reason), event.usage))
            elif isinstance(event, ErrorEvent):
                state.metrics.finished("error", len(seq.prompt), 0, 0, None, 0)
                raise event.error

    bridges: dict[int, EventBridge] = {}

    def _bridge() -> EventBridge:
        loop = asyncio.get_running_loop()
        bridge = bridges.get(id(loop))
        if bridge is None:
            bridge = bridges[id(loop)] = EventBridge(loop)
        return bridge

    def _record(event: FinishEvent) -> None:
        u = event.usage
        state.metrics.finished("ok", u.prompt_tokens, u.cached_tokens, u.completion_tokens,
                               event.ttft_s, event.decode_s)

    return app

