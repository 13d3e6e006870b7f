"""One generation's lifecycle, whatever protocol asked for it: lease the
model, turn the request's tools and formats into sampling parameters and
render and tokenize its prompt (off the event loop, on the server's
workers), open its n feeds (the admission guard cancels all of it when the
client leaves), stream the protocol's frames or collect whole answers, and
release the lease.

A protocol (server/openai/, server/ollama/) hands over a GenerationRequest
and a Dialect: its parameters, how to read an answer (tool calls,
thoughts) and its frames. It never touches the model; the runtime owns
generation, cancellation and statistics."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from functools import partial
from typing import AsyncIterator, Callable, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from llmctl.errors import InvalidParams
from llmctl.presets import Preset
from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, TokenEvent
from llmctl.runtime.engine.logprobs import TokenLogprob
from llmctl.runtime.formats.tool_calls import ToolFormat
from llmctl.runtime.llm import LLM, EventFeed
from llmctl.runtime.pool.model_pool import Lease
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.admission import ticket_of
from llmctl.server.answer_reader import ToolSetup
from llmctl.server.body import INLINE_BYTES, json_body
from llmctl.server.fields import loop_guard
from llmctl.server.repeat_guard import RepeatGuard, guarded
from llmctl.server.state import ServerState, leased, state_of
from llmctl.server.tool_protocol import Structured
from llmctl.server.workers import converting_field, parse_within_deadline, run_on

Event = TokenEvent | FinishEvent | ErrorEvent
R = TypeVar("R")


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation for the model's chat template, `tools` offered to it.
    The messages are as sent: LLM.chat_tokens validates them."""

    messages: list[dict]
    tools: list[dict] | None = None
    thinking: bool | None = None    # the model's thought on or off; None: the template's


@dataclass(frozen=True)
class TextPrompt:
    """Text for the model as it is, without the template."""

    text: str


@dataclass(frozen=True)
class TokenPrompt:
    """Token ids >= 0, checked against the vocabulary once the model is known."""

    ids: list[int]


Prompt = ChatPrompt | TextPrompt | TokenPrompt


@dataclass(frozen=True)
class GenerationRequest:
    """One validated request to generate, in no protocol's terms."""

    model: str | None               # None: the server's default model
    keep_alive: object              # as sent; ServerState.lease checks it
    prompt: Prompt
    structured: Structured          # tools, tool_choice, formats, logit_bias
    n: int = 1                      # answers to the prompt, each with its own seed
    stream: bool = False


@dataclass(frozen=True)
class PromptFacts:
    """What the leased model and the rendered prompt say about reading the answer."""

    model: str                      # the preset's name, else the leased model's
    tool_format: ToolFormat
    thinks: bool                    # the chat template knows <think>
    started_in_thought: bool        # the prompt ends inside an open thought


@dataclass(frozen=True)
class Generation:
    """What a protocol's frames are written from."""

    model: str                      # the name answers show: the preset's, else the model's
    leased_at: float                # time.monotonic() once the model was held
    setup: ToolSetup | None         # how to read each answer; None: plain text
    params: SamplingParams
    n: int
    n_prompt: int = 0               # the prompt's tokens (protocols that report them up front)


@dataclass(frozen=True)
class Answer:
    """One whole answer: its text, how it ended, its log-probabilities."""

    text: str
    finish: FinishEvent
    logprobs: list[TokenLogprob]
    pieces: tuple[str, ...] = ()    # the text as the engine released it (its tokens, mostly)


class Frames(Protocol):
    """A protocol's writing of one response."""

    def opening(self) -> str:
        """What a stream sends before any event ("" for nothing)."""
        ...

    def frames(self, batch: list[tuple[int, Event]]) -> tuple[str, bool]:
        """A stream's frames for a batch of (answer index, event), and
        whether the stream ends with them."""
        ...

    def body(self, answers: list[Answer]) -> dict:
        """The whole (non-streamed) response."""
        ...


