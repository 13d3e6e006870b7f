"""The FastAPI application: error mapping, access control and the routes.
Handlers live in info_routes.py and one folder per protocol: openai/
(chat and text completions, embeddings), responses/ (OpenAI's Responses),
anthropic/ (Anthropic's Messages), ollama/ (Ollama's /api/*) and webui/
(the chat page at /, unless --no-webui). Every
protocol generates through generation.py; the generation is the runtime's."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from llmctl.server import errors, info_routes, middleware
from llmctl.server.admission import AdmissionGuard
from llmctl.server.anthropic import routes as anthropic
from llmctl.server.ollama import routes as ollama
from llmctl.server.openai import completions, embeddings
from llmctl.server.responses import routes as responses
from llmctl.server.state import ServerState
from llmctl.server.webui import routes as webui


def create_app(state: ServerState, bind_host: str | None = None) -> FastAPI:
    """The app for `state`; `bind_host` (the --host it listens on) is also
    accepted in the Host header of a loopback server."""
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        # The worker threads live as long as the app: idle ones end with it,
        # a stuck one is a daemon that ends with the process.
        try:
            yield
        finally:
            state.workers.shutdown()
            if state.mcp is not None:       # the MCP servers it started stop with it
                state.mcp.close()

    app = FastAPI(title="llmctl", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.llmctl = state
    errors.install(app)
    # Innermost: only requests that passed the access policy are admitted.
    app.add_middleware(AdmissionGuard, admission=state.admission)
    # The access policy the cluster's ingress applies too (middleware.layers).
    middleware.install(app, state.policy, bind_host)
    app.include_router(info_routes.router)
    app.include_router(completions.router)
    app.include_router(embeddings.router)
    app.include_router(ollama.router)
    app.include_router(responses.router)
    app.include_router(anthropic.router)
    if state.policy.webui:
        app.include_router(webui.router)
    return app
