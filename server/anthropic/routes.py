"""/v1/messages and /v1/messages/count_tokens: an Anthropic request becomes
one GenerationRequest (server/generation.py runs it) and its events become
Anthropic's message or events (frames.py). The `?beta=true` query and the
anthropic-version and anthropic-beta headers are accepted: the fields they
unlock are read whatever they say. Errors leave in Anthropic's shape
(server/errors.py answers every path under /v1/messages so)."""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from llmctl.runtime.sampling import SamplingParams
from llmctl.server import generation as gen
from llmctl.server.answer_reader import AnswerReader, ToolSetup
from llmctl.server.anthropic.frames import PING, MessageWriter
from llmctl.server.anthropic.mcp_frames import McpMessage
from llmctl.server.anthropic.request import MessagesRequest, parse_messages
from llmctl.server.fields import name_ignored
from llmctl.server.hosted_rounds import HostedDialect, respond_hosted
from llmctl.server.hosted_tools import HostedTools, list_hosted
from llmctl.server.state import leased, state_of
from llmctl.server.workers import run_on

log = logging.getLogger("llmctl.server")
router = APIRouter()
# Fields whose conversion to a grammar costs CPU: parsed off the loop.
_CONVERTING = ("output_config", "output_format", "tools")


@router.post("/v1/messages")
async def messages(request: Request) -> Response:
    """A message from the model for the conversation, whole or as events."""
    # parse_generation's flag is `count_only` here: a message needs max_tokens.
    parse = partial(parse_messages, hub=state_of(request).mcp)
    state, req = await gen.parse_generation(request, _CONVERTING, parse, False)
    run: HostedTools | None = None      # the MCP tools this server runs for the request
    if req.mcp:
        assert state.mcp is not None    # parse_messages refused mcp_servers without one
        taken = {t["function"]["name"] for t in req.structured.tools or []}
        run = await list_hosted(state.mcp, list(req.mcp), taken)
        req = replace(req, structured=run.merged(req.structured, req.mcp_choice))
    generation = gen.GenerationRequest(req.model, None, _prompt(req), req.structured,
                                       stream=req.stream)
    dialect = _Messages(req, state.reasoning_format)
    if run is not None:
        response = await respond_hosted(request, generation, dialect, run)
    else:
        response = await gen.respond(request, generation, dialect)
    return _named(response, req, dialect.thinks)


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    """{"input_tokens": N}: the prompt the same body would have, counted on
    the model it names (loaded if need be)."""
    state, req = await gen.parse_generation(
        request, _CONVERTING, partial(parse_messages, hub=state_of(request).mcp), True)
    lease = await state.lease(req.model)

    async def count() -> Response:
        tokens = await run_on(state.workers.render, gen.prompt_tokens, lease.llm, _prompt(req),
                              state.preset(req.model))
        return JSONResponse({"input_tokens": len(tokens)})

    return _named(await leased(lease, count()), req, lease.llm.thinks)


def _prompt(req: MessagesRequest) -> gen.ChatPrompt:
    return gen.ChatPrompt(req.messages, req.structured.tools, req.think.on)


def _named(response: Response, req: MessagesRequest, thinks: bool) -> Response:
    """`response` with the fields accepted but not applied named: the
    thought's fields too on a model whose template does not think."""
    return name_ignored(response, req.think.named(req.ignored, thinks), "/v1/messages")


class _Messages(HostedDialect):
    """Anthropic's side of a generation: max_tokens capped to the room the
    prompt leaves (Claude Code asks for 32000 on every turn), thoughts
    split off where the model thinks, and its events."""

    keepalive = PING

    def __init__(self, req: MessagesRequest, reasoning_format: str):
        self.req, self.reasoning_format = req, reasoning_format
        self.thinks = False             # whether the model's template thinks, once known

    def sampling(self, n_ctx: int) -> SamplingParams:
        return self.req.params

    def fit(self, params: SamplingParams, n_prompt: int, n_ctx: int) -> SamplingParams:
        # A prompt that leaves no room keeps its max_tokens: the engine's
        # ContextOverflow then says how many tokens it has and how many fit.
        room = n_ctx - n_prompt
        if params.max_tokens is not None and 0 < room < params.max_tokens:
            return params.replace(max_tokens=room)
        return params

    def reading(self, prompt: gen.PromptFacts) -> ToolSetup | None:
        thinks = self.thinks = prompt.thinks or prompt.started_in_thought
        # A thought is always split off: as thinking blocks when asked
        # for, left out of the text otherwise.
        structured = replace(self.req.structured,
                             reasoning_format="deepseek" if thinks else None)
        return structured.setup(prompt.tool_format, self.reasoning_format, thinks=thinks,
                                started_in_thought=prompt.started_in_thought)

    def writer(self, generation: gen.Generation, hosted: HostedTools) -> McpMessage:
        return McpMessage(self.req.model or generation.model, hosted, self.req.thinking,
                          generation.n_prompt)

    def frames(self, generation: gen.Generation) -> MessageWriter:
        return MessageWriter(self.req.model or generation.model, AnswerReader(generation.setup),
                             self.req.thinking, generation.n_prompt)
