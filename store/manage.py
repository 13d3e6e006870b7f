"""Library side of `llmctl list`, `show` and `rm`."""

from __future__ import annotations

import contextlib
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import ModelNotFound, PathEscape, UsageError
from llmctl.store.gguf_info import kv_bytes_per_elem, read_gguf_info, split_stem
from llmctl.store.index import ModelEntry, StoreIndex
from llmctl.store.registry import load_registry
from llmctl.store.resolve import resolve_model


@dataclass
class Listing:
    """What `llmctl list` shows: the store's models whose file is there, and the
    registry's models not yet in the store."""

    local: list[ModelEntry]
    available: list[dict]       # registry names not yet in the store


def list_models(index: StoreIndex | None = None) -> Listing:
    """The store's models whose file is there, and the registry's other names.
    Raises UsageError for a missing or malformed models.toml."""
    index = index or StoreIndex()
    local = [e for e in index.list() if Path(e.path).is_file()]
    names = {e.name for e in local}
    available = [{"name": m.name, "repo": m.repo, "description": m.description,
                  "offline": m.offline}
                 for m in load_registry().models.values() if m.name not in names]
    return Listing(local, available)


def show_model(model: str | None, ctx_size: int | None = None, kv_type: str = "f16") -> dict:
    """What `llmctl show` prints: the GGUF's metadata and the memory one
    sequence of `ctx_size` tokens needs with a `kv_type` cache (`model`
    None: the default model). Raises UsageError for an unknown KV type, and
    what resolve_model and read_gguf_info raise."""
    try:
        kv_bytes_per_elem(kv_type)
    except ValueError as e:
        raise UsageError(str(e)) from None
    resolved = resolve_model(model)
    info = read_gguf_info(resolved.path)
    ctx = ctx_size or resolved.context or min(info.context_length or 4096, 4096)
    kv = info.kv_cache_bytes(ctx, kv_type)
    # `name` is the GGUF's own (general.name) where it has one; `model` the
    # name llmctl resolved, which models.toml's settings are keyed by.
    data = {"name": resolved.name, "path": str(resolved.path), **info.to_dict(),
            "model": resolved.name}
    if resolved.entry is not None:
        data["sha256"] = resolved.entry.sha256
        data["source"] = resolved.entry.source
    data["has_chat_template"] = bool(info.chat_template)
    spec = load_registry().get(resolved.name)
    data["kind"] = spec.kind if spec else "unknown"     # models.toml's instruct or base
    data["memory"] = {"ctx_size": ctx, "kv_type": kv_type, "weights_bytes": info.size,
                      "kv_cache_bytes": kv, "total_bytes": info.size + kv}
    return data


def remove_model(model: str, index: StoreIndex | None = None) -> ModelEntry:
    """Forget a model; delete its file only if the store owns it and no other
    name still points at it. A pulled model's file is a link in the Hugging
    Face cache: the link goes, and its blob too unless another snapshot links
    to it. Raises ModelNotFound, and PathEscape for a tampered index entry."""
    index = index or StoreIndex()
    if index.get(model) is None:
        raise ModelNotFound(f"model {model!r} is not in the store (see `llmctl list`)")
    entry = index.remove(model)
    still_used = any(e.path == entry.path for e in index.list())
    if not entry.owned or still_used:
        return entry
    if entry.extra.get("hf_cache"):
        _remove_pulled(entry)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
    return entry


def _remove_pulled(entry: ModelEntry) -> None:
    # At call time: `llmctl list` and `show` need not import huggingface_hub.
    from llmctl.store.hf_cache import RepoCache

    folder = Path(entry.extra["hf_cache"])
    cache = RepoCache(entry.extra["repo"], root=folder.parent)
    if cache.dir != folder:
        raise PathEscape(f"{entry.name}: index entry names {folder}, not {cache.folder_name}")
    commit, file = entry.extra["commit"], entry.extra["file"]
    first = cache.file(commit, file)
    names = [file]
    if (stem := split_stem(first.name)) is not None and first.parent.is_dir():
        # A split GGUF is registered by its first shard; the others go with it.
        subdir = posixpath.dirname(file)
        names = [posixpath.join(subdir, p.name) for p in first.parent.iterdir()
                 if split_stem(p.name) == stem]
    for name in names:
        cache.remove_file(commit, name)
