"""Every `LLMCTL_*` setting that is not a flag, defined once, and the paths.

A command's flags come first: click gives each flag its `LLMCTL_*`
variable and the config file's line (cli/config_cmd.py), so those are
declared with their flags, flag > variable > config file > default. The
settings without a flag are the `Var`s below: `Settings.load()` reads and
checks them all once, at start-up, and the object is passed down (the
server's state, the load options, the pull). A bad value is a one-line
UsageError naming the variable, before anything listens or loads.

The paths, the default model and the switches that act before any
command runs (`debug`, `llama_log`, `no_preload`) are read when asked for,
through the functions at the end: a cluster replica points its cache
elsewhere in its own process, and tests point the home at a temporary
folder. This is the one module that reads `LLMCTL_*` from the environment
(tests/test_settings.py checks), and docs/configuration.md's table of
bounds is written from `VARS` (`scripts/settings_table.py`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Mapping

PREFIX = "LLMCTL_"


@dataclass(frozen=True)
class Var:
    """One variable: LLMCTL_<name>, read into Settings.<attr>."""

    name: str
    attr: str
    kind: str               # "seconds", "milliseconds", "MiB", "count" (an integer), "retries"
    default: float | Callable[[], float] | None    # a callable: the machine's
    doc: str
    shown: str = ""         # the default as docs say it, where it is not a number

    @property
    def variable(self) -> str:
        return PREFIX + self.name


def _render_workers() -> int:
    return max(4, os.cpu_count() or 1)


# The server's own bounds, the pull's patience and the benchmarks' wait
# (docs/limits.md says what each bounds). Defaults live here and only here.
VARS: tuple[Var, ...] = (
    Var("SSE_KEEPALIVE_S", "sse_keepalive_s", "seconds", 15.0,
        "seconds between SSE keep-alive comments while nothing else is sent"),
    Var("PARSE_DEADLINE_S", "parse_deadline_s", "seconds", 10.0,
        "seconds a request's validation and grammar building may run once a worker "
        "starts it, before a 400; time waiting for a worker never counts"),
    Var("BODY_DEADLINE_S", "body_deadline_s", "seconds", 10.0,
        "seconds a large body's JSON parse may run once a worker starts it, before a 400"),
    Var("GRAMMAR_BUDGET_MS", "grammar_budget_ms", "milliseconds", 2000.0,
        "CPU time of grammar work one token may take before a 400"),
    Var("GRAMMAR_TOTAL_MS", "grammar_total_ms", "milliseconds", 30000.0,
        "CPU time of grammar work one request may take before a 400"),
    Var("ENGINE_STALL_S", "engine_stall_s", "seconds", 60.0,
        "seconds an engine with work may go without a step before `/health` says 503"),
    Var("EMBED_MAX_TOKENS", "embed_max_tokens", "count", 65536,
        "tokens one embeddings request may embed"),
    Var("MODEL_WAITERS_MAX", "model_waiters_max", "count", None,
        "requests one model may have waiting for its room; past it, 503 `models_busy` at "
        "once", "`--max-queued`"),
    Var("RESPONSES_MAX", "responses_max", "count", 1000,
        "stored Responses API answers kept (`store: true`) before the oldest goes"),
    Var("RESPONSES_MAX_MB", "responses_max_mb", "MiB", 256.0,
        "disk the stored Responses API answers may take before the oldest goes"),
    Var("WORKERS_BODY", "workers_body", "count", 2, "threads parsing large request bodies"),
    Var("WORKERS_PARSE", "workers_parse", "count", 4,
        "threads turning schemas and tools into grammars"),
    Var("WORKERS_RENDER", "workers_render", "count", _render_workers,
        "threads rendering chat templates and tokenizing", "max(4, cores)"),
    Var("WORKERS_RESOLVE", "workers_resolve", "count", 4,
        "threads resolving model names (which may join part files)"),
    Var("WORKERS_LOAD", "workers_load", "count", 2, "threads loading models"),
    Var("WORKERS_QUERY", "workers_query", "count", 4,
        "threads answering listings and stored responses"),
    Var("WORKERS_EMBED", "workers_embed", "count", 2, "threads computing embeddings"),
    Var("PULL_RETRIES", "pull_retries", "retries", 5,
        "failures in a row without progress before a range of a pull gives up"),
    Var("PULL_BACKOFF", "pull_backoff_s", "seconds", 0.5,
        "a pull's first retry delay, doubling"),
    Var("PULL_TIMEOUT", "pull_timeout_s", "seconds", 30.0,
        "seconds a pull's connection may stall"),
    Var("BENCH_STARTUP_TIMEOUT", "bench_startup_timeout_s", "seconds", 300.0,
        "seconds a benchmark waits for a server it started to answer `/health`"),
)


def _default(var: Var) -> float | None:
    return var.default() if callable(var.default) else var.default


@dataclass(frozen=True)
class Settings:
    """The values of VARS, checked; `Settings()` holds their defaults."""

    sse_keepalive_s: float = 15.0
    parse_deadline_s: float = 10.0
    body_deadline_s: float = 10.0
    grammar_budget_ms: float = 2000.0
    grammar_total_ms: float = 30000.0
    engine_stall_s: float = 60.0
    embed_max_tokens: int = 65536
    model_waiters_max: int | None = None
    responses_max: int = 1000
    responses_max_mb: float = 256.0
    workers_body: int = 2
    workers_parse: int = 4
    workers_render: int = field(default_factory=_render_workers)
    workers_resolve: int = 4
    workers_load: int = 2
    workers_query: int = 4
    workers_embed: int = 2
    pull_retries: int = 5
    pull_backoff_s: float = 0.5
    pull_timeout_s: float = 30.0
    bench_startup_timeout_s: float = 300.0

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """Every variable of VARS from `environ` (the process's when None),
        else its default. Raises UsageError naming the first bad one."""
        env = os.environ if environ is None else environ
        values = {}
        for var in VARS:
            raw = env.get(var.variable, "")
            values[var.attr] = _default(var) if raw == "" else _parse(var, raw)
        return cls(**values)


def _parse(var: Var, raw: str) -> float:
    """`raw` as `var`'s kind. Raises UsageError naming the variable."""
    from llmctl.errors import UsageError

    integer = var.kind in ("count", "retries")
    try:
        value: float = int(raw) if integer else float(raw)
    except ValueError:
        value = float("nan")
    least_ok = value >= 0 if var.kind == "retries" else value > 0
    if not least_ok or value == float("inf"):
        what = ("a whole number, 0 or more" if var.kind == "retries" else
                "a positive integer" if integer else f"a positive number of {var.kind}")
        raise UsageError(f"{var.variable} must be {what}, got {raw[:40]!r}")
    return value


def markdown_table() -> str:
    """docs/configuration.md's table of the settings without a flag."""
    rows = ["| variable | meaning | default |", "|---|---|---|"]
    for var in VARS:
        value = var.default
        default = var.shown or (f"{value:,}" if isinstance(value, int) else f"{value:,g}")
        rows.append(f"| `{var.variable}` | {var.doc} | {default} |")
    return "\n".join(rows) + "\n"


def _check_fields() -> None:
    # VARS and Settings name the same attributes, in the same order, with
    # the same defaults: the one definition is VARS.
    assert [v.attr for v in VARS] == [f.name for f in fields(Settings)]
    defaults = Settings()
    assert all(getattr(defaults, v.attr) == _default(v) for v in VARS)


_check_fields()


# ---- read when asked for ----------------------------------------------------


def env(name: str, default: str | None = None) -> str | None:
    """`LLMCTL_<NAME>`, for this module's readers below; empty counts as
    unset."""
    value = os.environ.get(PREFIX + name)
    return value if value not in (None, "") else default


def home() -> Path:
    """The store root: `LLMCTL_HOME`, else `$XDG_CACHE_HOME/llmctl`."""
    root = env("HOME")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "llmctl"


def models_dir() -> Path:
    """Where the store writes model files it makes (joined parts, quantized
    models): `models` under the home."""
    return home() / "models"


def cache_dir() -> Path:
    """Where derived caches (prefix KV states) live: LLMCTL_CACHE_DIR, else
    under the home (a cluster's replicas point it at shared storage)."""
    override = env("CACHE_DIR")
    return Path(override).expanduser() if override else home() / "cache"


def models_toml() -> Path:
    """The registry file: LLMCTL_MODELS_TOML, else the one shipped with llmctl."""
    override = env("MODELS_TOML")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "models.toml"


def config_file_override() -> Path | None:
    """The config file LLMCTL_CONFIG names, if it names one."""
    override = env("CONFIG")
    return Path(override).expanduser() if override else None


def default_model() -> str | None:
    """LLMCTL_MODEL: the model a command uses when none is named."""
    return env("MODEL")


def debug() -> bool:
    """LLMCTL_DEBUG, as --debug: tracebacks with errors."""
    return bool(env("DEBUG"))


def llama_log() -> bool:
    """LLMCTL_LLAMA_LOG: show llama.cpp's own log."""
    return bool(env("LLAMA_LOG"))


def no_preload() -> bool:
    """LLMCTL_NO_PRELOAD: let numpy load before llama.cpp (llmctl/native.py)."""
    return bool(env("NO_PRELOAD"))


def flag_variable(variable: str) -> str | None:
    """The value of a flag's LLMCTL_* variable (click reads it for the
    flag; `config show` says where a value came from); empty is unset."""
    assert variable.startswith(PREFIX)
    return os.environ.get(variable) or None


def handed_over(variable: str) -> str | None:
    """An LLMCTL_* variable one llmctl process sets for another it starts
    (`cluster serve`'s policy for Ray's proxies), not a user's setting."""
    assert variable.startswith(PREFIX)
    return os.environ.get(variable) or None


def passed_on() -> dict[str, str]:
    """Every LLMCTL_* variable set in this process, for a process it starts
    elsewhere (a cluster's replicas)."""
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}

