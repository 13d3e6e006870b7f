"""/v1/embeddings in OpenAI's shape: parse and check the request, embed on a
worker thread (llmctl.runtime.embed), and return floats or base64. The work
stops between batches once the client hangs up (server/watch.py's
`embed_watched`, which Ollama's embedding routes use too)."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
from fastapi import APIRouter, Request

from llmctl.errors import InvalidParams
from llmctl.runtime.embed import embed_texts, embed_tokens
from llmctl.server.body import json_body
from llmctl.server.fields import typed_field
from llmctl.server.state import state_of
from llmctl.server.watch import embed_watched

router = APIRouter()

# What the route reads. `truncate` is an extension (Ollama's and TEI's name):
# false refuses an input too long instead of cutting it.
_FIELDS = {"model", "input", "encoding_format", "dimensions", "user", "keep_alive", "truncate"}
# Other servers' fields whose default is what llmctl does anyway.
_DEFAULTS = {"normalize": True}


@dataclass(frozen=True)
class EmbeddingRequest:
    """A validated /v1/embeddings request: texts or token arrays, the output
    encoding, dimensions, truncation and keep_alive."""

    model: str | None
    texts: list[str] | None         # either texts
    tokens: list[list[int]] | None  # ... or token arrays
    base64: bool
    dimensions: int | None
    truncate: bool
    keep_alive: object


def parse_embedding_request(body: dict) -> EmbeddingRequest:
    """Raises InvalidParams naming the field at fault, including any field
    llmctl does not implement that asks for something."""
    for key, value in body.items():
        if key not in _FIELDS and value is not None and not (key in _DEFAULTS
                                                             and _DEFAULTS[key] == value):
            raise InvalidParams(f"'{key}' is not supported by llmctl's /v1/embeddings",
                                param=key)
    fmt = typed_field(body, "encoding_format", (str,)) or "float"
    if fmt not in ("float", "base64"):
        raise InvalidParams("'encoding_format' must be 'float' or 'base64'",
                            param="encoding_format")
    typed_field(body, "user", (str,))
    texts, tokens = _inputs(body.get("input"))
    truncate = typed_field(body, "truncate", (bool,))
    return EmbeddingRequest(model=typed_field(body, "model", (str,)) or None, texts=texts,
                            tokens=tokens, base64=fmt == "base64",
                            dimensions=typed_field(body, "dimensions", (int,)),
                            truncate=truncate is not False, keep_alive=body.get("keep_alive"))


def _inputs(value) -> tuple[list[str] | None, list[list[int]] | None]:
    """OpenAI's four forms of `input`: a string, strings, one token array,
    token arrays. Item checks beyond the form are embed's."""
    if isinstance(value, str):
        return [value], None
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return value, None
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return None, [value]
        if all(isinstance(v, list) for v in value):
            return None, value
    if value == []:
        raise InvalidParams("'input' is an empty list", param="input")
    raise InvalidParams("'input' must be a string, an array of strings, an array of token "
                        "ids or an array of token-id arrays", param="input")


def _encode(vector: list[float], as_base64: bool):
    # OpenAI's base64 is the little-endian float32 bytes.
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode() \
        if as_base64 else vector


@router.post("/v1/embeddings")
async def embeddings(request: Request):
    """POST /v1/embeddings: the inputs' vectors as floats or base64, in
    OpenAI's shape. Answers 400 (InvalidParams) for a bad field, and what
    ServerState.lease and embed_texts raise."""
    req = parse_embedding_request(await json_body(request))
    state = state_of(request)
    preset = state.preset(req.model)
    lease = await state.lease(req.model, req.keep_alive)
    try:
        embed, items = (embed_texts, req.texts) if req.texts is not None else \
            (embed_tokens, req.tokens)
        vectors, n_prompt = await embed_watched(
            request, embed, lease.llm, items, truncate=req.truncate, dimensions=req.dimensions)
    finally:
        lease.release()
    return {"object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": _encode(v, req.base64)}
                     for i, v in enumerate(vectors)],
            "model": preset.name if preset else lease.name,
            "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt}}
