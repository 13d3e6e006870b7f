"""/v1/responses: a Responses request becomes one GenerationRequest
(server/generation.py runs it) and its events the response object or its
typed events; stored responses are read back, listed and deleted here."""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llmctl.errors import ContextOverflow, InvalidParams, UsageError
from llmctl.runtime.sampling import SamplingParams
from llmctl.server import generation as gen
from llmctl.server.answer_reader import AnswerReader, ToolSetup
from llmctl.server.fields import name_ignored
from llmctl.server.hosted_rounds import HostedDialect, respond_hosted
from llmctl.server.hosted_tools import HostedTools, list_hosted
from llmctl.server.responses.frames import OutputItems, Reply, ResponseObject
from llmctl.server.responses.mcp_frames import McpReply
from llmctl.server.responses.request import ResponsesRequest, parse_request
from llmctl.server.responses.store import ResponseStore, StoredResponse, store_for_home
from llmctl.server.state import state_of
from llmctl.server.workers import run_on
from llmctl.tools.agent import DEFAULT_MAX_STEPS

log = logging.getLogger("llmctl.server")
router = APIRouter()
_CONVERTING = ("text", "tools")


class ResponseNotFound(UsageError):
    """No stored response has the id asked for (a 404)."""

    http_status = 404
    code = "not_found"


async def _parse(request: Request) -> tuple[ResponseStore, ResponsesRequest]:
    state = state_of(request)
    store = store_for_home(state.settings)
    _, req = await gen.parse_generation(request, _CONVERTING,
                                        partial(parse_request, store=store, hub=state.mcp), True)
    return store, req


@router.post("/v1/responses")
async def create(request: Request) -> Response:
    """A response to `input` (after the stored conversation it continues),
    stored unless `store` is false. Raises, as a 4xx in OpenAI's shape,
    InvalidParams naming a field, ContextOverflow (param "input"), and what
    server/generation.py's respond raises."""
    store, req = await _parse(request)
    if req.tools.hosted:
        log.info("responses: hosted tools not offered to the model: %s",
                 ", ".join(req.tools.hosted))
    run: HostedTools | None = None      # the MCP tools this server runs for the request
    if req.tools.mcp:
        hub = state_of(request).mcp
        assert hub is not None          # parse_request refused mcp tools without one
        taken = {t["function"]["name"] for t in req.tools.chat}
        run = await list_hosted(hub, list(req.tools.mcp), taken)
        req = replace(req, structured=run.merged(req.structured, req.mcp_choice))
    generation = gen.GenerationRequest(req.model, req.keep_alive, _prompt(req),
                                       req.structured, stream=req.stream)
    dialect = _Responses(req, store, state_of(request).reasoning_format)
    try:
        if run is not None:
            response = await respond_hosted(request, generation, dialect, run,
                                            list(req.approvals),
                                            req.max_tool_calls or DEFAULT_MAX_STEPS)
        else:
            response = await gen.respond(request, generation, dialect)
    except ContextOverflow as e:
        raise ContextOverflow(e.message.replace("max_tokens", "max_output_tokens"),
                              param="input") from None
    hosted = [f"tools.{kind}" for kind in req.tools.hosted]
    return name_ignored(response, hosted + req.think.named(req.ignored, dialect.thinks),
                        "/v1/responses")


def _prompt(req: ResponsesRequest) -> gen.ChatPrompt:
    return gen.ChatPrompt(req.messages, req.structured.tools, req.think.on)


class _Responses(HostedDialect):
    """The Responses API's side of a generation: its parameters as parsed,
    the answer read for tool calls and thoughts, its typed events."""

    def __init__(self, req: ResponsesRequest, store: ResponseStore, reasoning_format: str):
        self.req, self.store, self.reasoning_format = req, store, reasoning_format
        self.thinks = False             # whether the model's template thinks, once known

    def sampling(self, n_ctx: int) -> SamplingParams:
        return self.req.params

    def reading(self, prompt: gen.PromptFacts) -> ToolSetup | None:
        self.thinks = prompt.thinks or prompt.started_in_thought
        return self.req.structured.setup(prompt.tool_format, self.reasoning_format,
                                         thinks=prompt.thinks,
                                         started_in_thought=prompt.started_in_thought)

    def frames(self, generation: gen.Generation) -> Reply:
        items = OutputItems(self.req.tools.namespaces,
                            self.store.seal if self.req.sealed else None)
        return Reply(ResponseObject(generation.model, self.req.echo), AnswerReader(generation.setup),
                     items, self._keep)

    def writer(self, generation: gen.Generation, hosted: HostedTools) -> McpReply:
        items = OutputItems(self.req.tools.namespaces,
                            self.store.seal if self.req.sealed else None)
        return McpReply(ResponseObject(generation.model, self.req.echo), items, hosted,
                        self._keep)

    def _keep(self, response: dict, added: list[dict]) -> None:
        if self.req.store:
            self.store.put(StoredResponse(response, self.req.input_items,
                                          [*self.req.history, *added]))


@router.post("/v1/responses/input_tokens")
async def input_tokens(request: Request) -> dict:
    """How many tokens the request's prompt is on its model. Raises what
    parsing a /v1/responses body and ServerState.lease raise."""
    _, req = await _parse(request)
    state = state_of(request)
    with await state.lease(req.model, req.keep_alive) as lease:
        tokens = await run_on(state.workers.render, gen.prompt_tokens, lease.llm, _prompt(req),
                              state.preset(req.model))
    return {"object": "response.input_tokens", "input_tokens": len(tokens)}


async def _stored(request: Request, response_id: str) -> StoredResponse:
    state = state_of(request)
    found = await run_on(state.workers.query, store_for_home(state.settings).get, response_id)
    if found is None:
        raise ResponseNotFound(f"no response with id {response_id[:80]!r} is stored",
                               param="response_id")
    return found


@router.get("/v1/responses/{response_id}")
async def retrieve(request: Request, response_id: str) -> dict:
    """A stored response object. Raises ResponseNotFound, and InvalidParams
    for stream=true (replaying a stream is not supported)."""
    if request.query_params.get("stream") not in (None, "false"):
        raise InvalidParams("'stream' is not supported when retrieving a response",
                            param="stream")
    return (await _stored(request, response_id)).response


@router.delete("/v1/responses/{response_id}")
async def delete(request: Request, response_id: str) -> dict:
    """Delete a stored response. Raises ResponseNotFound."""
    state = state_of(request)
    if not await run_on(state.workers.query, store_for_home(state.settings).delete, response_id):
        raise ResponseNotFound(f"no response with id {response_id[:80]!r} is stored",
                               param="response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(request: Request, response_id: str) -> dict:
    """A page of the input items a stored response was given. Raises
    ResponseNotFound, and InvalidParams for a limit outside [1, 100], an
    order other than asc or desc, or an `after` that is not one of them."""
    query = request.query_params
    raw_limit, order, after = query.get("limit", "20"), query.get("order", "desc"), query.get("after")
    limit = int(raw_limit) if raw_limit.isdecimal() else 0
    if not 1 <= limit <= 100:
        raise InvalidParams("'limit' must be in [1, 100]", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidParams("'order' must be asc or desc", param="order")
    items = (await _stored(request, response_id)).input_items
    items = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i.get("id") for i in items]
        if after not in ids:
            raise InvalidParams(f"'after' {after[:80]!r} is not an item of this response",
                                param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
