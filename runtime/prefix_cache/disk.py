"""The on-disk prefix KV store: sequence states saved with
llama_state_seq_get_data, found again after a restart.

Layout: <cache_dir>/prefix/<namespace>/ with one `meta.json` naming the model
and settings, `<hash>.kv` state files and `<hash>.ref` aliases. The namespace
hashes everything that changes the bytes of a state, so another model or
setting can never match. Inside it, a hash chain over 256-token blocks names
each prefix: a state of n tokens is stored under the hash of its last whole
block, with `.ref` aliases (that hex name, nothing else) at its earlier block
boundaries, so the longest stored prefix of a prompt is found by walking the
prompt's chain from the longest end, a few stat() calls.

A state file (format 2) is `_HEAD` (magic, format, header length, payload
length, payload CRC32), a CRC32 over `_HEAD` and the header, the JSON header,
then the payload (state_file.py).

The folders are owner-only (0700). Only regular files and real directories
owned by this user are read or deleted: symlinks are never followed, other
users' files are left alone. One background thread writes through
llmctl.files.atomic_write (fsync, then rename), so readers (this process or
another server on the same directory) see a whole file or none. Anything
torn, corrupt or foreign is deleted and the request prefills cold. Errors
writing (read-only or full disk) are logged once and dropped."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from llmctl.files import (
    atomic_write,
    clean_stale_tmp,
    ensure_private_dir,
    is_foreign,
    open_owned,
    owned_stat,
    remove_owned,
)
from llmctl.runtime.prefix_cache.rule import usable_prefix
from llmctl.runtime.prefix_cache.state_file import (
    BLOCK,
    FIXED_SIZE,
    block_chain,
    decode_header,
    namespace,
    read_header,
    read_state,
    state_prefix,
)

log = logging.getLogger("llmctl.prefix_cache")

_HEX_NAME = re.compile(r"[0-9a-f]{32}")
_CLOSE_TIMEOUT_S = 600              # a state is written in well under a second; a hung disk is not


@dataclass
class Hit:
    """A disk lookup's find: the state file, how many prompt tokens it can give,
    and its header's CRC."""

    path: Path
    n: int                  # prompt tokens the stored state can give
    crc: int                # the header's CRC at lookup: load refuses a file replaced since


@dataclass
class _Job:
    tokens: list[int]
    chain: list[str]
    blob: bytes | memoryview    # a state as llama.cpp copied it out


def _remove_own(path: Path, why: str = "", symlinks: bool = False) -> None:
    if why:
        log.debug("prefix cache: dropping %s: %s", path.name, why)
    remove_owned(path, symlinks)


def _namespaces(root: Path) -> list[Path]:
    """Namespace folders under `root` that are real directories of ours."""
    if owned_stat(root, True, stat.S_ISDIR) is None:
        return []
    with contextlib.suppress(OSError):
        return sorted(Path(e.path) for e in os.scandir(root)
                      if owned_stat(Path(e.path), kind=stat.S_ISDIR))
    return []


def _own_files(d: Path, suffix: str) -> list[tuple[Path, os.stat_result]]:
    """(path, stat) of the regular files of ours in `d` named `*suffix`."""
    with contextlib.suppress(OSError):
        found = ((Path(e.path), owned_stat(Path(e.path))) for e in os.scandir(d)
                 if e.name.endswith(suffix))
        return [(path, st) for path, st in found if st is not None]
    return []


