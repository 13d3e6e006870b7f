"""Pulling models from the Hugging Face Hub into the shared HF cache and the
llmctl store."""

from llmctl.hub.events import PullEvents
from llmctl.hub.pull import DEFAULT_CONNECTIONS, PullResult, pull
from llmctl.store.hf_cache import hub_cache, local_snapshot

__all__ = ["DEFAULT_CONNECTIONS", "PullEvents", "PullResult", "hub_cache", "local_snapshot",
           "pull"]
