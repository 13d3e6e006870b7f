"""The FastAPI application: error mapping, the API-key check and the routes.
Handlers live in info_routes.py and completions.py; no generation logic
lives in the server at all."""

from __future__ import annotations

import secrets

from fastapi import FastAPI, Request

from llmctl.errors import AuthError
from llmctl.server import completions, errors, info_routes
from llmctl.server.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="llmctl", docs_url=None, redoc_url=None)
    app.state.llmctl = state
    errors.install(app)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if state.policy.api_key and request.url.path.startswith("/v1"):
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(token.encode(), state.policy.api_key.encode()):
                return errors.error_response(AuthError("invalid or missing API key"))
        return await call_next(request)

    app.include_router(info_routes.router)
    app.include_router(completions.router)
    return app
