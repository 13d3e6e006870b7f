"""Ollama's generation API beside OpenAI's: /api/chat and /api/generate,
as NDJSON streams (Ollama's default) or one JSON object. Like
openai/completions.py, this only translates a request into one
GenerationRequest (server/generation.py runs it) and its events back;
request.py validates the fields and models.py serves the rest of /api/*."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from llmctl.errors import InvalidParams
from llmctl.runtime.engine.events import ErrorEvent, TokenEvent
from llmctl.runtime.formats.tool_calls import ToolCall
from llmctl.runtime.sampling import SamplingParams
from llmctl.server import generation as gen
from llmctl.server.answer_reader import (
    AnswerEvent,
    AnswerReader,
    Finish,
    ToolCallEnd,
    ToolSetup,
    fold,
)
from llmctl.server.model_names import unload_request
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
from llmctl.server.state import ServerState
from llmctl.server.tool_protocol import Structured
from llmctl.server.workers import run_on

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
        return not self.messages if self.chat else self.prompt is None or not self.prompt.prompt

    def generation(self) -> gen.GenerationRequest:
        """The request in no protocol's terms."""
        if self.chat or self.prompt is None:
            # Ollama's `think` turns the thought on or off where the
            # template has a switch, as well as choosing how it is returned.
            prompt: gen.Prompt = gen.ChatPrompt(self.messages or [], self.structured.tools,
                                                thinking=self.think)
        elif self.prompt.raw:
            prompt = gen.TextPrompt(self.prompt.prompt)
        else:
            prompt = gen.ChatPrompt(self.prompt.messages(), thinking=self.think)
        return gen.GenerationRequest(self.model, self.keep_alive, prompt, self.structured,
                                     stream=self.stream)


@router.post("/api/chat")
async def chat(request: Request):
    """POST /api/chat: Ollama's chat, as NDJSON lines or one object; empty
    `messages` load or unload the model."""
    return await _handle(request, chat=True, start=time.monotonic())


@router.post("/api/generate")
async def generate(request: Request):
    """POST /api/generate: Ollama's completion of `prompt`, as NDJSON lines or
    one object; an empty prompt loads or unloads the model."""
    return await _handle(request, chat=False, start=time.monotonic())


async def _handle(request: Request, chat: bool, start: float) -> Response:
    """`start`: when the request arrived, for Ollama's durations."""
    state, req = await gen.parse_generation(request, ("format", "tools"), _parse, chat)
    if req.empty:
        return await _load_or_unload(state, req)
    return await gen.respond(request, req.generation(),
                             _Ollama(req, start, state.reasoning_format))


def _parse(body: dict, chat: bool, defaults: SamplingParams) -> _Request:
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


async def _load_or_unload(state: ServerState, req: _Request) -> Response:
    """Ollama's empty request: load the model (keep_alive as given), or
    unload it at once when keep_alive is 0. Unknown models are a 404."""
    name = req.model or state.default
    if name is None:
        raise InvalidParams("'model' is required", param="model")
    if keep_alive_is_zero(req.keep_alive):
        await run_on(state.workers.query, unload_request, state.pool, state.model_of(name))
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


@dataclass(frozen=True)
class _Timing:
    start: float        # time.monotonic() when the request arrived
    load_s: float       # waiting for the model (loading it, if it was not)


class _Ollama(gen.Dialect):
    """Ollama's side of a generation: `options` on the model's context,
    `think` checked against the model, and its NDJSON lines."""

    media_type = "application/x-ndjson"

    def __init__(self, req: _Request, start: float, reasoning_format: str):
        self.req, self.start, self.reasoning_format = req, start, reasoning_format

    def sampling(self, n_ctx: int) -> SamplingParams:
        return self.req.options.for_context(n_ctx)

    def reading(self, prompt: gen.PromptFacts) -> ToolSetup | None:
        thinks = prompt.thinks or prompt.started_in_thought
        structured = replace(self.req.structured, reasoning_format=reasoning_format(
            self.req.think, thinks, prompt.model))
        setup = structured.setup(prompt.tool_format, self.reasoning_format, thinks=thinks,
                                 started_in_thought=prompt.started_in_thought)
        # Ollama's calls travel whole (arguments as an object, as Ollama's
        # own do), so their arguments are not streamed in pieces.
        return None if setup is None else replace(setup, constrained=False)

    def frames(self, generation: gen.Generation) -> _Writer:
        return _Writer(self.req.chat, self.req.model or generation.model,
                       AnswerReader(generation.setup),
                       _Timing(self.start, generation.leased_at - self.start))


def _tool_call(index: int, call: ToolCall) -> dict:
    """A whole call as Ollama's: arguments as an object."""
    return {"id": call.id, "function": {"index": index, "name": call.name,
                                        "arguments": json.loads(call.arguments)}}


class _Writer:
    """The lines of one answer in Ollama's shapes, from the events of an
    AnswerReader (tool calls, thoughts); a call travels whole, once ended."""

    def __init__(self, chat: bool, model: str, reader: AnswerReader, timing: _Timing):
        self.chat, self.model, self.reader, self.timing = chat, model, reader, timing

    def opening(self) -> str:
        return ""

    def frames(self, batch: list[tuple[int, gen.Event]]) -> tuple[str, bool]:
        return self.lines([event for _, event in batch])

    def body(self, answers: list[gen.Answer]) -> dict:
        return self.whole(answers[0])

    def _line(self, fields: dict, done: bool) -> dict:
        return {"model": self.model, "created_at": rfc3339(), **fields, "done": done}

    def lines(self, batch: list) -> tuple[str, bool]:
        """NDJSON for a batch of events (one line for all their text), and
        whether the answer ended."""
        events: list[AnswerEvent] = []
        out = []
        for event in batch:
            if isinstance(event, ErrorEvent):
                out.append({"error": event.error.message})
                break
            if isinstance(event, TokenEvent):
                events += self.reader.feed(event.text)
                continue
            events += self.reader.finish(event)
            finish = events[-1]
            assert isinstance(finish, Finish)
            out.append(self.final(finish, "", None, None))
            break
        piece = self._fold(events)
        if piece is not None:
            out.insert(0, piece)
        return "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in out), bool(
            out and ("error" in out[-1] or out[-1]["done"]))

    def _fold(self, events: list[AnswerEvent]) -> dict | None:
        folded = fold(events)
        calls = [_tool_call(e.index, e.call) for e in events if isinstance(e, ToolCallEnd)]
        if not (folded.content or folded.thinking or calls):
            return None
        return self._line(_answer(self.chat, folded.content or "", folded.thinking,
                                  calls or None), False)

    def final(self, finish: Finish, content: str, thinking: str | None,
              tool_calls: list | None) -> dict:
        """The closing object: done, why, the counts and durations (ns)."""
        usage, end = finish.usage, finish.engine
        return self._line({**_answer(self.chat, content, thinking, tool_calls),
                           "done_reason": end.reason if end.reason in ("length", "loop")
                           else "stop"},
                          True) | {
            "total_duration": ns(time.monotonic() - self.timing.start),
            "load_duration": ns(self.timing.load_s),
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": ns(end.ttft_s),
            "eval_count": usage.completion_tokens,
            "eval_duration": ns(end.decode_s),
        }

    def whole(self, answer: gen.Answer) -> dict:
        """The one object of a non-streamed answer."""
        folded = fold(self.reader.whole(answer.pieces or (answer.text,), answer.finish))
        assert folded.finish is not None
        calls = [_tool_call(i, c) for i, c in enumerate(folded.calls)]
        return self.final(folded.finish, folded.content or "", folded.thinking, calls or None)
