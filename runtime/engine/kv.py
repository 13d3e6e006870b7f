"""The one place the engine's KV is changed: new sequences' KV attached
from the prefix cache's plans (copies between slots, disk states restored,
runs moved past a difference by the splicer), guesses and finished
sequences removed, and states saved to the disk store. The prefix cache
decides what to reuse and save; the scheduler decides when a slot is
cleared or parked; this carries both out with llama.cpp.

Copies between slots use llama_memory_seq_cp. With one KV stream per
sequence (kv_unified=False), llama.cpp copies a whole stream buffer (it
asserts on partial ranges across streams) and only marks the source
sequence's cells in the destination, so we copy the whole stream and then
seq_rm the tail past the match. The buffer copy itself runs at the start of
the next llama_decode, before that batch writes anything."""

from __future__ import annotations

import logging

from llmctl.errors import LlmctlError
from llmctl.runtime.engine.plan import Attached
from llmctl.runtime.llama import LlamaContext, Move, Splicer
from llmctl.runtime.prefix_cache.cache import AttachPlan
from llmctl.runtime.prefix_cache.disk import DiskStore, Hit
from llmctl.runtime.prefix_cache.reuse import Reuse

log = logging.getLogger("llmctl.prefix_cache")


class KvManager:
    """Runs KV operations on `ctx`, with the prefix cache's `disk` store and
    a `splicer` that moves runs (either may be None). Raises nothing of its
    own beyond what each method says."""

    def __init__(self, ctx: LlamaContext, disk: DiskStore | None = None,
                 splicer: Splicer | None = None):
        self.ctx, self.disk, self.splicer = ctx, disk, splicer

    def attach(self, plans: list[AttachPlan]) -> list[Attached | Exception]:
        """Each plan carried out, in order: what each slot then holds, or
        the error that failed it (the others go on)."""
        copy_sources: set[int] = set()
        out: list[Attached | Exception] = []
        for p in plans:
            try:
                out.append(self._attach_one(p, copy_sources))
            except Exception as e:
                log.warning("prefix reuse for request %d failed: %s", p.seq_id, e)
                out.append(e)
        return out

    def _attach_one(self, p: AttachPlan, copy_sources: set[int]) -> Attached:
        n, moved = p.n, p.moved
        # A state_set into a slot that a copy still has to read (the copy
        # runs at the next decode) would hand the copy the wrong bytes.
        if p.slot not in copy_sources:
            restored = self._from_disk(p)
            if isinstance(restored, Attached):
                return restored
            if restored is None and p.src == p.slot:
                n, moved = 0, None      # the failed restore wiped the slot's own prefix
            if moved is not None and self.splicer is not None:
                spliced = self._splice(p, self.ctx.state_get(p.src), moved)
                if isinstance(spliced, Attached):
                    return spliced
                if spliced is None and p.src == p.slot:
                    n = 0
        if p.src != p.slot:
            self.ctx.seq_cp(p.src, p.slot)
            copy_sources.add(p.src)
        self.ctx.seq_rm(p.slot, n, -1)
        return Attached(n, n)

    def _from_disk(self, p: AttachPlan) -> Attached | bool | None:
        """The best disk state restored: runs of one that differs early,
        spliced, else a stored prefix. Attached when restored; False when
        the slot is untouched; None when llama.cpp rejected a state and the
        slot was cleared."""
        if self.disk is None:
            return False
        if p.disk_runs is not None:
            hit, moved = p.disk_runs
            data = self.disk.load(hit)
            spliced = False if data is None else self._splice(p, data, moved, from_disk=True)
            if spliced is not False:
                return spliced
        return False if p.disk_hit is None else self._restore(self.disk, p, p.disk_hit)

    def _splice(self, p: AttachPlan, state: bytes | memoryview, moved: Reuse,
                from_disk: bool = False) -> Attached | bool | None:
        """The slot's KV from `state` with the runs moved in (splice.py):
        Attached when done; False when the slot is as it was; None when
        llama.cpp refused the state and the slot was cleared."""
        assert self.splicer is not None
        runs = [Move(r.src, r.dst, r.n) for r in moved.runs]
        try:
            new, n = self.splicer.splice(state, p.prompt, moved.prefix, runs)
        except LlmctlError as e:
            log.warning("moving cached runs for request %d failed: %s", p.seq_id, e)
            return False
        if not self.ctx.state_set(new, p.slot):
            self.ctx.seq_rm(p.slot)
            return None
        return Attached(n, moved.total, from_disk)

    def _restore(self, disk: DiskStore, p: AttachPlan, hit: Hit) -> Attached | bool | None:
        data = disk.load(hit)
        if data is None:
            return False
        if not self.ctx.state_set(data, p.slot):
            disk.discard(hit)
            self.ctx.seq_rm(p.slot)
            return None
        self.ctx.seq_rm(p.slot, hit.n, -1)
        return Attached(hit.n, hit.n, True)

    def keep(self, slot: int, n: int) -> None:
        """Drop the slot's KV past its first `n` tokens (guesses that did
        not hold, or that a finished sequence's last step left)."""
        self.ctx.seq_rm(slot, n, -1)

    def clear(self, slot: int) -> None:
        """Drop all of the slot's KV."""
        self.ctx.seq_rm(slot)

    def save(self, slot: int, tokens: list[int]) -> None:
        """Queue the slot's state for the disk store, as the state of
        `tokens`; copying the bytes out is the only part on this thread."""
        if self.disk is not None:
            self.disk.save(tokens, self.ctx.state_get(slot))

    def close(self) -> None:
        """Free the splicer's context, if one was made."""
        if self.splicer is not None:
            self.splicer.close()
