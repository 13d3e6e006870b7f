"""Shell completion's model names: what a user may type where a command takes
a model, read from the config file's presets, the local store and models.toml
when the shell asks.

Typer runs these callbacks inside the shell's completion request, so they
import only the store and the config file, and never raise: a damaged store,
registry or config file completes fewer names rather than printing a
traceback into the user's prompt."""

from __future__ import annotations


def model_names(incomplete: str) -> list[str]:
    """Names starting with `incomplete`: the config file's presets first,
    then the store's, then models.toml's, each once. Raises nothing."""
    from llmctl.config_file import load_config
    from llmctl.errors import LlmctlError
    from llmctl.store.index import StoreIndex
    from llmctl.store.registry import load_registry

    names: list[str] = []
    try:
        config = load_config()      # preset names as written: checking them is the command's
        names += [t[1] for t in dict.fromkeys([*config.tables, *config.headers])
                  if len(t) == 2 and t[0] == "presets"]
    except (OSError, LlmctlError):
        pass
    try:
        names += [entry.name for entry in StoreIndex().list()]
    except (OSError, LlmctlError):
        pass
    try:
        names += list(load_registry().models)
    except (OSError, LlmctlError):
        pass
    return [name for name in dict.fromkeys(names) if name.startswith(incomplete)]