class DiskStore:
    """One model and setting's states under `root`, within a byte budget
    shared by every namespace there."""

    def __init__(self, root: Path, identity: dict[str, object], budget_bytes: int, max_pending: int = 4):
        self.root = root
        self.identity = identity
        self.ns = namespace(identity)
        self.dir = root / self.ns
        self.budget = budget_bytes
        self._jobs: queue.Queue = queue.Queue(maxsize=max_pending)
        self._warned = False
        self._closed = False
        self._closing = threading.Lock()
        self._thread = threading.Thread(target=self._writer, name="llmctl-kv-writer", daemon=True)
        self._thread.start()

    # ---- lookups (engine thread) -----------------------------------------------

    def lookup(self, prompt: list[int]) -> Hit | None:
        """The longest stored prefix of `prompt`, or None. Never raises for
        a bad file: it is deleted (when it is ours) and the walk goes on."""
        if owned_stat(self.dir, kind=stat.S_ISDIR) is None:
            return None
        chain = block_chain(self.ns, prompt, len(prompt) // BLOCK)
        for k in range(len(chain), 0, -1):
            path = self._resolve(chain[k - 1])
            if path is None:
                continue
            hit = self._check(path, chain[k - 1], prompt, k)
            if hit is not None:
                return hit
        return None

    def _resolve(self, h: str) -> Path | None:
        kv = self.dir / f"{h}.kv"
        if os.path.lexists(kv):
            return kv
        ref = self.dir / f"{h}.ref"
        try:
            opened = open_owned(ref)
            if opened is None:
                return None
            with opened[0] as f:
                name = f.read(64).decode("ascii", "replace").strip()
        except OSError:
            return None
        if not _HEX_NAME.fullmatch(name):
            _remove_own(ref, "alias to something other than a state name")
            return None
        target = self.dir / f"{name}.kv"
        if os.path.lexists(target):
            return target
        _remove_own(ref)        # its state was evicted
        return None

    def _check(self, path: Path, h: str, prompt: list[int], k: int) -> Hit | None:
        try:
            state = read_state(path)
            if state is None:
                return None     # gone (another server evicted it), or not ours to judge
            header = decode_header(state[0])
        except OSError:
            return None
        except ValueError as e:
            _remove_own(path, str(e))
            return None
        if header["ns"] != self.ns:
            _remove_own(path, "from another model or setting")
            return None
        if h not in header["chain"]:
            return None
        n = usable_prefix(header["tokens"], prompt)
        return Hit(path, n, state[1]) if n >= k * BLOCK or n == len(prompt) - 1 else None

    def recent(self, limit: int) -> list[tuple[Hit, list[int]]]:
        """The `limit` most recently used states, each as a Hit for all its
        tokens with the tokens themselves: what a prompt that differs early
        may splice from (reuse.py). Never raises for a bad file: it is
        deleted (when it is ours) and the rest are read."""
        files = sorted(_own_files(self.dir, ".kv"), key=lambda f: f[1].st_mtime, reverse=True)
        out = []
        for path, _ in files[:limit]:
            try:
                state = read_state(path)
                if state is None:
                    continue
                header = decode_header(state[0])
            except OSError:
                continue
            except ValueError as e:
                _remove_own(path, str(e))
                continue
            if header["ns"] == self.ns:
                out.append((Hit(path, len(header["tokens"]), state[1]), header["tokens"]))
        return out

    def load(self, hit: Hit) -> bytes | None:
        """The state's bytes, both checksums checked; None when the file is
        gone, bad (then deleted) or replaced since the lookup. Never raises."""
        try:
            state = read_state(hit.path, payload=True)
        except OSError:
            return None
        except ValueError as e:
            _remove_own(hit.path, str(e))
            return None
        if state is None or state[1] != hit.crc:
            return None         # gone, or another server rewrote it: the hit's n may not hold
        with contextlib.suppress(OSError):
            os.utime(hit.path)  # least recently used goes first
        return state[3]

    def discard(self, hit: Hit) -> None:
        log.warning("prefix cache: llama.cpp rejected %s; dropping it", hit.path.name)
        _remove_own(hit.path)

    def has(self, tokens: list[int]) -> bool:
        k = len(tokens) // BLOCK
        return k > 0 and os.path.lexists(self.dir / f"{block_chain(self.ns, tokens, k)[-1]}.kv")

    # ---- saving (writer thread) -------------------------------------------------

    def save(self, tokens: list[int], blob: bytes | memoryview) -> bool:
        """Queue a state for writing; drops it rather than ever blocking, and
        after close()."""
        k = len(tokens) // BLOCK
        if k == 0 or not blob:
            return False
        with self._closing:     # a job queued behind close()'s stop mark would be lost
            if self._closed:
                return False
            try:
                self._jobs.put_nowait(_Job(list(tokens), block_chain(self.ns, tokens, k), blob))
                return True
            except queue.Full:
                return False

    def flush(self) -> None:
        self._jobs.join()

    def close(self, timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Write everything queued, then stop the writer; gives up after
        `timeout` seconds so a hung disk cannot hang shutdown. Idempotent."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + timeout
        with contextlib.suppress(queue.Full):
            self._jobs.put(None, timeout=timeout)
        self._thread.join(max(deadline - time.monotonic(), 0))
        if self._thread.is_alive():
            log.warning("prefix cache: gave up waiting for queued writes to %s", self.dir)

    def _writer(self) -> None:
        # The engine's threads get the cores first: with as many cores as
        # ggml threads, a save written beside a decode step slowed the steps
        # after a long prompt by 5% (docs/measurements.md, "The disk
        # store's writer"); idle, it writes at full speed.
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._write(job)
                self._evict()
            except OSError as e:
                if not self._warned:
                    self._warned = True
                    log.warning("prefix cache: cannot write to %s (%s); serving without "
                                "saving prefixes", self.dir, e)
            except Exception:   # never let the writer die: the cache is optional
                log.exception("prefix cache: write failed")
            finally:
                self._jobs.task_done()

    def _write(self, job: _Job) -> None:
        ensure_private_dir(self.root, follow=True)     # the user may have linked it elsewhere
        ensure_private_dir(self.dir)
        meta = self.dir / "meta.json"
        if not os.path.lexists(meta):
            atomic_write(meta, json.dumps(self.identity, indent=1))
        name = job.chain[-1]
        path = self.dir / f"{name}.kv"
        header = json.dumps({"ns": self.ns, "n_tokens": len(job.tokens), "tokens": job.tokens,
                             "chain": job.chain, "created": time.time()}).encode()
        if FIXED_SIZE + len(header) + len(job.blob) > self.budget or is_foreign(path):
            return
        atomic_write(path, (state_prefix(header, job.blob), header, job.blob))
        for h in job.chain[:-1]:
            ref = self.dir / f"{h}.ref"
            if self._resolve(h) is None and not is_foreign(ref):
                atomic_write(ref, name)

    def _evict(self) -> None:
        """Delete least recently used states, across all models, until the
        whole cache fits the budget."""
        files = []
        for d in _namespaces(self.root):
            clean_stale_tmp(d)      # left by crashed writers
            files += [(st.st_mtime, st.st_size, path) for path, st in _own_files(d, ".kv")]
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.budget:
                break
            _remove_own(path)
            total -= size


# ---- inspection (llmctl cache) --------------------------------------------------

def list_entries(root: Path) -> list[dict]:
    """One row per model namespace of ours: its model, settings, entries
    and size. Symlinked folders and other users' files are not counted."""
    rows = []
    for d in _namespaces(root):
        meta: object = {}
        with contextlib.suppress(OSError, ValueError, RecursionError):
            opened = open_owned(d / "meta.json")
            if opened is not None:
                with opened[0] as f:
                    meta = json.loads(f.read(1 << 20))
        meta = meta if isinstance(meta, dict) else {}
        entries, tokens, size = 0, 0, 0
        for path, st in _own_files(d, ".kv"):
            with contextlib.suppress(OSError):
                parsed = read_header(path)
                entries, size = entries + 1, size + st.st_size
                tokens += parsed[0]["n_tokens"] if parsed else 0
        rows.append({"namespace": d.name, "model": str(meta.get("model", "?")),
                     "sha256": str(meta.get("sha256", "")), "n_ctx_seq": meta.get("n_ctx_seq"),
                     "n_seq_max": meta.get("n_seq_max"), "entries": entries,
                     "tokens": tokens, "bytes": size, "path": str(d)})
    return rows


def clear(root: Path, model: str | None = None) -> list[dict]:
    """Delete every namespace (or those of one model, by name or sha256
    prefix) and return what was removed. Never follows a symlink: a
    symlinked entry is unlinked, its target left alone; other users' files
    stay."""
    removed = []
    for row in list_entries(root):
        if model and model != row["model"] and not (
                len(model) >= 8 and row["sha256"].startswith(model)):
            continue
        d = Path(row["path"])
        with contextlib.suppress(OSError):
            for name in os.listdir(d):
                _remove_own(d / name, symlinks=True)
        with contextlib.suppress(OSError):
            d.rmdir()       # fails when a server wrote a new file meanwhile; it stays valid
        removed.append(row)
    return removed