class Dialect(ABC):
    """One protocol's side of a generation."""

    media_type: str = "application/json"   # of a streamed response
    headers: dict[str, str] = {}            # of a streamed response
    keepalive: str | None = None            # sent every sse_keepalive_s of silence; None: never

    @abstractmethod
    def sampling(self, n_ctx: int) -> SamplingParams:
        """The request's parameters on a model of `n_ctx` tokens per
        sequence. Raises InvalidParams naming the field."""

    @abstractmethod
    def reading(self, prompt: PromptFacts) -> ToolSetup | None:
        """How to read the answer; None for plain text. Raises InvalidParams."""

    @abstractmethod
    def frames(self, generation: Generation) -> Frames:
        """The writer of this response."""

    def fit(self, params: SamplingParams, n_prompt: int, n_ctx: int) -> SamplingParams:
        """The parameters for a prompt of `n_prompt` tokens on a context of
        `n_ctx`, once it is tokenized: as they are, unless a protocol caps
        max_tokens to the room left. Raises nothing of its own."""
        return params


class SseDialect(Dialect):
    """A dialect whose streams are server-sent events, with a comment line
    that keeps a silent stream open (Anthropic's sends its ping event instead)."""

    media_type = "text/event-stream"
    headers = {"Cache-Control": "no-cache"}
    keepalive: str | None = ": keep-alive\n\n"


async def parse_generation(request: Request, converting: tuple[str, ...],
                           parse: Callable[[dict, bool, SamplingParams], R],
                           chat: bool) -> tuple[ServerState, R]:
    """The server's state and `parse(body, chat, defaults)` of the request's
    body, `defaults` being the server's with the preset the body's `model`
    names (or the default preset) over them. Fields that become grammars
    (`converting`) are CPU work of unbounded cost: such a parse runs in the
    expensive lane, the parse workers, and is a 400 past their deadline. A
    small body without them parses on the loop, and a large one on the body
    workers, so neither waits behind a conversion. Raises what json_body,
    parse and parse_within_deadline raise."""
    state = state_of(request)
    body = await json_body(request)
    # A preset's defaults sit between the request's own fields and the server's.
    model = body.get("model")
    preset = state.preset(model if isinstance(model, str) else None)
    defaults = preset.params(state.defaults) if preset else state.defaults
    # The request's loop-guard header over the server's --loop-guard, for
    # every path that samples from these defaults (hosted MCP rounds too).
    defaults = defaults.replace(loop_guard=loop_guard(request.headers, defaults.loop_guard))
    field = converting_field(body, converting)
    if field is not None:
        req = await parse_within_deadline(state.workers, field, parse, body, chat, defaults)
    elif len(await request.body()) <= INLINE_BYTES:
        req = parse(body, chat, defaults)       # as cheap as the JSON parse before it
    else:
        req = await parse_within_deadline(state.workers, None, parse, body, chat, defaults,
                                          lane=state.workers.body)
    ticket = ticket_of(request.scope)
    if ticket is not None:
        ticket.model = state.model_of(getattr(req, "model", None))
    return state, req


async def respond(request: Request, req: GenerationRequest, dialect: Dialect) -> Response:
    """The response to `req` in `dialect`'s frames. Raises, before anything
    is sent, what ServerState.lease raises, InvalidParams (the dialect's,
    the grammar's, the prompt's), ContextOverflow and what LLM.open_feed
    raises. A streamed response releases the lease when its stream ends."""
    state = state_of(request)
    lease = await state.lease(req.model, req.keep_alive)
    leased_at = time.monotonic()
    return await leased(lease, _on_lease(request, state, req, dialect, (lease, leased_at)))


