"""Everything but generation: health, models, metrics, stats, tokenizer."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from llmctl.errors import InvalidParams
from llmctl.runtime.pool.model_pool import ModelPool
from llmctl.server.body import json_body
from llmctl.server.metrics import render as render_metrics
from llmctl.server.metrics import render_queue
from llmctl.server.state import state_of
from llmctl.server.workers import run_on

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    """GET /health: "ok" with the loaded models, else 503 with "loading" or
    "error" and why."""
    state = state_of(request)
    status, why = state.health()
    if status != "ok":
        return JSONResponse({"status": status, "error": why}, status_code=503)
    return {"status": "ok", "model": state.default,
            "models": [e.name for e in state.pool.loaded() if not e.loading]}


@router.get("/v1/models")
async def models(request: Request):
    """The models this server serves now: those loaded, those named on
    its command line, and the config file's presets. /api/tags lists every
    model in the store."""
    state = state_of(request)
    names = dict.fromkeys([e.name for e in state.pool.loaded()] + state.pool.named()
                          + list(state.presets))
    return {"object": "list", "data": [{"id": name, "object": "model",
                                         "created": int(state.started), "owned_by": "llmctl",
                                         **_context(state.pool, state.model_of(name) or name)}
                                        for name in names]}


def _context(pool: ModelPool, name: str) -> dict:
    """Tokens per sequence, under vLLM's and LM Studio's names: the loaded
    model's; else --ctx-size or its registry default (null when only the
    file will say, once it loads)."""
    loaded = next((e.llm for e in pool.loaded() if e.name == name and e.llm), None)
    if loaded is not None:
        n_ctx: int | None = loaded.n_ctx
    else:
        named = pool.named_model(name)
        n_ctx = pool.opts.ctx_size or (named.context if named else None)
    return {"context_length": n_ctx, "max_model_len": n_ctx}


@router.get("/metrics")
async def metrics(request: Request):
    """GET /metrics: every model's counters, in Prometheus' text format."""
    state = state_of(request)
    pool = state.pool
    # Every model's counters, and those of models already unloaded.
    per_model = {e.name: e.llm.stats() for e in pool.loaded() if e.llm}
    text = render_metrics(pool.stats(), len(pool.loaded()), per_model) + \
        render_queue(state.admission.view())
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


@router.get("/stats")
async def stats(request: Request):
    """GET /stats: the pool's counters, each loaded model's, and the workers'."""
    state = state_of(request)
    per_model = {e.name: e.llm.stats().as_dict() for e in state.pool.loaded() if e.llm}
    return {"model": state.default, **state.pool.stats().as_dict(), "models": per_model,
            "workers": state.workers.snapshot(), "queue": state.admission.view().as_dict()}


# llama-server's tokenizer endpoints, so benchmarks can build prompts of
# exact token counts against any server that speaks them.
@router.post("/tokenize")
async def tokenize(request: Request):
    """POST /tokenize (llama-server's): `content` as token ids. Answers 400
    (InvalidParams) for a non-string content or model, and what ServerState.lease raises."""
    body = await json_body(request)
    content = body.get("content")
    if not isinstance(content, str):
        raise InvalidParams("'content' must be a string", param="content")
    with await state_of(request).lease(_model_field(body)) as lease:
        # Off the event loop: a large text would stall every stream meanwhile.
        tokens = await run_on(state_of(request).workers.render, lease.llm.tokenize,
                              content, add_special=bool(body.get("add_special", False)),
                              parse_special=True)
    return {"tokens": tokens}


@router.post("/detokenize")
async def detokenize(request: Request):
    """POST /detokenize (llama-server's): `tokens` as text. Answers 400
    (InvalidParams) for anything but a list of the model's token ids or a non-string
    model, and what ServerState.lease raises."""
    body = await json_body(request)
    with await state_of(request).lease(_model_field(body)) as lease:
        llm = lease.llm
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
                type(t) is int and 0 <= t < llm.n_vocab for t in tokens):
            raise InvalidParams("'tokens' must be a list of token ids", param="tokens")
        return {"content": await run_on(state_of(request).workers.render,
                                        llm.detokenize, tokens)}


def _model_field(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidParams("'model' must be a string", param="model")
    return model or None
