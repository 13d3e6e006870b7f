"""`llmctl serve`: load a model and serve it until interrupted."""

from __future__ import annotations

import errno
import logging
import socket
import sys
import threading
from typing import Callable

from llmctl.errors import UsageError
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.server.app import create_app
from llmctl.server.state import HttpPolicy, ServerState
from llmctl.store.registry import load_registry
from llmctl.store.resolve import resolve_model


def _aliases(name: str, path_stem: str) -> set[str]:
    """Names a client may put in `model`: ours, the file's, and the registry
    spellings of the same model (as Ollama and LM Studio clients send)."""
    names = {name, path_stem}
    spec = load_registry().get(name)
    if spec is not None:
        names.add(spec.repo)
        if spec.quant:
            names.add(f"{spec.repo}:{spec.quant}")
    return names


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} on {host} is already in use") from None
            raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def serve(model: str | None, host: str, port: int, load: LoadOptions,
          policy: HttpPolicy | None = None, on_ready: Callable[[str], None] | None = None) -> None:
    import uvicorn

    resolved = resolve_model(model)
    _check_port(host, port)
    state = ServerState(name=resolved.name, aliases=_aliases(resolved.name, resolved.path.stem),
                        policy=policy or HttpPolicy())
    app = create_app(state, bind_host=host)

    def load_model() -> None:
        # /health answers 503 while this runs, so orchestrators can wait.
        try:
            state.llm = LLM(resolved, load)
        except Exception as e:  # reported through /health and the log
            state.load_error = str(e)
            logging.getLogger("llmctl.server").error("model failed to load: %s", e)
            return
        if on_ready:
            on_ready(f"http://{host}:{port}")

    loader = threading.Thread(target=load_model, name="llmctl-load", daemon=True)
    loader.start()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=3)
    try:
        uvicorn.Server(config).run()
    finally:
        loader.join()
        if state.llm is not None:
            state.llm.close()
    sys.stderr.flush()