async def _on_lease(request: Request, state: ServerState, req: GenerationRequest,
                    dialect: Dialect, held: tuple[Lease, float]) -> Response:
    lease, leased_at = held
    llm = lease.llm
    ticket = ticket_of(request.scope)
    if ticket is not None:
        ticket.model = lease.name
    preset = state.preset(req.model)
    name = preset.name if preset else lease.name        # what the client asked for
    template = llm.chat_template(preset.template if preset else None)
    params = dialect.sampling(llm.n_ctx)
    if req.structured.tools:
        # Tools become a grammar only now, for this model's format: off the loop too.
        params = await parse_within_deadline(state.workers, "tools", req.structured.sampling,
                                             params, template.tool_format)
    else:
        params = req.structured.sampling(params, template.tool_format)
    # Rendering and tokenizing a large prompt takes a while: off the loop.
    tokens = await run_on(state.workers.render, prompt_tokens, llm, req.prompt, preset)
    params = dialect.fit(params, len(tokens), llm.n_ctx)
    setup = dialect.reading(PromptFacts(name, template.tool_format, template.thinks,
                                        llm.opens_thought(tokens)))
    if setup is not None and template.teaches_doubled_braces:
        setup = replace(setup, doubled=True)
    frames = dialect.frames(Generation(name, leased_at, setup, params, req.n, len(tokens)))
    merged: Merged | RepeatGuard = Merged(open_feeds(llm, tokens, params, req.n))
    if isinstance(req.prompt, ChatPrompt) and setup is not None and req.n == 1:
        merged = guarded(merged, req.prompt.messages, req.structured, setup,
                         partial(_reopen, state, (llm, preset, params, dialect), req.prompt))
    if ticket is not None:
        ticket.feeds = merged.feeds     # it leaves the queue once they hold a slot
    # A client that leaves cancels this handler wherever it waits (the
    # admission guard watches every connection), and `merged` is closed.
    if req.stream:
        # The stream releases the lease when it ends; the background task
        # also does, should the stream never start (release is idempotent).
        # A keep-alive frame while nothing else is sent (a long CPU
        # prefill), so proxies and clients with read timeouts keep the stream.
        keepalive = (dialect.keepalive, state.settings.sse_keepalive_s)
        return StreamingResponse(_stream(merged, frames, keepalive, lease),
                                 media_type=dialect.media_type, headers=dialect.headers or None,
                                 background=BackgroundTask(lease.release))
    try:
        answers = await collect(merged)
    finally:
        merged.close()
    if answers is None:             # the client is gone: nobody reads this
        return Response(status_code=499)
    return JSONResponse(frames.body(answers))


async def _reopen(state: ServerState, held: tuple, prompt: ChatPrompt,
                  messages: list[dict]) -> "Merged":
    """`prompt` with `messages` instead, opened as a new answer (RepeatGuard's)."""
    llm, preset, params, dialect = held
    tokens = await run_on(state.workers.render, prompt_tokens, llm,
                          replace(prompt, messages=messages), preset)
    return Merged(open_feeds(llm, tokens, dialect.fit(params, len(tokens), llm.n_ctx), 1))


def prompt_tokens(llm: LLM, prompt: Prompt, preset: Preset | None = None) -> list[int]:
    """The tokens of `prompt` on `llm` (blocking: rendering takes a while),
    a chat with `preset`'s system prompt (where it has none), template and
    template variables. Raises InvalidParams (param "prompt" for ids
    outside the vocabulary), ContextOverflow and TemplateError, as
    LLM.chat_tokens and LLM.text_tokens do."""
    if isinstance(prompt, ChatPrompt):
        if preset is None:
            return llm.chat_tokens(prompt.messages, prompt.tools, prompt.thinking)
        return llm.chat_tokens(preset.with_system(prompt.messages), prompt.tools,
                               prompt.thinking, template=preset.template,
                               variables=preset.template_kwargs)
    if isinstance(prompt, TextPrompt):
        return llm.text_tokens(prompt.text)
    if not all(t < llm.n_vocab for t in prompt.ids):
        raise InvalidParams("'prompt' has token ids outside the vocabulary", param="prompt")
    return list(prompt.ids)


