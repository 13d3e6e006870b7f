"""The chat page: `/` and its files under /webui/static/, each with a strict
Content-Security-Policy, plus the two routes the page needs beyond the
OpenAI API: the models it can pick (loaded or not, with their memory) and a
load of one. Generation goes through /v1/chat/completions like any client's.

The page and its files are public (middleware.AccessGuard opens them): a
browser's navigation carries no Authorization header, and the page must
load to ask for the key. The JSON routes need the key like any other."""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from llmctl.errors import InvalidParams, LlmctlError
from llmctl.server.body import json_body
from llmctl.server.fields import typed_field
from llmctl.server.state import ServerState, state_of
from llmctl.server.webui import PAGE_PATH, STATIC_PREFIX
from llmctl.server.workers import run_on
from llmctl.store.index import StoreIndex
from llmctl.store.pypi_parts import part_path
from llmctl.store.registry import RegistryModel, load_registry

STATIC = Path(__file__).resolve().parent / "static"
# Scripts and styles only from files of this server (no inline code, no
# other host), fetches only to it, nothing framed or posted elsewhere.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}

router = APIRouter()


@lru_cache(maxsize=None)
def _files() -> dict[str, tuple[bytes, str, str]]:
    """The page's files by name, with their type and ETag, read once: only
    these names are served, so no path a request writes reaches the file
    system."""
    return {p.name: (body, _TYPES[p.suffix], '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
            for p in STATIC.iterdir() if p.suffix in _TYPES for body in [p.read_bytes()]}


def _page_response(request: Request, name: str) -> Response:
    found = _files().get(name)
    if found is None:
        raise HTTPException(404, f"the chat page has no file {name!r}")
    body, media_type, etag = found
    # no-cache: the browser asks each time, and a file it has is a bodiless 304.
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
               "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache", "ETag": etag}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=media_type, headers=headers)


@router.get(PAGE_PATH, include_in_schema=False)
async def page(request: Request):
    """GET /: the chat page."""
    return _page_response(request, "index.html")


@router.get(STATIC_PREFIX + "{name}", include_in_schema=False)
async def static(request: Request, name: str):
    """GET /webui/static/NAME: one of the page's files. Raises HTTPException
    (404) for any other name."""
    return _page_response(request, name)


def _available(spec: RegistryModel) -> bool:
    """Whether installed packages can provide the registry model (no Hub)."""
    try:
        if spec.parts:
            return all(part_path(spec, n) for n in range(1, spec.parts_count + 1))
    except LlmctlError:         # a models.toml entry whose parts escape their folder
        return False
    return spec.package is not None and importlib.util.find_spec(spec.package) is not None


def _catalogue(state: ServerState) -> list[dict]:
    """Every model a request may name without a download, loaded ones first
    with their planned memory (weights plus KV cache), then the presets."""
    found: dict[str, dict] = {}
    for e in state.pool.loaded():
        found[e.name] = {"name": e.name, "loaded": e.llm is not None, "loading": e.loading,
                         "bytes": e.bytes}
    names = state.pool.named() + [e.name for e in StoreIndex().list() if Path(e.path).is_file()]
    names += [n for n, spec in load_registry().models.items() if _available(spec)]
    for name in names:
        found.setdefault(name, {"name": name, "loaded": False, "loading": False, "bytes": None})
    # A preset is picked like a model, and is loaded when its model is.
    for name, preset in state.presets.items():
        model = found.get(preset.model, {"loaded": False, "loading": False, "bytes": None})
        found[name] = {**model, "name": name, "preset_of": preset.model}
    return list(found.values())


@router.get("/webui/models")
async def models(request: Request):
    """GET /webui/models: the server's default model, the models the page
    can pick, each with whether it is loaded (or loading) and its memory,
    and the MCP servers whose tools requests may have it run (--mcp)."""
    state = state_of(request)
    servers = state.mcp.servers.values() if state.mcp is not None else []
    return {"default": state.default,
            "models": await run_on(state.workers.query, _catalogue, state),
            "mcp": [{"label": s.label, "description": s.description} for s in servers]}


@router.post("/webui/load")
async def load(request: Request):
    """POST /webui/load {"model": NAME}: load the model (a no-op when it is
    loaded) and answer once it is ready. Answers 400 (InvalidParams) without
    a model name, and what ServerState.lease raises (404 for an unknown one)."""
    body = await json_body(request)
    name = typed_field(body, "model", (str,))
    if not name:
        raise InvalidParams("'model' is required", param="model")
    state = state_of(request)
    with await state.lease(name) as lease:
        return {"model": lease.name, "loaded": True}
