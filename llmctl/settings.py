"""Paths and settings. Every knob is a flag first and an `LLMCTL_*` variable
second, so scripts and services can configure llmctl without flags; a flag's
default can also come from the config file (llmctl/config_file.py), below
both."""

from __future__ import annotations

import os
from pathlib import Path


def env(name: str, default: str | None = None) -> str | None:
    """Read `LLMCTL_<NAME>`; empty strings count as unset."""
    value = os.environ.get(f"LLMCTL_{name}")
    return value if value not in (None, "") else default


def positive(name: str, default: float, *, integer: bool = False, unit: str = "") -> float:
    """`LLMCTL_<NAME>` as a positive number (an integer when `integer`),
    else `default`. Raises UsageError naming the variable: a setting is the
    operator's mistake, so `serve` checks them all before it listens."""
    from llmctl.errors import UsageError

    raw = env(name)
    if raw is None:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = -1
    if not value > 0 or value != value or value == float("inf"):
        kind = "integer" if integer else "number"
        raise UsageError(f"LLMCTL_{name} must be a positive {kind}{' of ' + unit if unit else ''}, "
                         f"got {raw[:40]!r}")
    return value


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
