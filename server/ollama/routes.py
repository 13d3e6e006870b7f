"""Ollama's generation API beside OpenAI's: /api/chat and /api/generate,
as NDJSON streams (Ollama's default) or one JSON object. Like
completions.py, this only translates HTTP to one LLM.open_stream call and
its events back; ollama_request.py validates the fields and
ollama_models.py serves the rest of /api/*."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from llmctl.errors import InvalidParams
from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, TokenEvent
from llmctl.runtime.formats.reasoning import THINK_OPEN, opens_thought
from llmctl.runtime.llm import LLM
from llmctl.runtime.pool.model_pool import Lease
from llmctl.server.body import json_body
from llmctl.server.chat_output import ChatShaper
from llmctl.server.ollama import models as ollama_models
from llmctl.server.ollama.request import (
    GeneratePrompt,
    OllamaRoute,
    Options,
    chat_messages,
    common_fields,
    keep_alive_is_zero,
    ns,
    parse_generate_prompt,
    parse_options,
    parse_structured_fields,
    parse_think,
    reasoning_format,
    rfc3339,
)
from llmctl.server.openai.completions import cancel_on_disconnect
from llmctl.server.state import ServerState, leased, state_of
from llmctl.server.tool_protocol import Structured
from llmctl.server.workers import converting_field, parse_within_deadline, run_on

router = APIRouter(route_class=OllamaRoute)
router.include_router(ollama_models.router)


@dataclass(frozen=True)
class _Request:
    """A validated /api/chat or /api/generate request."""

    chat: bool
    model: str | None
    stream: bool
    keep_alive: object                  # as sent; ServerState.lease checks it
    options: Options
    structured: Structured
    think: bool | None
    messages: list[dict] | None         # chat
    prompt: GeneratePrompt | None       # generate

    @property
    def empty(self) -> bool:
        """Nothing to answer: Ollama's way to load (or unload) a model."""
        return not self.messages if self.chat else not self.prompt.prompt


@router.post("/api/chat")
async def chat(request: Request):
    return await _handle(request, chat=True)


@router.post("/api/generate")
async def generate(request: Request):
    return await _handle(request, chat=False)


async def _handle(request: Request, chat: bool) -> Response:
    start = time.monotonic()
    state = state_of(request)
    body = await json_body(request)
    # `format` and `tools` become grammars: never on the loop, and a 400
    # past the parse deadline.
    req = await parse_within_deadline(state.workers, converting_field(body, ("format", "tools")),
                                      _parse, body, chat, state.defaults)
    return await _generate(request, state, req, start)


def _parse(body: dict, chat: bool, defaults) -> _Request:
    """A validated /api/chat or /api/generate body. Raises InvalidParams
    naming the field."""
    model, stream = common_fields(body)
    options = parse_options(body.get("options"), defaults)
    if chat:
        return _Request(True, model, stream, body.get("keep_alive"), options,
                        parse_structured_fields(body, body.get("tools")), parse_think(body),
                        chat_messages(body.get("messages")), None)
    return _Request(False, model, stream, body.get("keep_alive"), options,
                    parse_structured_fields(body), parse_think(body), None,
                    parse_generate_prompt(body))


async def _generate(request: Request, state: ServerState, req: _Request, start: float) -> Response:
    if req.empty:
        return await _load_or_unload(state, req)
    lease = await state.lease(req.model, req.keep_alive)
    load_s = time.monotonic() - start
    return await leased(lease, _respond(request, state, req, lease, _Timing(start, load_s)))


async def _load_or_unload(state: ServerState, req: _Request) -> Response:
    """Ollama's empty request: load the model (keep_alive as given), or
    unload it at once when keep_alive is 0. Unknown models are a 404."""
    name = req.model or state.default
    if name is None:
        raise InvalidParams("'model' is required", param="model")
    if keep_alive_is_zero(req.keep_alive):
        await run_on(state.workers.query, state.pool.unload, name)
        reason = "unload"
    else:
        (await state.lease(name, req.keep_alive)).release()
        reason = "load"
    return JSONResponse({"model": name, "created_at": rfc3339(),
                         **_answer(req.chat, "", None, None),
                         "done": True, "done_reason": reason})


def _answer(chat: bool, content: str, thinking: str | None, tool_calls: list | None) -> dict:
    """The answer fields of a line: chat's `message`, generate's `response`."""
    if chat:
        message: dict = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {"message": message}
    return {"response": content, **({"thinking": thinking} if thinking else {})}


def _prompt_tokens(llm: LLM, req: _Request) -> list[int]:
    if req.chat:
        return llm.chat_tokens(req.messages, req.structured.tools)
    if req.prompt.raw:
        return llm.text_tokens(req.prompt.prompt)
    return llm.chat_tokens(req.prompt.messages())


