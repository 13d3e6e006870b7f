"""Library side of `llmctl list`, `show` and `rm`."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import ModelNotFound
from llmctl.store.gguf_info import GGUFInfo, read_gguf_info
from llmctl.store.index import ModelEntry, StoreIndex
from llmctl.store.registry import load_registry
from llmctl.store.resolve import resolve_model


@dataclass
class Listing:
    local: list[ModelEntry]
    available: list[dict]       # registry names not yet in the store


def list_models(index: StoreIndex | None = None) -> Listing:
    index = index or StoreIndex()
    local = [e for e in index.list() if Path(e.path).is_file()]
    names = {e.name for e in local}
    available = [{"name": m.name, "repo": m.repo, "description": m.description,
                  "offline": bool(m.package)}
                 for m in load_registry().models.values() if m.name not in names]
    return Listing(local, available)


def kv_cache_bytes(info: GGUFInfo, ctx_size: int, bytes_per_elem: float = 2.0) -> int:
    n_kv = info.n_head_kv or info.n_head
    return int(2 * info.n_layers * ctx_size * n_kv * info.head_dim * bytes_per_elem)


def show_model(model: str, ctx_size: int | None = None) -> dict:
    resolved = resolve_model(model)
    info = read_gguf_info(resolved.path)
    ctx = ctx_size or resolved.context or min(info.context_length or 4096, 4096)
    kv = kv_cache_bytes(info, ctx)
    data = {"name": resolved.name, "path": str(resolved.path), **info.to_dict()}
    if resolved.entry is not None:
        data["sha256"] = resolved.entry.sha256
        data["source"] = resolved.entry.source
    data["has_chat_template"] = bool(info.chat_template)
    data["memory"] = {"ctx_size": ctx, "weights_bytes": info.size, "kv_cache_bytes": kv,
                      "total_bytes": info.size + kv}
    return data


def remove_model(model: str, index: StoreIndex | None = None) -> ModelEntry:
    """Forget a model; delete its file only if the store owns it and no other
    name still points at it."""
    index = index or StoreIndex()
    if index.get(model) is None:
        raise ModelNotFound(f"model {model!r} is not in the store (see `llmctl list`)")
    entry = index.remove(model)
    still_used = any(e.path == entry.path for e in index.list())
    if entry.owned and not still_used:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
    return entry
