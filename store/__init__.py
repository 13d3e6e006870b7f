"""The local model store: the names registry (models.toml), the index of
models on disk, and resolving a user's MODEL argument to a file."""

from llmctl.store.index import ModelEntry, StoreIndex
from llmctl.store.resolve import ResolvedModel, resolve_model

__all__ = ["ModelEntry", "StoreIndex", "ResolvedModel", "resolve_model"]
