"""Shell completion's model names: what a user may type where a command takes
a model, read from the local store and models.toml when the shell asks.

Typer runs these callbacks inside the shell's completion request, so they
import only the store, and never raise: a damaged store or registry completes
fewer names rather than printing a traceback into the user's prompt."""

from __future__ import annotations


def model_names(incomplete: str) -> list[str]:
    """Names starting with `incomplete`: the store's first, then models.toml's,
    each once. Raises nothing."""
    from llmctl.errors import LlmctlError
    from llmctl.store.index import StoreIndex
    from llmctl.store.registry import load_registry

    names: list[str] = []
    try:
        names += [entry.name for entry in StoreIndex().list()]
    except (OSError, LlmctlError):
        pass
    try:
        names += list(load_registry().models)
    except (OSError, LlmctlError):
        pass
    return [name for name in dict.fromkeys(names) if name.startswith(incomplete)]
