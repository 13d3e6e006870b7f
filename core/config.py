"""Paths and settings. Every knob is a flag first and an `LLMCTL_*` variable
second, so scripts and services can configure llmctl without flags."""

from __future__ import annotations

import os
from pathlib import Path


def env(name: str, default: str | None = None) -> str | None:
    """Read `LLMCTL_<NAME>`; empty strings count as unset."""
    value = os.environ.get(f"LLMCTL_{name}")
    return value if value not in (None, "") else default


def home() -> Path:
    """The store root: `LLMCTL_HOME`, else `$XDG_CACHE_HOME/llmctl`."""
    root = env("HOME")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "llmctl"


def models_dir() -> Path:
    return home() / "models"


def cache_dir() -> Path:
    """Where derived caches (prefix KV states) live: LLMCTL_CACHE_DIR, else
    under the home (a cluster's replicas point it at shared storage)."""
    override = env("CACHE_DIR")
    return Path(override).expanduser() if override else home() / "cache"


def models_toml() -> Path:
    override = env("MODELS_TOML")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "models.toml"
