"""Everything but generation: health, models, metrics, stats, tokenizer."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from llmctl.errors import InvalidParams
from llmctl.server.body import json_body
from llmctl.server.state import state_of

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    state = state_of(request)
    if state.llm is None:
        return JSONResponse({"status": "loading" if not state.load_error else "error",
                             "error": state.load_error}, status_code=503)
    return {"status": "ok", "model": state.name}


@router.get("/v1/models")
async def models(request: Request):
    state = state_of(request)
    return {"object": "list", "data": [{"id": state.name, "object": "model",
                                         "created": int(state.started), "owned_by": "llmctl"}]}


@router.get("/metrics")
async def metrics(request: Request):
    state = state_of(request)
    llm = state.llm
    text = state.metrics.render(llm.engine.n_running if llm else 0,
                                llm.engine.n_waiting if llm else 0)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


@router.get("/stats")
async def stats(request: Request):
    state = state_of(request)
    m = state.metrics
    return {"model": state.name, "requests": m.requests, "prompt_tokens": m.prompt_tokens,
            "prefix_cache_hit_tokens": m.cached_tokens, "generation_tokens": m.generation_tokens}


# llama-server's tokenizer endpoints, so benchmarks can build prompts of
# exact token counts against any server that speaks them.
@router.post("/tokenize")
async def tokenize(request: Request):
    body = await json_body(request)
    content = body.get("content")
    if not isinstance(content, str):
        raise InvalidParams("'content' must be a string", param="content")
    model = state_of(request).ready().model
    return {"tokens": model.tokenize(content, add_special=bool(body.get("add_special", False)),
                                     parse_special=True)}


@router.post("/detokenize")
async def detokenize(request: Request):
    body = await json_body(request)
    model = state_of(request).ready().model
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            type(t) is int and 0 <= t < model.n_vocab for t in tokens):
        raise InvalidParams("'tokens' must be a list of token ids", param="tokens")
    return {"content": model.detokenize(tokens)}
