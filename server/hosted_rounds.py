"""The generation lifecycle of a request whose MCP tools the server runs
(`serve --mcp`): one lease, and rounds on it. Each round renders the
conversation so far, generates an answer and reads it as AnswerEvents;
when the answer calls the request's MCP tools, they are run (or, where the
request asks for approval first, the response ends asking for it), their
results are added to the conversation, and the next round answers. The
protocol's RoundWriter renders every event of every round, whole or as a
stream, so a stream adds up to its body.

Bounded: each call by its server's timeout and result cap (McpHub), the
calls of one response by `max_calls` (past it a call is answered with an
error, not run), and the rounds by max_calls + 2. A client that leaves
cancels the round, or the tool call, it was waiting on."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from llmctl.errors import LlmctlError
from llmctl.runtime.engine.events import ErrorEvent, TokenEvent, Usage
from llmctl.runtime.formats.tool_calls import ToolCall, ToolFormat
from llmctl.runtime.formats.tool_schema import ToolChoice
from llmctl.runtime.pool.model_pool import Lease
from llmctl.runtime.sampling import SamplingParams
from llmctl.server import generation as gen
from llmctl.server.admission import ticket_of
from llmctl.server.answer_reader import AnswerEvent, AnswerReader, Finish, fold
from llmctl.server.hosted_tools import HostedTools
from llmctl.server.state import ServerState, leased, state_of
from llmctl.server.workers import parse_within_deadline, run_on
from llmctl.tools.agent import DEFAULT_MAX_STEPS, WITHDRAWN, Route, call_key, repeated
from llmctl.tools.mcp_hub import McpOutcome


class RoundWriter(Protocol):
    """A protocol's rendering of a response over rounds: each method
    returns the stream's frames for what it adds ("" for none) and keeps
    what body() returns."""

    def opening(self) -> str: ...
    def listed(self) -> str: ...
    def push(self, events: list[AnswerEvent]) -> str: ...
    def ran(self, call: ToolCall, route: Route, outcome: McpOutcome) -> str: ...
    def asked(self, call: ToolCall, route: Route) -> str: ...
    def finish(self, finish: Finish, added: list[dict]) -> str: ...
    def failed(self, error: LlmctlError) -> str: ...
    def body(self) -> dict: ...


class HostedDialect(gen.SseDialect):
    """A dialect that also writes rounds."""

    def writer(self, generation: gen.Generation, hosted: HostedTools) -> RoundWriter:
        raise NotImplementedError


@dataclass(frozen=True)
class Decision:
    """A call the client approved or declined (an approval response): run,
    or answered as declined, before the first round."""

    call: ToolCall              # named by the tool's own name
    approve: bool
    reason: str | None = None
    server: str | None = None   # the server label the approval request named


@dataclass
class _Round:
    reader: AnswerReader
    merged: gen.Merged
    n_prompt: int
    events: list[AnswerEvent] = field(default_factory=list)
    finish: Finish | None = None


class Gone(Exception):
    """The client left: the round was cancelled."""


def _ran(call: ToolCall, outcome: McpOutcome) -> dict:
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": outcome.text}


def assistant(events: list[AnswerEvent]) -> dict:
    """A round's answer as the chat assistant message a template renders."""
    folded = fold(events)
    message: dict = {"role": "assistant",
                     "content": folded.content or (None if folded.calls else "")}
    if folded.thinking:
        message["reasoning_content"] = folded.thinking
    if folded.calls:
        message["tool_calls"] = [c.to_openai() for c in folded.calls]
    return message


async def respond_hosted(request: Request, req: gen.GenerationRequest, dialect: HostedDialect,
                         hosted: HostedTools, decisions: list[Decision] = (),  # type: ignore[assignment]
                         max_calls: int = DEFAULT_MAX_STEPS) -> Response:
    """The response to `req` (a chat prompt) with `hosted`'s tools run on
    the server. Raises, before anything is sent, what generation.respond
    raises."""
    state = state_of(request)
    lease = await state.lease(req.model, req.keep_alive)
    rounds = _Rounds(request, state, req, dialect, hosted, lease, max_calls)
    return await leased(lease, rounds.respond(list(decisions)))