def open_feeds(llm: LLM, tokens: list[int], params: SamplingParams,
               n: int) -> list[EventFeed]:
    """n requests for one prompt, submitted together so the prefix sharing
    computes the prompt once; each answer's events come on a feed. A
    request seed gives answer i seed + i: the same answers on a rerun, not
    n copies of one answer. Raises what LLM.open_feed raises, with the
    feeds opened before it closed."""
    feeds: list[EventFeed] = []
    try:
        for i in range(n):
            seed = None if params.seed is None else (params.seed + i) & 0xFFFFFFFF
            feeds.append(llm.open_feed(tokens, params if i == 0 else params.replace(seed=seed)))
    except BaseException:
        for feed in feeds:
            feed.close()
        raise
    return feeds


class Merged:
    """The events of n feeds as (answer index, event) pairs in arrival
    order. One feed is read directly; several through a pump task each."""

    def __init__(self, feeds: list[EventFeed]):
        self.feeds = feeds
        self._queue: asyncio.Queue[tuple[int, Event]] | None = None     # n > 1 only
        self._pumps: list[asyncio.Task] = []

    async def next_batch(self, timeout: float | None = None) -> list[tuple[int, Event]]:
        """Every pair that has arrived, waiting for at least one. Raises
        TimeoutError when nothing comes within `timeout` seconds."""
        if len(self.feeds) == 1:
            return [(0, e) for e in await self.feeds[0].next_batch(timeout)]
        if self._queue is None:
            queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
            self._queue = queue
            self._pumps = [asyncio.create_task(self._pump(i, f, queue))
                           for i, f in enumerate(self.feeds)]
        async with asyncio.timeout(timeout or None):
            batch = [await self._queue.get()]
        while not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch

    @staticmethod
    async def _pump(index: int, feed: EventFeed, queue: asyncio.Queue) -> None:
        while not feed.done:
            for event in await feed.next_batch():
                queue.put_nowait((index, event))

    def close(self) -> None:
        """Stop the pumps and close every feed (cancelling what still runs)."""
        for task in self._pumps:
            task.cancel()
        for feed in self.feeds:
            feed.close()


async def _stream(merged: Merged | RepeatGuard, frames: Frames, keepalive: tuple[str | None, float],
                  lease: Lease) -> AsyncIterator[str]:
    """The frames of `merged`, and `keepalive`'s (frame, seconds): that frame
    after that long without one (None: never)."""
    frame, every_s = keepalive
    try:
        opening = frames.opening()
        if opening:
            yield opening
        ended = False
        while not ended:
            try:
                batch = await merged.next_batch(every_s if frame else None)
            except TimeoutError:
                yield frame or ""
                continue
            # Events that queued up while we were sending go out in one
            # write: fewer syscalls and wake-ups, same frames for the client.
            out, ended = frames.frames(batch)
            if out:
                yield out
    finally:
        merged.close()
        lease.release()


async def collect(merged: Merged | RepeatGuard) -> list[Answer] | None:
    """Every stream's whole answer, in order; None when the request was
    cancelled (its client left). Raises the error an ErrorEvent carries."""
    n = len(merged.feeds)
    parts: list[list[str]] = [[] for _ in range(n)]
    logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
    answers: list[Answer | None] = [None] * n
    while any(a is None for a in answers):
        for index, event in await merged.next_batch():
            if isinstance(event, ErrorEvent):
                raise event.error
            logprobs[index] += event.logprobs
            if isinstance(event, TokenEvent):
                parts[index].append(event.text)
                continue
            if event.reason == "cancelled":
                return None
            parts[index].append(event.tail)
            answers[index] = Answer("".join(parts[index]), event, logprobs[index],
                                    tuple(parts[index]))
    return [a for a in answers if a is not None]
