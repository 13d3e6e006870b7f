"""Prompt-prefix KV reuse: what a new sequence's KV should come from, and
which states go to the disk. The slot table decides (plain Python) where
each new sequence's longest computed prefix is: its own parked slot,
another slot, or a leader that is still prefilling it. This file adds the
disk store on top and turns each decision into an AttachPlan, best source
first; the engine's KV manager (engine/kv.py) carries plans out with
llama.cpp. Nothing here calls llama.cpp.

The cache is built whole, before the engine that uses it: `open_prefix_cache`
takes the weights' identity and the engine context's KV layout, which key
the disk store."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from llmctl.runtime.llama import LLAMA_CPP_VERSION
from llmctl.runtime.prefix_cache.disk import BLOCK, DiskStore, Hit
from llmctl.runtime.prefix_cache.reuse import Reuse, plan
from llmctl.runtime.prefix_cache.rule import TILE, exact_reuse, reusable

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
                      tile: int, min_run: int = 0) -> PrefixCache:
    """A prefix cache whose disk store under `root` (none for a budget of 0
    or less) is keyed by `weights` and `kv`; `tile` is the engine's
    exactness rule (rule.py); `min_run` > 0 moves runs past a difference
    (reuse.py). Raises OSError when the weights cannot be read."""
    disk = None if budget_bytes <= 0 else DiskStore(root, disk_identity(weights, kv), budget_bytes)
    return PrefixCache(disk, tile, min_run)


@dataclass(frozen=True)
class AttachPlan:
    """Where new sequence `seq_id`'s KV in `slot` comes from, in the order
    to try: runs of a disk state spliced in (`disk_runs`), a disk state
    restored (`disk_hit`), then memory: `n` prompt tokens of `src`'s KV
    (its own slot or another), and with `moved`, runs of it moved past a
    difference. The KV manager tries them in that order."""

    seq_id: int
    slot: int
    prompt: list[int]
    src: int
    n: int
    moved: Reuse | None = None
    disk_runs: tuple[Hit, Reuse] | None = None
    disk_hit: Hit | None = None


class PrefixCache:
    """Decides, on the engine's behalf, what new sequences reuse and which
    states to keep on the `disk` store. `tile` is the engine's (rule.py):
    how much of a hit may be reused exactly; `min_run` > 0 moves runs past
    a difference (reuse.py)."""

    def __init__(self, disk: DiskStore | None = None, tile: int = TILE, min_run: int = 0):
        self.disk = disk
        self.tile = tile
        self.min_run = min_run

    # ---- decisions (engine thread) -------------------------------------------

    def plan_attach(self, seq_id: int, slot: int, prompt: list[int], kv_src: tuple[int, int],
                    moved: Reuse | None) -> AttachPlan:
        """The plan for a sequence the slot table gave `kv_src` (slot, n)
        and `moved` runs: the disk's best, when it beats memory."""
        src, n = kv_src
        memory = moved.total if moved else n
        hit = self._disk_hit(prompt, memory)
        disk_runs = self._disk_moves(prompt, max(memory, hit.n if hit else 0))
        return AttachPlan(seq_id, slot, prompt, src, n, moved if self.min_run else None,
                          disk_runs, hit)

    def _disk_moves(self, prompt: list[int], beat: int) -> tuple[Hit, Reuse] | None:
        """The recent disk state whose prefix and moved runs give the most,
        when that beats `beat` tokens by MIN_DISK_GAIN."""
        if self.disk is None or not self.min_run or len(prompt) - beat < BLOCK:
            return None
        best: tuple[Hit, Reuse] | None = None
        try:
            found = self.disk.recent(RECENT_STATES)
        except OSError:
            return None
        for hit, tokens in found:
            got = plan(tokens, prompt, reusable(tokens, prompt, self.tile), self.min_run)
            if got.runs and got.total >= max(beat + MIN_DISK_GAIN, best[1].total if best else 0):
                best = (hit, got)
        return best

    def _disk_hit(self, prompt: list[int], n_memory: int) -> Hit | None:
        if self.disk is None or len(prompt) - n_memory < BLOCK // 4:
            return None
        try:
            hit = self.disk.lookup(prompt)
        except OSError:
            return None
        if hit is None:
            return None
        hit.n = exact_reuse(hit.n, len(prompt), self.tile)
        return hit if hit.n >= n_memory + MIN_DISK_GAIN else None

    def prefilled_state(self, prompt: list[int], n_cached: int) -> list[int] | None:
        """The tokens whose state to save once a prompt is computed: the
        prompt, when the sequence computed at least a block of it itself
        (copies of a known prefix add nothing new) and the disk lacks it."""
        if self.disk is None or len(prompt) - n_cached < BLOCK:
            return None
        return self._unsaved(prompt)

    def finished_state(self, tokens: list[int], n_prompt: int) -> list[int] | None:
        """The tokens whose state to save when a sequence parks: the reply
        too, when it added a whole block (the next turn of a conversation
        resends it). Not with a tile rule: a generated token's KV comes
        from a one-row chunk, which a prompt never computes."""
        if self.disk is None or self.tile > 1 or len(tokens) // BLOCK <= n_prompt // BLOCK:
            return None
        return self._unsaved(tokens)

    def _unsaved(self, tokens: list[int]) -> list[int] | None:
        assert self.disk is not None
        try:
            if self.disk.has(tokens):
                return None
        except OSError:
            pass
        return tokens

    def close(self) -> None:
        """Write what the disk store has queued, then stop its writer."""
        if self.disk is not None:
            self.disk.close()
