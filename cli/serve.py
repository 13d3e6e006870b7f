"""`llmctl serve`: an OpenAI-compatible HTTP server."""

from __future__ import annotations

from enum import Enum

import typer
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors


class FlashAttn(str, Enum):
    auto = "auto"
    on = "on"
    off = "off"


@handle_errors
def serve(
    model: o.ModelArg = None,
    host: Annotated[str, typer.Option("--host", envvar="LLMCTL_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, envvar="LLMCTL_PORT")] = 8000,
    max_num_seqs: Annotated[int, typer.Option(
        "--max-num-seqs", min=1, max=256, envvar="LLMCTL_MAX_NUM_SEQS",
        help="Sequences decoded together (continuous batching slots).")] = 16,
    max_num_batched_tokens: Annotated[int, typer.Option(
        "--max-num-batched-tokens", min=2, envvar="LLMCTL_MAX_NUM_BATCHED_TOKENS",
        help="Token budget of one step: decode tokens plus prompt chunks.")] = 512,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", min=1, envvar="LLMCTL_MAX_QUEUE",
        help="Waiting requests beyond the running ones; more get 429.")] = 256,
    ctx_size: o.CtxSize = None,
    threads: o.Threads = None,
    n_gpu_layers: o.GpuLayers = "auto",
    api_key: Annotated[str, typer.Option(
        "--api-key", envvar="LLMCTL_API_KEY", help="Require 'Authorization: Bearer KEY'.")] = "",
    no_prefix_cache: Annotated[bool, typer.Option(
        "--no-prefix-cache", envvar="LLMCTL_NO_PREFIX_CACHE",
        help="Recompute every prompt from scratch.")] = False,
    flash_attn: Annotated[FlashAttn, typer.Option(
        "--flash-attn", envvar="LLMCTL_FLASH_ATTN",
        help="auto: off while the prefix cache is on, so cache hits give token-identical "
             "output; on is ~15% faster with the cache, but hits may differ slightly.")
    ] = FlashAttn.auto,
    prefix_cache_size: Annotated[float, typer.Option(
        "--prefix-cache-size", min=0.0, envvar="LLMCTL_PREFIX_CACHE_SIZE",
        help="Disk budget of the prefix KV cache, in GB.")] = 4.0,
    max_body_mb: Annotated[float, typer.Option(
        "--max-body-mb", min=0.001, envvar="LLMCTL_MAX_BODY_MB",
        help="Largest request body, in MiB; bigger ones get 413.")] = 8.0,
    metrics_public: Annotated[bool, typer.Option(
        "--metrics-public", envvar="LLMCTL_METRICS_PUBLIC",
        help="Serve /metrics without the API key (for a Prometheus scraper).")] = False,
    allowed_origins: Annotated[str, typer.Option(
        "--allowed-origins", envvar="LLMCTL_ALLOWED_ORIGINS",
        help="Comma-separated browser origins allowed besides localhost, e.g. "
             "https://app.example.com,https://*.example.org ('*': any).")] = "",
) -> None:
    """Serve a model over an OpenAI-compatible API (/v1/chat/completions, /v1/completions).

    Example: llmctl serve smollm2 --port 8000 --max-num-seqs 16
    """
    # Imported here so that `llmctl --help` does not load the server stack.
    from llmctl.runtime.llm import LoadOptions
    from llmctl.server.serve import serve as serve_model
    from llmctl.server.state import HttpPolicy

    load = LoadOptions(ctx_size=ctx_size, threads=threads,
                       n_gpu_layers=n_gpu_layers, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens, max_queue=max_queue,
                       prefix_cache=not no_prefix_cache, prefix_cache_size_gb=prefix_cache_size,
                       flash_attn={"auto": None, "on": True, "off": False}[flash_attn.value])
    policy = HttpPolicy(api_key=api_key or None, metrics_public=metrics_public,
                        allowed_origins=tuple(origin.strip() for origin in allowed_origins.split(",")
                                              if origin.strip()),
                        max_body_bytes=int(max_body_mb * (1 << 20)))
    serve_model(model, host, port, load, policy,
                on_ready=lambda url: err.print(f"Serving on {url}/v1 (Ctrl-C to stop)"))


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
