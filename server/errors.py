"""Every failure leaves the server as OpenAI's error body, with the status
its error type maps to. Unknown exceptions are the only 500s."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from llmctl.errors import LlmctlError, ModelsBusy, QueueFull, ReplicaLost

log = logging.getLogger("llmctl.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}


def error_body(message: str, etype: str, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error object: {"error": {message, type, param, code}}."""
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


def retry_headers(e: LlmctlError) -> dict | None:
    """Retry-After for the errors that pass on their own: a slot frees, an
    idle model unloads."""
    return {"Retry-After": "1"} if isinstance(e, (QueueFull, ModelsBusy, ReplicaLost)) else None


def _ollama(path: str) -> bool:
    # Ollama's clients read {"error": "..."}; everything else gets OpenAI's shape.
    return path.startswith("/api/")


def error_response(e: LlmctlError, path: str = "") -> JSONResponse:
    """`e` as a response in the shape the route's clients read (`path`)."""
    body = {"error": e.message} if _ollama(path) else \
        error_body(e.message, e.error_type, e.code, e.param)
    return JSONResponse(body, status_code=e.http_status, headers=retry_headers(e))


def install(app: FastAPI) -> None:
    """Register the handlers that answer LlmctlError, HTTP errors, a client gone
    mid-body and any other exception (a 500) with error bodies."""
    @app.exception_handler(LlmctlError)
    async def _typed(request: Request, e: LlmctlError) -> JSONResponse:
        return error_response(e, request.url.path)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> JSONResponse:
        status = e.status_code
        body = {"error": str(e.detail)} if _ollama(request.url.path) else \
            error_body(str(e.detail), _TYPES.get(status, "invalid_request_error"))
        return JSONResponse(body, status_code=status, headers=getattr(e, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, e: ClientDisconnect) -> Response:
        # No one reads this: the client left mid-body, or the body cap
        # already answered 413 in the app's place (middleware.AccessGuard).
        return Response(status_code=400)

    @app.exception_handler(Exception)
    async def _unknown(request: Request, e: Exception) -> JSONResponse:
        log.exception("internal error")
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", "server_error"),
                            status_code=500)
