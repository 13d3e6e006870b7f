"""Every failure leaves the server in its route's error shape (OpenAI's;
Ollama's on /api/*; Anthropic's on /v1/messages), with the status its
error type maps to. Unknown exceptions are the only 500s."""

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


def _anthropic(path: str) -> bool:
    # Anthropic's clients read {"type": "error", "error": {"type", "message"}}.
    return path == "/v1/messages" or path.startswith("/v1/messages/")


# Anthropic's error types by status; 529 is its "overloaded".
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error",
                    405: "invalid_request_error", 413: "request_too_large",
                    429: "rate_limit_error", 529: "overloaded_error"}


def anthropic_status(status: int, e: LlmctlError | None = None) -> int:
    """The status an Anthropic client gets for `status`: a full queue and
    the 503s that pass on their own (busy, loading, a lost replica) are its
    529 "overloaded", which its clients retry."""
    if isinstance(e, QueueFull) or status == 503:
        return 529
    return status


def anthropic_body(message: str, status: int) -> dict:
    """Anthropic's error object for a response of `status` (after
    anthropic_status): {"type": "error", "error": {"type", "message"}}."""
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"),
                                       "message": message}}


def error_response(e: LlmctlError, path: str = "") -> JSONResponse:
    """`e` as a response in the shape the route's clients read (`path`)."""
    if _anthropic(path):
        status = anthropic_status(e.http_status, e)
        return JSONResponse(anthropic_body(e.message, status), status_code=status,
                            headers=retry_headers(e))
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
        if _anthropic(request.url.path):
            return JSONResponse(anthropic_body(str(e.detail), status), status_code=status,
                                headers=getattr(e, "headers", None))
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
        message = f"internal error: {type(e).__name__}"
        if _anthropic(request.url.path):
            return JSONResponse(anthropic_body(message, 500), status_code=500)
        return JSONResponse(error_body(message, "server_error"), status_code=500)
