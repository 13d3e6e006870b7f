"""`llmctl ps` and `llmctl stop`: ask a running `llmctl serve` what it has
loaded, and unload a model. Both speak Ollama's API (/api/ps, and
/api/generate with keep_alive 0), so they work against Ollama too."""

from __future__ import annotations

from datetime import datetime, timezone

import typer
from rich.markup import escape
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, human_bytes, out, print_json
from llmctl.cli.tables import fitted
from llmctl.errors import AuthError, LlmctlError, ModelNotFound, ServerUnreachable, UsageError

Url = Annotated[str, typer.Option(
    "--url", envvar="LLMCTL_URL", help="The server's address.")]
ApiKey = Annotated[str, typer.Option(
    "--api-key", envvar="LLMCTL_API_KEY", help="Its --api-key, if it has one.")]
DEFAULT_URL = "http://127.0.0.1:8000"


def call(method: str, url: str, path: str, api_key: str, body: dict | None = None) -> dict:
    """One request to the server. Raises ServerUnreachable, AuthError,
    ModelNotFound (404) and LlmctlError with the server's own message."""
    import httpx

    base = url.strip().rstrip("/").removesuffix("/v1")
    if not base.startswith(("http://", "https://")):
        raise UsageError(f"invalid --url {url!r}: expected http://HOST:PORT")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.request(method, base + path, json=body, headers=headers, timeout=120)
    except httpx.TransportError as e:
        raise ServerUnreachable(f"cannot reach {base}: {e or type(e).__name__} "
                                "(is `llmctl serve` running? see --url)") from e
    try:
        data = r.json()
    except ValueError:
        data = {}
    if r.status_code == 200:
        return data
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    message = message or f"HTTP {r.status_code}"
    raise {401: AuthError, 404: ModelNotFound}.get(r.status_code, LlmctlError)(message)


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m" if seconds < 3600 else f"{seconds / 3600:.1f}h"


def _until(expires_at: str, keep_alive_s: float | None) -> str:
    if keep_alive_s is not None and keep_alive_s < 0:
        return "never"
    try:
        when = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return "?"
    left = (when - datetime.now(timezone.utc)).total_seconds()
    return "now" if left <= 0 else f"in {_ago(left)}"


@handle_errors
def ps(url: Url = DEFAULT_URL, api_key: ApiKey = "", json: o.Json = False) -> None:
    """Show the models a running server has loaded.

    For each: its memory, context, slots in use, requests queued for it,
    idle time and when it unloads; then the server's whole queue.

    Example: llmctl ps --url http://127.0.0.1:8000
    """
    answer = call("GET", url, "/api/ps", api_key)
    models = answer.get("models", [])
    queue = (answer.get("llmctl") or {}).get("queue")
    if json:
        print_json({"models": models, "queue": queue})
        return
    if not models:
        err.print("no models loaded")
    else:
        cells = []
        for m in models:
            extra = m.get("llmctl", {})
            slots = f"{extra.get('slots_running', '?')}/{extra.get('slots', '?')}"
            idle = "busy" if extra.get("requests_active") else _ago(extra.get("idle_s", 0.0))
            cells.append([escape(m["name"]), human_bytes(m.get("size", 0)),
                          str(m.get("context_length", "?")), slots, str(extra.get("queued", "?")),
                          idle, _until(m.get("expires_at", ""), extra.get("keep_alive_s"))])
        out.print(fitted(("NAME", "SIZE", "CONTEXT", "SLOTS", "QUEUED", "IDLE", "UNLOADS"), cells,
                         out, whole=("NAME",), drops=("UNLOADS", "CONTEXT", "QUEUED", "IDLE")))
    if queue:
        out.print(_queue_line(queue), markup=False)


def _queue_line(q: dict) -> str:
    """The server's queue in one line: count, oldest wait, memory, refusals."""
    line = (f"queue: {q.get('queued', 0)} of {q.get('max_queued', '?')} waiting, "
            f"{human_bytes(q.get('queued_bytes', 0))} of {human_bytes(q.get('max_queued_bytes', 0))}")
    if q.get("queued"):
        line += f", oldest {q.get('oldest_wait_s', 0):.1f} s"
    return line + (f"; {q['refused']} refused since start" if q.get("refused") else "")


@handle_errors
def stop(model: Annotated[str, typer.Argument(help="A loaded model's name.")],
         url: Url = DEFAULT_URL, api_key: ApiKey = "") -> None:
    """Unload a model from a running server.

    Requests already running on it finish first.

    Example: llmctl stop qwen2.5-coder-0.5b
    """
    loaded = {m["name"] for m in call("GET", url, "/api/ps", api_key).get("models", [])}
    if model.removesuffix(":latest") not in loaded:
        raise ModelNotFound(f"{model!r} is not loaded (loaded: {', '.join(sorted(loaded)) or 'none'})")
    call("POST", url, "/api/generate", api_key, {"model": model, "keep_alive": 0})
    err.print(f"unloaded {model}")


def register(app: typer.Typer) -> None:
    app.command("ps")(ps)
    app.command("stop")(stop)

