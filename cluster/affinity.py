"""Prefix-affinity routing for llmctl replicas on Ray Serve.

The key: a hash of the model name and the first AFFINITY_CHARS characters
of what the prompt is rendered from (the messages' roles and contents, or
the completion prompt). The ingress computes it without a tokenizer: it
loads no model and stays cheap, and two requests that agree on their first
~1,000 characters agree, in practice, on their first 256-token block, the
unit the engines' prefix cache and disk store key on (runtime/kv_disk.py).

The owner of a key is chosen by rendezvous (highest-random-weight) hashing
over the live replicas' ids: every ingress process agrees without sharing
state, and when a replica comes or goes only its own keys move (and a moved
key still finds its prefix in the shared disk cache). When the owner is
overloaded, the request goes to the less loaded of two random replicas.

This module imports no Ray: the ingress, the benchmark and the tests read
it too. The router class itself is in router.py."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

# ~4 characters per token in English: this covers about one 256-token block.
AFFINITY_CHARS = 1024

# How the affinity router decided, per outcome; read by the ingress's /metrics.
# The router runs in the ingress's process, but Ray pickles router.py by
# value (its globals are copies there), so the counter lives here.
DECISIONS: Counter = Counter()


def affinity_key(body: Any) -> str | None:
    """The routing key of a parsed request body (OpenAI's chat, completion
    or Responses API, Anthropic's Messages), or None when it has nothing to
    key on (any replica will do). A client's `prompt_cache_key` (OpenAI's
    cache-affinity hint, which Codex sends) is the key when given: the
    client knows which requests share a prompt."""
    if not isinstance(body, dict):
        return None
    model = body.get("model")
    hint = body.get("prompt_cache_key")
    if isinstance(hint, str) and hint:
        return _digest(f"{model}\0hint\0{hint}")
    text = _leading_text(body)
    return None if text is None else _digest(f"{model}\0{text[:AFFINITY_CHARS]}")


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _leading_text(body: dict) -> str | None:
    """What the prompt is rendered from, in its order: the system part
    (Anthropic's `system`, Responses' `instructions`), then the messages'
    roles and contents (or Responses' `input`), or a completion prompt."""
    messages = body.get("messages", body.get("input"))
    prompt = body.get("prompt")
    head = body.get("system", body.get("instructions"))
    if isinstance(messages, str) and messages:
        messages = [{"role": "user", "content": messages}]
    if isinstance(messages, list) and messages:
        # Roles and contents only, in order: the chat template renders them
        # in this order, so equal leading text means an equal leading prompt.
        parts = [(m.get("role"), m.get("content")) if isinstance(m, dict) else m
                 for m in messages]
        return json.dumps([head, *parts] if head else parts, ensure_ascii=False, default=str)
    if isinstance(prompt, str) and prompt:
        return prompt
    return None


def owner(key: str, replica_ids: list[str]) -> str:
    """The replica id with the highest rendezvous weight for `key`."""
    return max(replica_ids, key=lambda r: hashlib.blake2b(f"{key}/{r}".encode(),
                                                           digest_size=8).digest())


