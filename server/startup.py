"""`llmctl serve`'s start-up: check the settings, the port and the model, build
the pool and the app, then serve until interrupted, loading models on demand."""

from __future__ import annotations

import errno
import logging
import socket
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from llmctl.errors import UsageError
from llmctl.runtime.llm import check_draft
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.pool.model_pool import ModelPool
from llmctl.runtime.pool.room import FOREVER
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.admission import Admission
from llmctl.server.app import create_app
from llmctl.server.state import HttpPolicy, ServerState
from llmctl.server.workers import Workers
from llmctl.store.registry import load_registry
from llmctl.store.resolve import ResolvedModel, default_model_name, resolve_model

if TYPE_CHECKING:
    from llmctl.tools.mcp_config import McpServer
    from llmctl.tools.mcp_hub import McpHub

GIB = 1 << 30


@dataclass(frozen=True)
class PoolSettings:
    """How many models the server may hold, for how long, and how their
    answers are read and ended."""

    models_max: int = 3
    memory_budget: int | None = None    # bytes; None: available RAM less a margin
    keep_alive_s: float = 300.0         # FOREVER (-1): never unload when idle
    reasoning_format: str = "auto"
    loop_guard: bool = False            # --loop-guard: the default of every request


def default_memory_budget() -> int:
    """The RAM available now, less a margin for the OS and the server
    itself: 10% of the total, at least 1 GiB."""
    import psutil

    vm = psutil.virtual_memory()
    return max(vm.available - max(GIB, vm.total // 10), vm.available // 2)


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


def check_port(host: str, port: int) -> None:
    """Check that `host:port` can be bound. Raises UsageError when the port is
    in use or cannot be listened on (with the OSError's reason)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} on {host} is already in use") from None
            raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def raise_open_files_limit(connections: int) -> None:
    """Lift this process's open-file limit towards its hard limit, so that
    `connections` queued clients (a socket each) fit: many systems start
    processes at 1,024, which a burst passes. Raises nothing."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = connections + 1024          # model files, logs, the listener
        if soft != resource.RLIM_INFINITY and soft < want:
            top = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, top), hard))
    except (ImportError, ValueError, OSError):
        pass                # a platform without it, or a limit we may not lift


def _preload(state: ServerState, resolved: ResolvedModel | None,
             on_ready: Callable[[str], None] | None, url: str) -> None:
    """Load the model `serve` was started with; /health answers 503 while
    this runs, so orchestrators can wait. Raises nothing: a failure is
    reported through /health and the log."""
    try:
        if resolved is not None:
            state.pool.acquire(resolved.name, FOREVER).release()
    except Exception as e:
        state.load_error = str(e)
        logging.getLogger("llmctl.server").error("model failed to load: %s", e)
        return
    finally:
        state.preloading = False
    if on_ready:
        on_ready(url)


def queue_bounds(queue: tuple[int | None, float | None], max_body: int) -> Admission:
    """The server's Admission for (--max-queued, --max-queued-mb). Raises
    UsageError for a bad setting, or a memory bound that cannot hold one
    request of `max_body` bytes (it could never be admitted)."""
    admission = Admission.from_flags(*queue)
    need = admission.charge_for(max_body)
    if need > admission.max_queued_bytes:
        raise UsageError(f"--max-queued-mb {admission.max_queued_bytes / (1 << 20):g} cannot "
                         f"hold one request of --max-body-mb {max_body / (1 << 20):g} "
                         f"(that needs {need / (1 << 20):.1f} MiB)")
    return admission


def _hub(servers: dict[str, McpServer] | None) -> McpHub | None:
    if not servers:
        return None
    from llmctl.tools.mcp_hub import McpHub

    return McpHub(servers)


def serve(model: str | None, host: str, port: int, load: LoadOptions,
          policy: HttpPolicy | None = None, on_ready: Callable[[str], None] | None = None,
          pool_settings: PoolSettings | None = None,
          queue: tuple[int | None, float | None] = (None, None),
          mcp_servers: dict[str, McpServer] | None = None) -> None:
    """Serve until interrupted. With `model` (a model, or a preset of the
    config file, whose model is loaded and which requests that name none
    get) it is loaded at start and kept (LRU eviction aside); without,
    models load on their first request. `queue` is (--max-queued,
    --max-queued-mb); None: the defaults. The settings without a flag are
    `load.settings` (Settings.load()'s, read by the command line).
    `mcp_servers` (--mcp) are the MCP servers requests may name; they
    start on first use and stop with the server.
    Raises UsageError (port in use, a bad setting), ConfigError (a bad
    preset) and what resolving `model` raises."""
    import uvicorn

    from llmctl.config_file import load_config
    from llmctl.presets import load_presets

    pool_settings = pool_settings or PoolSettings()
    presets = load_presets(load_config())
    preset = presets.get(model) if model else None
    resolved = resolve_model(preset.model if preset else model) if model else None
    if resolved is not None:
        check_draft(resolved, load)     # a bad draft pair fails now, not after listening
    admission = queue_bounds(queue, (policy or HttpPolicy()).max_body_bytes)
    check_port(host, port)
    raise_open_files_limit(admission.max_queued)
    pool = ModelPool(load, models_max=pool_settings.models_max,
                     memory_budget=pool_settings.memory_budget or default_memory_budget(),
                     keep_alive_s=pool_settings.keep_alive_s, max_waiters=admission.max_queued)
    if resolved is not None:
        pool.add_named(resolved, *_aliases(resolved.name, resolved.path.stem))
    # Without a model on the command line, a request that names none gets
    # the registry's default (loaded on demand, like any other).
    default = preset.name if preset else resolved.name if resolved else default_model_name()
    state = ServerState(pool, default=default, presets=presets,
                        policy=policy or HttpPolicy(), preloading=resolved is not None,
                        reasoning_format=pool_settings.reasoning_format, admission=admission,
                        defaults=SamplingParams(loop_guard=pool_settings.loop_guard),
                        settings=load.settings, workers=Workers.of(load.settings),
                        mcp=_hub(mcp_servers))
    app = create_app(state, bind_host=host)
    loader = threading.Thread(target=_preload, args=(state, resolved, on_ready,
                                                     f"http://{host}:{port}"),
                              name="llmctl-load", daemon=True)
    loader.start()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=3)
    try:
        uvicorn.Server(config).run()
    finally:
        loader.join()
        pool.close()
    sys.stderr.flush()