async def _respond(request: Request, state: ServerState, req: _Request, lease: Lease,
                   timing: "_Timing") -> Response:
    """The response on a leased model; a streaming one releases the lease
    when its stream ends."""
    llm = lease.llm
    # Tools become a grammar only now, for this model's format: off the loop too.
    params = await parse_within_deadline(state.workers, "tools" if req.structured.tools else None,
                                         req.structured.sampling,
                                         req.options.for_context(llm.n_ctx),
                                         llm.template.tool_format)
    tokens = await run_on(state.workers.render, _prompt_tokens, llm, req)
    started_in_thought = opens_thought(llm.model.detokenize(tokens[-8:]))
    thinks = THINK_OPEN in llm.template.source or started_in_thought
    structured = replace(req.structured,
                         reasoning_format=reasoning_format(req.think, thinks, lease.name))
    setup = structured.setup(llm.template.tool_format, state.reasoning_format, thinks=thinks,
                             started_in_thought=started_in_thought)
    stream = llm.open_stream(tokens, params)
    watcher = asyncio.create_task(cancel_on_disconnect(request, [stream]))
    writer = _Writer(req.chat, req.model or lease.name, ChatShaper(setup), timing)
    if req.stream:
        # The stream releases the lease when it ends; the background task
        # also does, should the stream never start (release is idempotent).
        return StreamingResponse(_ndjson(stream, watcher, writer, lease),
                                 media_type="application/x-ndjson",
                                 background=BackgroundTask(lease.release))
    try:
        return await _collect(stream, writer)
    finally:
        watcher.cancel()
        stream.close()


@dataclass(frozen=True)
class _Timing:
    start: float        # time.monotonic() when the request arrived
    load_s: float       # waiting for the model (loading it, if it was not)


def _tool_call(call: dict) -> dict:
    """An OpenAI tool call as Ollama's: arguments as an object."""
    fn = call["function"]
    return {"id": call["id"], "function": {"index": call["index"], "name": fn["name"],
                                           "arguments": json.loads(fn["arguments"])}}


class _Writer:
    """The lines of one answer in Ollama's shapes, from engine events run
    through a ChatShaper (tool calls, thoughts)."""

    def __init__(self, chat: bool, model: str, shaper: ChatShaper, timing: _Timing):
        self.chat, self.model, self.shaper, self.timing = chat, model, shaper, timing
        self._calls: dict[int, dict] = {}       # streamed calls still missing their arguments

    def _line(self, fields: dict, done: bool) -> dict:
        return {"model": self.model, "created_at": rfc3339(), **fields, "done": done}

    def lines(self, batch: list) -> tuple[str, bool]:
        """NDJSON for a batch of events (one line for all their text), and
        whether the answer ended."""
        deltas, out = [], []
        for event in batch:
            if isinstance(event, ErrorEvent):
                out.append({"error": event.error.message})
                break
            if isinstance(event, TokenEvent):
                deltas += self.shaper.feed(event.text)
                continue
            deltas += self.shaper.finish(event.tail)
            out.append(self.final(event, "", None, None))
            break
        piece = self._fold(deltas)
        if piece is not None:
            out.insert(0, piece)
        return "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in out), bool(
            out and ("error" in out[-1] or out[-1]["done"]))

    def _fold(self, deltas: list[dict]) -> dict | None:
        content, thinking, calls = [], [], []
        for d in deltas:
            content.append(d.get("content") or "")
            thinking.append(d.get("reasoning_content") or "")
            for call in d.get("tool_calls", ()):
                if "id" in call:            # the head of a call; its arguments follow
                    self._calls[call["index"]] = call
                    continue
                head = self._calls.pop(call["index"])
                calls.append(_tool_call({**head, "function": {
                    **head["function"], "arguments": call["function"]["arguments"]}}))
        if not (any(content) or any(thinking) or calls):
            return None
        return self._line(_answer(self.chat, "".join(content), "".join(thinking) or None,
                                  calls or None), False)

    def final(self, event: FinishEvent, content: str, thinking: str | None,
              tool_calls: list | None) -> dict:
        """The closing object: done, why, the counts and durations (ns)."""
        usage = event.usage
        return self._line({**_answer(self.chat, content, thinking, tool_calls),
                           "done_reason": "length" if event.reason == "length" else "stop"},
                          True) | {
            "total_duration": ns(time.monotonic() - self.timing.start),
            "load_duration": ns(self.timing.load_s),
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": ns(event.ttft_s),
            "eval_count": usage.completion_tokens,
            "eval_duration": ns(event.decode_s),
        }

    def whole(self, text: str, event: FinishEvent) -> dict:
        """The one object of a non-streamed answer, for the whole `text`."""
        message = self.shaper.message(text)
        calls = [_tool_call({**c, "index": i}) for i, c in enumerate(message.get("tool_calls", ()))]
        return self.final(event, message["content"] or "", message.get("reasoning_content"),
                          calls or None)


async def _ndjson(stream, watcher: asyncio.Task, writer: _Writer, lease: Lease):
    try:
        ended = False
        while not ended:
            lines, ended = writer.lines(await stream.next_batch())
            if lines:
                yield lines
    finally:
        watcher.cancel()
        stream.close()
        lease.release()


async def _collect(stream, writer: _Writer) -> Response:
    parts: list[str] = []
    while True:
        for event in await stream.next_batch():
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, TokenEvent):
                parts.append(event.text)
                continue
            if event.reason == "cancelled":     # the client is gone: nobody reads this
                return Response(status_code=499)
            parts.append(event.tail)
            return JSONResponse(writer.whole("".join(parts), event))
