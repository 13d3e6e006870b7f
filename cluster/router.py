"""The Ray Serve request router that applies llmctl's prefix affinity
(affinity.py). Ray pickles this module by value into every process that
routes, so it keeps no state of its own at module level."""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from llmctl.cluster import affinity


class AffinityRouter(RequestRouter):
    """Routes a request to the owner of its `affinity` kwarg while the
    owner has fewer than `overload_at` requests in flight from this router;
    otherwise (or with no key) to the less loaded of two random replicas. A
    `pin` kwarg (a replica's unique id) forces that replica while it lives:
    a client asks for it with the X-Llmctl-Replica header (tests, debugging)."""

    def initialize_state(self, overload_at: int = 4, **_: Any) -> None:
        self.overload_at = overload_at

    def _load(self, replica: RunningReplica) -> int:
        # The router's own cache of queue lengths: refreshed by Ray's probes
        # and bumped on every send; unknown counts as idle.
        return self.replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        kwargs = pending_request.kwargs if pending_request is not None else {}
        pin, key = kwargs.get("pin"), kwargs.get("affinity")
        if pin in by_id:
            affinity.DECISIONS["pinned"] += 1
            return [[by_id[pin]]]
        two = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
        if not key:
            affinity.DECISIONS["no_key"] += 1
            return [two]
        first = by_id[affinity.owner(key, sorted(by_id))]
        if self._load(first) < self.overload_at:
            affinity.DECISIONS["owner"] += 1
            # The owner first; if it refuses (its max_ongoing_requests is
            # reached), the two random ones.
            return [[first], two]
        affinity.DECISIONS["overloaded"] += 1
        return [two]
