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
    """The routing key of a parsed OpenAI request body, or None when it has
    nothing to key on (no messages or prompt: any replica will do)."""
    if not isinstance(body, dict):
        return None
    messages, prompt = body.get("messages"), body.get("prompt")
    if isinstance(messages, list) and messages:
        # Roles and contents only, in order: the chat template renders them
        # in this order, so equal leading text means an equal leading prompt.
        text = json.dumps([(m.get("role"), m.get("content")) if isinstance(m, dict) else m
                           for m in messages], ensure_ascii=False, default=str)
    elif isinstance(prompt, str) and prompt:
        text = prompt
    else:
        return None
    head = f"{body.get('model')}\0{text[:AFFINITY_CHARS]}"
    return hashlib.blake2b(head.encode(), digest_size=8).hexdigest()


def owner(key: str, replica_ids: list[str]) -> str:
    """The replica id with the highest rendezvous weight for `key`."""
    return max(replica_ids, key=lambda r: hashlib.blake2b(f"{key}/{r}".encode(),
                                                           digest_size=8).digest())


