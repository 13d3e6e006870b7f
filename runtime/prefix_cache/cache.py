"""Prompt-prefix KV reuse: the engine's hooks that move KV between slots and
the disk. The scheduler decides (plain Python) where each new sequence's
longest computed prefix is: its own parked slot, another slot, or a leader
that is still prefilling it. This file carries those decisions out with
llama.cpp, and adds the disk store on top.

Copies between slots use llama_memory_seq_cp. With one KV stream per
sequence (kv_unified=False), llama.cpp copies a whole stream buffer (it
asserts on partial ranges across streams) and only marks the source
sequence's cells in the destination, so we copy the whole stream and then
seq_rm the tail past the match. The buffer copy itself runs at the start of
the next llama_decode, before that batch writes anything."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from llmctl import config
from llmctl.runtime.engine.scheduler import SchedulerConfig, exact_reuse
from llmctl.runtime.engine.sequence import Sequence
from llmctl.runtime.llama import LLAMA_CPP_VERSION
from llmctl.runtime.prefix_cache.disk import BLOCK, DiskStore, Hit

log = logging.getLogger("llmctl.prefix_cache")

MIN_DISK_GAIN = 64      # restoring fewer extra tokens than this is not worth a file read


def file_identity(path: Path, sha256: str | None) -> str:
    """The store's sha256 when known; otherwise a cheap content fingerprint
    (size, first and last MiB) so a multi-GB file is not hashed at load."""
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


class PrefixCache:
    """Moves KV between slots and the disk on the engine's behalf. Memory
    sharing works from construction; `open_disk` adds the disk store."""

    def __init__(self, disk: DiskStore | None = None, tile: int = SchedulerConfig.tile):
        self.disk = disk
        self.tile = tile        # the scheduler's: how much of a hit may be reused exactly

    def open_disk(self, llm, engine) -> None:
        """Key the disk store by everything that changes the bytes of a saved
        sequence state, reading the engine's own settings (its flash
        attention decision among them) so the key can't drift from them."""
        opts = llm.opts
        self.tile = engine.scheduler.cfg.tile
        budget = int(opts.prefix_cache_size_gb * 1e9)
        if budget <= 0:
            return
        entry = llm.resolved.entry
        identity = {
            "model": llm.resolved.name,
            "path": str(llm.resolved.path),
            "sha256": file_identity(Path(llm.resolved.path), entry.sha256 if entry else None),
            "n_ctx_seq": engine.n_ctx_seq, "n_seq_max": engine.max_num_seqs,
            "kv_type": engine.ctx.cfg.kv_type, "flash_attn": engine.flash_attn, "rope": "model",
            # 2: prompts cut by the flash-attention tile rule (scheduler.py), so
            # states saved under the old cuts are never restored.
            "llama_cpp": LLAMA_CPP_VERSION, "format": 2,
        }
        self.disk = DiskStore(config.cache_dir() / "prefix", identity, budget)

    # ---- engine hooks (engine thread) ------------------------------------------

    def attach(self, ctx, seqs: list[Sequence]) -> list[tuple[Sequence, Exception]]:
        """Give each newly started sequence the KV its plan names. Returns
        the sequences that failed, with their errors; the rest go on."""
        copy_sources: set[int] = set()
        failed = []
        for seq in seqs:
            try:
                self._attach_one(ctx, seq, copy_sources)
            except Exception as e:
                log.warning("prefix reuse for request %d failed: %s", seq.id, e)
                failed.append((seq, e))
        return failed

    def _attach_one(self, ctx, seq: Sequence, copy_sources: set[int]) -> None:
        src, n = seq.kv_src
        hit = self._disk_hit(seq, n)
        # A state_set into a slot that a copy still has to read (the copy
        # runs at the next decode) would hand the copy the wrong bytes.
        if hit is not None and seq.slot not in copy_sources:
            restored = self._restore(ctx, seq, hit)
            if restored:
                return
            if restored is None and src == seq.slot:
                n = 0       # the failed restore wiped the slot's own prefix
        if src != seq.slot:
            ctx.seq_cp(src, seq.slot)
            copy_sources.add(src)
        ctx.seq_rm(seq.slot, n, -1)
        seq.n_computed = seq.n_cached = n

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

    def _restore(self, ctx, seq: Sequence, hit: Hit) -> bool | None:
        """True when restored; False when the slot is untouched; None when
        llama.cpp rejected the state and the slot was cleared."""
        data = self.disk.load(hit)
        if data is None:
            return False
        if not ctx.state_set(data, seq.slot):
            self.disk.discard(hit)
            ctx.seq_rm(seq.slot)
            return None
        ctx.seq_rm(seq.slot, hit.n, -1)
        seq.n_computed = seq.n_cached = hit.n
        seq.cached_from_disk = True
        return True

    def on_prefilled(self, ctx, seq: Sequence) -> None:
        """Save the prompt's state when this sequence computed at least a
        block of it itself (copies of a known prefix add nothing new)."""
        if self.disk is None or len(seq.prompt) - seq.n_cached < BLOCK:
            return
        self._save(ctx, seq, seq.prompt)

    def on_finished(self, ctx, seq: Sequence) -> None:
        """Save the reply too when it added a whole block: the next turn of a
        conversation resends it. Not with a tile rule: a generated token's KV
        comes from a one-row chunk, which a prompt never computes."""
        if (self.disk is None or self.tile > 1
                or seq.n_computed // BLOCK <= len(seq.prompt) // BLOCK):
            return
        self._save(ctx, seq, seq.tokens[:seq.n_computed])

    def _save(self, ctx, seq: Sequence, tokens: list[int]) -> None:
        try:
            if self.disk.has(tokens):
                return
        except OSError:
            pass
        # Copying the bytes out is the only part on the engine thread.
        self.disk.save(tokens, ctx.state_get(seq.slot))

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