class _Rounds:
    def __init__(self, request: Request, state: ServerState, req: gen.GenerationRequest,
                 dialect: HostedDialect, hosted: HostedTools, lease: Lease, max_calls: int):
        assert isinstance(req.prompt, gen.ChatPrompt)
        self.request, self.state, self.req, self.dialect = request, state, req, dialect
        self.hosted, self.lease, self.max_calls = hosted, lease, max_calls
        self.leased_at = time.monotonic()
        self.preset = state.preset(req.model)
        self.messages = list(req.prompt.messages)
        self.added: list[dict] = []         # what the rounds add to the conversation
        self.calls = 0
        self.done: dict[tuple[str, str], McpOutcome] = {}
        self.usage = Usage()
        self.params = SamplingParams()
        self.fmt, self.thinks = ToolFormat.NONE, False
        self.doubled = False
        self.later = self.params            # the rounds after the first
        self.opened = 0                     # rounds opened
        self.bare = self.params             # without the tools
        self.withdrawn = False              # the tools were withdrawn for an answer

    async def respond(self, decisions: list[Decision]) -> Response:
        llm = self.lease.llm
        template = llm.chat_template(self.preset.template if self.preset else None)
        self.fmt, self.thinks = template.tool_format, template.thinks
        self.doubled = template.teaches_doubled_braces
        params = self.dialect.sampling(llm.n_ctx)
        structured = self.req.structured
        self.params = await parse_within_deadline(
            self.state.workers, "tools", structured.sampling, params, self.fmt)
        # A call that tool_choice forces is the first round's: the rounds
        # after its result may answer (else "required" calls until the cap).
        self.later = self.params
        self.bare = replace(structured, choice=ToolChoice("none")).sampling(params, self.fmt)
        if structured.choice.mode in ("required", "function"):
            auto = replace(structured, choice=ToolChoice("auto"))
            self.later = await parse_within_deadline(self.state.workers, "tools", auto.sampling,
                                                     params, self.fmt)
        decided = [await self._decide(d) for d in decisions]
        first = await self._open()
        name = self.preset.name if self.preset else self.lease.name
        writer = self.dialect.writer(gen.Generation(name, self.leased_at, first.reader.setup,
                                                    self.params, 1, first.n_prompt), self.hosted)
        head = writer.opening() + writer.listed()
        for call, outcome in decided:
            route = self.hosted.route(call.name)
            if route is not None:
                head += writer.ran(call, route, outcome)
        if self.req.stream:
            keepalive = (self.dialect.keepalive, self.state.settings.sse_keepalive_s)
            return StreamingResponse(self._stream(writer, first, head, keepalive),
                                     media_type=self.dialect.media_type,
                                     headers=self.dialect.headers or None,
                                     background=BackgroundTask(self.lease.release))
        try:
            async for _ in self._frames(writer, first, streaming=False, keepalive=(None, 0)):
                pass
        except Gone:
            return Response(status_code=499)       # nobody reads this
        return JSONResponse(writer.body())

    async def _decide(self, d: Decision) -> tuple[ToolCall, McpOutcome]:
        route = self.hosted.find(d.server, d.call.name)
        call = replace(d.call, name=route.function) if route else d.call
        if not d.approve:
            why = f" ({d.reason})" if d.reason else ""
            outcome = McpOutcome(f"error: the user declined to run this tool{why}", True)
        elif route is None:
            outcome = McpOutcome(f"error: there is no tool named {d.call.name!r}", True)
        else:
            outcome = await self._call(call, route)
        self._add(_ran(call, outcome))
        return call, outcome

    def _add(self, message: dict) -> None:
        self.messages.append(message)
        self.added.append(message)

    async def _open(self) -> _Round:
        """The next round: its prompt rendered and its feed opened. Raises
        ContextOverflow, InvalidParams, and what LLM.open_feed raises."""
        llm = self.lease.llm
        tools = None if self.withdrawn else self.req.structured.tools
        prompt = gen.ChatPrompt(self.messages, tools, self.req.prompt.thinking)  # type: ignore[union-attr]
        tokens = await run_on(self.state.workers.render, gen.prompt_tokens, llm, prompt,
                              self.preset)
        params = self.dialect.fit(self.bare if self.withdrawn else
                                  self.later if self.opened else self.params, len(tokens),
                                  llm.n_ctx)
        self.opened += 1
        facts = gen.PromptFacts("", self.fmt, self.thinks, llm.opens_thought(tokens))
        merged = gen.Merged(gen.open_feeds(llm, tokens, params, 1))
        ticket = ticket_of(self.request.scope)
        if ticket is not None:
            ticket.feeds = merged.feeds
        setup = self.dialect.reading(facts)
        if setup is not None and self.doubled:
            setup = replace(setup, doubled=True)
        return _Round(AnswerReader(setup), merged, len(tokens))

    async def _stream(self, writer: RoundWriter, first: _Round, head: str,
                      keepalive: tuple[str | None, float]) -> AsyncIterator[str]:
        try:
            yield head
            async for out in self._frames(writer, first, streaming=True, keepalive=keepalive):
                if out:
                    yield out
        except Gone:
            return
        finally:
            self.lease.release()

    async def _frames(self, writer: RoundWriter, first: _Round, *, streaming: bool,
                      keepalive: tuple[str | None, float]) -> AsyncIterator[str]:
        """Every round's frames. A whole response raises what fails; a
        stream ends with the writer's failure frames instead."""
        pending: _Round | None = first
        try:
            last: _Round | None = None
            for _ in range(self.max_calls + 2):
                r = pending or await self._open()
                pending = None
                async for out in self._answer(r, writer, keepalive):
                    yield out
                out, go_on = await self._after(r, writer)
                yield out
                if not go_on:
                    return
                last = r
            assert last is not None and last.finish is not None
            yield writer.finish(replace(last.finish, usage=self.usage), self.added)
        except LlmctlError as e:
            if not streaming:
                raise
            yield writer.failed(e)
        finally:
            if pending is not None:
                pending.merged.close()

    async def _answer(self, r: _Round, writer: RoundWriter,
                      keepalive: tuple[str | None, float]) -> AsyncIterator[str]:
        """One round's answer, pushed to `writer` and kept in r.events and
        r.finish. Raises Gone when the request was cancelled."""
        frame, every_s = keepalive
        try:
            while r.finish is None:
                try:
                    batch = await r.merged.next_batch(every_s if frame else None)
                except TimeoutError:
                    yield frame or ""
                    continue
                for _, event in batch:
                    if isinstance(event, ErrorEvent):
                        raise event.error
                    if isinstance(event, TokenEvent):
                        new = r.reader.feed(event.text)
                    elif event.reason == "cancelled":
                        raise Gone
                    else:
                        new = r.reader.finish(event)
                        last = new[-1]
                        assert isinstance(last, Finish)
                        r.finish = last
                    r.events += new
                    yield writer.push([e for e in new if not isinstance(e, Finish)])
                    if r.finish is not None:
                        break
        finally:
            r.merged.close()

    async def _after(self, r: _Round, writer: RoundWriter) -> tuple[str, bool]:
        """What follows an answer: (frames, whether another round comes).
        The answer's hosted calls run, or wait for approval; an answer
        without them, or with a call to the client's own functions, ends
        the response."""
        assert r.finish is not None
        u = r.finish.usage
        self.usage = Usage(self.usage.prompt_tokens + u.prompt_tokens,
                           self.usage.completion_tokens + u.completion_tokens,
                           self.usage.cached_tokens + u.cached_tokens)
        final = replace(r.finish, usage=self.usage)
        folded = fold(r.events)
        if not (folded.content or "").strip() and not folded.calls and self.calls \
                and not self.withdrawn:
            # An empty answer after tool results (small models stop there):
            # asked once more, without the tools, to answer from them.
            self.withdrawn = True
            self.messages.append({"role": "user", "content": WITHDRAWN})
            return "", True
        routed = [(c, self.hosted.route(c.name)) for c in folded.calls]
        self._add(assistant(r.events))
        if r.finish.reason != "tool_calls" or not routed or any(t is None for _, t in routed):
            return writer.finish(final, self.added), False
        out, asked = "", False
        for call, route in routed:
            assert route is not None
            if self.hosted.needs_approval(route):
                out += writer.asked(call, route)
                asked = True
                continue
            outcome = await self._call(call, route)
            self._add(_ran(call, outcome))
            out += writer.ran(call, route, outcome)
        if asked:
            return out + writer.finish(final, self.added), False
        return out, True

    async def _call(self, call: ToolCall, route: Route) -> McpOutcome:
        """Run one call: never twice with the same arguments (a tool may
        change something), never past max_calls."""
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            return McpOutcome("error: the arguments are not a JSON object", True)
        key = call_key(call.name, arguments)
        if key in self.done:
            return repeated(self.done[key])
        if self.calls >= self.max_calls:
            return McpOutcome(f"error: not run: this response may make {self.max_calls} tool "
                              "calls; answer from the results above", True)
        self.calls += 1
        tool = route.tool
        outcome = self.done[key] = await self.hosted.hub.call_async(tool.server, tool.name,
                                                                    arguments)
        return outcome
