"""Everything but generation: health, models, metrics, stats, tokenizer."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from llmctl.errors import InvalidParams, LlmctlError
from llmctl.server.body import json_body
from llmctl.server.metrics import render as render_metrics
from llmctl.server.state import state_of

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    state = state_of(request)
    try:
        state.ready()
    except LlmctlError as e:
        status = "loading" if state.llm is None and not state.load_error else "error"
        return JSONResponse({"status": status, "error": None if status == "loading" else e.message},
                            status_code=503)
    return {"status": "ok", "model": state.name}


@router.get("/v1/models")
async def models(request: Request):
    state = state_of(request)
    return {"object": "list", "data": [{"id": state.name, "object": "model",
                                         "created": int(state.started), "owned_by": "llmctl"}]}


@router.get("/metrics")
async def metrics(request: Request):
    state = state_of(request)
    stats = (state.llm or state.ready()).stats()   # still readable after an engine failure
    return PlainTextResponse(render_metrics(stats), media_type="text/plain; version=0.0.4")


@router.get("/stats")
async def stats(request: Request):
    state = state_of(request)
    return {"model": state.name, **(state.llm or state.ready()).stats().as_dict()}


# llama-server's tokenizer endpoints, so benchmarks can build prompts of
# exact token counts against any server that speaks them.
@router.post("/tokenize")
async def tokenize(request: Request):
    body = await json_body(request)
    content = body.get("content")
    if not isinstance(content, str):
        raise InvalidParams("'content' must be a string", param="content")
    model = state_of(request).ready().model
    # Off the event loop: a large text would stall every stream meanwhile.
    tokens = await asyncio.to_thread(model.tokenize, content,
                                     add_special=bool(body.get("add_special", False)),
                                     parse_special=True)
    return {"tokens": tokens}


@router.post("/detokenize")
async def detokenize(request: Request):
    body = await json_body(request)
    model = state_of(request).ready().model
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            type(t) is int and 0 <= t < model.n_vocab for t in tokens):
        raise InvalidParams("'tokens' must be a list of token ids", param="tokens")
    return {"content": model.detokenize(tokens)}
