"""Prompt-prefix KV reuse: the engine's hooks that move KV between slots and
the disk. The slot table decides (plain Python) where each new sequence's
longest computed prefix is: its own parked slot, another slot, or a leader
that is still prefilling it. This file carries those decisions out with
llama.cpp, and adds the disk store on top.

Copies between slots use llama_memory_seq_cp. With one KV stream per
sequence (kv_unified=False), llama.cpp copies a whole stream buffer (it
asserts on partial ranges across streams) and only marks the source
sequence's cells in the destination, so we copy the whole stream and then
seq_rm the tail past the match. The buffer copy itself runs at the start of
the next llama_decode, before that batch writes anything.

The cache is built whole, before the engine that uses it: `open_prefix_cache`
takes the weights' identity and the engine context's KV layout, which key
the disk store."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmctl.errors import LlmctlError
from llmctl.runtime.engine.sequence import Sequence
from llmctl.runtime.llama import LLAMA_CPP_VERSION, Move, Splicer
from llmctl.runtime.prefix_cache.disk import BLOCK, DiskStore, Hit
from llmctl.runtime.prefix_cache.reuse import Reuse, plan
from llmctl.runtime.prefix_cache.rule import TILE, exact_reuse, reusable

if TYPE_CHECKING:
    from llmctl.runtime.llama import LlamaContext

log = logging.getLogger("llmctl.prefix_cache")

MIN_DISK_GAIN = 64      # restoring fewer extra tokens than this is not worth a file read
RECENT_STATES = 8       # disk states a prompt that differs early is matched against


def file_identity(path: Path, sha256: str | None) -> str:
    """The store's sha256 when known; otherwise a cheap content fingerprint
    (size, first and last MiB) so a multi-GB file is not hashed at load.
    Raises OSError when the file cannot be read."""
    if sha256:
        return sha256
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(size - (1 << 20), 0))
        h.update(f.read(1 << 20))
    return "fp-" + h.hexdigest()


@dataclass(frozen=True)
class Weights:
    """Which model file the KV comes from."""

    name: str
    path: Path
    sha256: str | None      # the store's, when it knows it


@dataclass(frozen=True)
class KvLayout:
    """The engine context's settings that change the bytes of a saved state
    (the context's own n_ctx_seq, which llama.cpp may round up)."""

    n_ctx_seq: int
    n_seq_max: int
    kv_type: str
    flash_attn: bool
    repack: bool = True     # weights repacked: their kernels give other KV bytes
    tile: int = 1           # the cuts a state's prompt was computed in (rule.py)


def disk_identity(weights: Weights, kv: KvLayout) -> dict[str, object]:
    """The disk store's key: everything that changes a state's bytes. Its
    key order is meta.json's. Raises OSError when the weights cannot be read."""
    return {
        "model": weights.name,
        "path": str(weights.path),
        "sha256": file_identity(weights.path, weights.sha256),
        "n_ctx_seq": kv.n_ctx_seq, "n_seq_max": kv.n_seq_max,
        "kv_type": kv.kv_type, "flash_attn": kv.flash_attn, "repack": kv.repack,
        "rope": "model",
        # A state computed under any cut must not serve a setting held to
        # the tile's cuts (--deterministic), whose hits must stay exact.
        "tile": kv.tile,
        "llama_cpp": LLAMA_CPP_VERSION, "format": 2,
    }


def open_prefix_cache(weights: Weights, kv: KvLayout, *, root: Path, budget_bytes: int,
                      tile: int, splicer: Splicer | None = None) -> PrefixCache:
    """A prefix cache whose disk store under `root` (none for a budget of 0
    or less) is keyed by `weights` and `kv`; `tile` is the engine's
    exactness rule (rule.py); `splicer` moves runs past a difference.
    Raises OSError when the weights cannot be read."""
    disk = None if budget_bytes <= 0 else DiskStore(root, disk_identity(weights, kv), budget_bytes)
    return PrefixCache(disk, tile, splicer)


class PrefixCache:
    """Moves KV between slots and, with a `disk` store, to and from the
    disk, on the engine's behalf. `tile` is the engine's (rule.py): how
    much of a hit may be reused exactly."""

    def __init__(self, disk: DiskStore | None = None, tile: int = TILE,
                 splicer: Splicer | None = None):
        self.disk = disk
        self.tile = tile
        self.splicer = splicer      # moves runs past a difference (reuse.py); None: off

    # ---- engine hooks (engine thread) ------------------------------------------

    def attach(self, ctx: LlamaContext, seqs: list[Sequence]) -> list[tuple[Sequence, Exception]]:
        """Give each newly started sequence the KV its plan names. Returns
        the sequences that failed, with their errors; the rest go on."""
        copy_sources: set[int] = set()
        failed: list[tuple[Sequence, Exception]] = []
        for seq in seqs:
            try:
                self._attach_one(ctx, seq, copy_sources)
            except Exception as e:
                log.warning("prefix reuse for request %d failed: %s", seq.id, e)
                failed.append((seq, e))
        return failed

    def _attach_one(self, ctx: LlamaContext, seq: Sequence, copy_sources: set[int]) -> None:
        src, n = seq.kv_src
        # A state_set into a slot that a copy still has to read (the copy
        # runs at the next decode) would hand the copy the wrong bytes.
        if seq.slot not in copy_sources:
            restored = self._from_disk(ctx, seq, seq.moved.total if seq.moved else n)
            if restored:
                seq.moved = None
                return
            if restored is None and src == seq.slot:
                n, seq.moved = 0, None      # the failed restore wiped the slot's own prefix
            if seq.moved is not None and self.splicer is not None:
                spliced = self._splice(ctx, seq, ctx.state_get(src), seq.moved)
                if spliced:
                    return
                if spliced is None and src == seq.slot:
                    n = 0
        seq.moved = None
        if src != seq.slot:
            ctx.seq_cp(src, seq.slot)
            copy_sources.add(src)
        ctx.seq_rm(seq.slot, n, -1)
        seq.n_computed = seq.n_cached = n

    def _from_disk(self, ctx: LlamaContext, seq: Sequence, memory: int) -> bool | None:
        """Restore the best disk state when it beats the `memory` tokens the
        slots give: a stored prefix, or runs of a state that differs early,
        spliced. True when restored; False when the slot is untouched; None
        when llama.cpp rejected a state and the slot was cleared."""
        if self.disk is None:
            return False
        hit = self._disk_hit(seq, memory)
        moved = self._disk_moves(seq, max(memory, hit.n if hit else 0))
        if moved is not None:
            data = self.disk.load(moved[0])
            spliced = False if data is None else self._splice(ctx, seq, data, moved[1], True)
            if spliced is not False:
                return spliced
        return False if hit is None else self._restore(self.disk, ctx, seq, hit)

    def _disk_moves(self, seq: Sequence, beat: int) -> tuple[Hit, Reuse] | None:
        """The recent disk state whose prefix and moved runs give the most,
        when that beats `beat` tokens by MIN_DISK_GAIN."""
        if self.disk is None or self.splicer is None or len(seq.prompt) - beat < BLOCK:
            return None
        best: tuple[Hit, Reuse] | None = None
        try:
            found = self.disk.recent(RECENT_STATES)
        except OSError:
            return None
        for hit, tokens in found:
            got = plan(tokens, seq.prompt, reusable(tokens, seq.prompt, self.tile),
                       self.splicer.min_run)
            if got.runs and got.total >= max(beat + MIN_DISK_GAIN, best[1].total if best else 0):
                best = (hit, got)
        return best

    def _splice(self, ctx: LlamaContext, seq: Sequence, state: bytes | memoryview,
                moved: Reuse, from_disk: bool = False) -> bool | None:
        """The slot's KV from `state` with the runs moved in (splice.py):
        True when done; False when the slot is as it was; None when
        llama.cpp refused the state and the slot was cleared."""
        assert self.splicer is not None
        runs = [Move(r.src, r.dst, r.n) for r in moved.runs]
        try:
            new, n = self.splicer.splice(state, seq.prompt, moved.prefix, runs)
        except LlmctlError as e:
            log.warning("moving cached runs for request %d failed: %s", seq.id, e)
            return False
        if not ctx.state_set(new, seq.slot):
            ctx.seq_rm(seq.slot)
            return None
        seq.n_computed, seq.n_cached = n, moved.total
        seq.cached_from_disk = from_disk
        return True

    def _disk_hit(self, seq: Sequence, n_memory: int) -> Hit | None:
        if self.disk is None or len(seq.prompt) - n_memory < BLOCK // 4:
            return None
        try:
            hit = self.disk.lookup(seq.prompt)
        except OSError:
            return None
        if hit is None:
            return None
        hit.n = exact_reuse(hit.n, len(seq.prompt), self.tile)
        return hit if hit.n >= n_memory + MIN_DISK_GAIN else None

    @staticmethod
    def _restore(disk: DiskStore, ctx: LlamaContext, seq: Sequence, hit: Hit) -> bool | None:
        """True when restored; False when the slot is untouched; None when
        llama.cpp rejected the state and the slot was cleared."""
        data = disk.load(hit)
        if data is None:
            return False
        if not ctx.state_set(data, seq.slot):
            disk.discard(hit)
            ctx.seq_rm(seq.slot)
            return None
        ctx.seq_rm(seq.slot, hit.n, -1)
        seq.n_computed = seq.n_cached = hit.n
        seq.cached_from_disk = True
        return True

    def on_prefilled(self, ctx: LlamaContext, seq: Sequence) -> None:
        """Save the prompt's state when this sequence computed at least a
        block of it itself (copies of a known prefix add nothing new)."""
        if self.disk is None or len(seq.prompt) - seq.n_cached < BLOCK:
            return
        self._save(self.disk, ctx, seq, seq.prompt)

    def on_finished(self, ctx: LlamaContext, seq: Sequence) -> None:
        """Save the reply too when it added a whole block: the next turn of a
        conversation resends it. Not with a tile rule: a generated token's KV
        comes from a one-row chunk, which a prompt never computes."""
        if (self.disk is None or self.tile > 1
                or seq.n_computed // BLOCK <= len(seq.prompt) // BLOCK):
            return
        self._save(self.disk, ctx, seq, seq.tokens[:seq.n_computed])

    @staticmethod
    def _save(disk: DiskStore, ctx: LlamaContext, seq: Sequence, tokens: list[int]) -> None:
        try:
            if disk.has(tokens):
                return
        except OSError:
            pass
        # Copying the bytes out is the only part on the engine thread.
        disk.save(tokens, ctx.state_get(seq.slot))

    def close(self) -> None:
        """Write what the disk store has queued, then stop its writer; free
        the splicer's context."""
        if self.disk is not None:
            self.disk.close()
        if self.splicer is not None:
            self.splicer.close()
