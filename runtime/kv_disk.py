"""The on-disk prefix KV store: sequence states saved with
llama_state_seq_get_data, found again after a restart.

Layout: <cache_dir>/prefix/<namespace>/ with one `meta.json` naming the model
and settings, `<hash>.kv` state files and `<hash>.ref` aliases. The namespace
hashes everything that changes the bytes of a state (model file identity,
context per sequence, sequence count, KV type and layout, rope, llama.cpp
version), so another model or setting can never match. Inside it, a hash
chain over 256-token blocks names each prefix: a state of n tokens is stored
under the hash of its last whole block, with small `.ref` aliases at its
earlier block boundaries, so the longest stored prefix of a prompt is found
by walking the prompt's chain from the longest end, a few stat() calls.

Files are written by one background thread, to a temp file then renamed, so
readers (this process or another server on the same directory) see a whole
file or none. Each file carries a CRC32 over header and payload; anything
torn, truncated, corrupt or foreign is deleted and the request prefills
cold. Errors writing (read-only or full disk) are logged once and dropped."""

from __future__ import annotations

import array
import hashlib
import json
import logging
import os
import queue
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from llmctl.runtime.scheduler import usable_prefix

log = logging.getLogger("llmctl.prefix_cache")

BLOCK = 256
MAGIC = b"LLMCTLKV"
VERSION = 1
_HEAD = struct.Struct("<8sIIIQ")      # magic, version, header length, crc32, payload length
_STALE_TMP_S = 3600


def namespace(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def block_chain(ns: str, tokens: list[int], n_blocks: int) -> list[str]:
    """Hash of each block-aligned prefix: block i's hash covers all before it."""
    h = hashlib.sha256(ns.encode()).digest()
    out = []
    for i in range(n_blocks):
        block = array.array("i", tokens[i * BLOCK:(i + 1) * BLOCK]).tobytes()
        h = hashlib.sha256(h + block).digest()
        out.append(h.hex()[:32])
    return out


@dataclass
class Hit:
    path: Path
    n: int                  # prompt tokens the stored state can give


@dataclass
class _Job:
    tokens: list[int]
    chain: list[str]
    blob: bytes


def read_header(path: Path) -> tuple[dict, int, int] | None:
    """(header, header length, payload length), or None when the file is not
    a whole llmctl state file."""
    with open(path, "rb") as f:
        head = f.read(_HEAD.size)
        if len(head) != _HEAD.size:
            return None
        magic, version, hlen, _crc, plen = _HEAD.unpack(head)
        if magic != MAGIC or version != VERSION or hlen > 64 << 20:
            return None
        try:
            header = json.loads(f.read(hlen))
        except ValueError:
            return None
    if not isinstance(header, dict) or os.path.getsize(path) != _HEAD.size + hlen + plen:
        return None
    return header, hlen, plen


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class DiskStore:
    def __init__(self, root: Path, identity: dict, budget_bytes: int, max_pending: int = 4):
        self.root = root
        self.identity = identity
        self.ns = namespace(identity)
        self.dir = root / self.ns
        self.budget = budget_bytes
        self._jobs: queue.Queue = queue.Queue(maxsize=max_pending)
        self._warned = False
        self._thread = threading.Thread(target=self._writer, name="llmctl-kv-writer", daemon=True)
        self._thread.start()

    # ---- lookups (engine thread) -----------------------------------------------

    def lookup(self, prompt: list[int]) -> Hit | None:
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
        if kv.exists():
            return kv
        ref = self.dir / f"{h}.ref"
        try:
            target = self.dir / (ref.read_text().strip() + ".kv")
        except OSError:
            return None
        if target.exists():
            return target
        _unlink(ref)            # its state was evicted
        return None

    def _check(self, path: Path, h: str, prompt: list[int], k: int) -> Hit | None:
        try:
            parsed = read_header(path)
        except OSError:
            return None         # vanished under us: another server evicted it
        if parsed is None or parsed[0].get("ns") != self.ns:
            log.warning("prefix cache: dropping unreadable or foreign file %s", path.name)
            _unlink(path)
            return None
        header = parsed[0]
        chain = header.get("chain") or []
        if h not in chain:
            return None
        n = usable_prefix(header.get("tokens") or [], prompt)
        return Hit(path, n) if n >= k * BLOCK or n == len(prompt) - 1 else None

    def load(self, hit: Hit) -> bytes | None:
        """The state's bytes, checked; a bad file is deleted."""
        try:
            data = hit.path.read_bytes()
        except OSError:
            return None
        magic, version, hlen, crc, plen = _HEAD.unpack_from(data) if len(data) >= _HEAD.size \
            else (b"", 0, 0, 0, 0)
        body = memoryview(data)[_HEAD.size:]
        if magic != MAGIC or len(body) != hlen + plen or zlib.crc32(body) != crc:
            log.warning("prefix cache: dropping corrupt file %s", hit.path.name)
            _unlink(hit.path)
            return None
        try:
            os.utime(hit.path)  # least recently used goes first
        except OSError:
            pass
        return bytes(body[hlen:])

    def discard(self, hit: Hit) -> None:
        log.warning("prefix cache: llama.cpp rejected %s; dropping it", hit.path.name)
        _unlink(hit.path)

    def has(self, tokens: list[int]) -> bool:
        k = len(tokens) // BLOCK
        return k > 0 and (self.dir / f"{block_chain(self.ns, tokens, k)[-1]}.kv").exists()

    # ---- saving (writer thread) -------------------------------------------------

    def save(self, tokens: list[int], blob: bytes) -> bool:
        """Queue a state for writing; drops it rather than ever blocking."""
        k = len(tokens) // BLOCK
        if k == 0 or not blob:
            return False
        try:
            self._jobs.put_nowait(_Job(list(tokens), block_chain(self.ns, tokens, k), blob))
            return True
        except queue.Full:
            return False

    def flush(self) -> None:
        self._jobs.join()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=60)

    def _writer(self) -> None:
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
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / "meta.json"
        if not meta.exists():
            _atomic_write(meta, json.dumps(self.identity, indent=1).encode())
        name = job.chain[-1]
        header = json.dumps({"ns": self.ns, "n_tokens": len(job.tokens), "tokens": job.tokens,
                             "chain": job.chain, "created": time.time()}).encode()
        if _HEAD.size + len(header) + len(job.blob) > self.budget:
            return
        crc = zlib.crc32(job.blob, zlib.crc32(header))
        _atomic_write(self.dir / f"{name}.kv",
                      _HEAD.pack(MAGIC, VERSION, len(header), crc, len(job.blob)), header, job.blob)
        for h in job.chain[:-1]:
            if self._resolve(h) is None:
                _atomic_write(self.dir / f"{h}.ref", name.encode())

    def _evict(self) -> None:
        """Delete least recently used states, across all models, until the
        whole cache fits the budget."""
        files = []
        now = time.time()
        for path in self.root.glob("*/*"):
            try:
                st = path.stat()
            except OSError:
                continue
            if path.suffix == ".tmp" and now - st.st_mtime > _STALE_TMP_S:
                _unlink(path)   # left by a crashed writer
            elif path.suffix == ".kv":
                files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.budget:
                break
            _unlink(path)
            total -= size


def _atomic_write(path: Path, *parts: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


# ---- inspection (llmctl cache) --------------------------------------------------

def list_entries(root: Path) -> list[dict]:
    """One row per model namespace: its model, settings, entries and size."""
    rows = []
    for d in sorted(p for p in root.glob("*") if p.is_dir()):
        try:
            meta = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        entries, tokens, size = 0, 0, 0
        for path in d.glob("*.kv"):
            try:
                parsed = read_header(path)
                size += path.stat().st_size
            except OSError:
                continue
            entries += 1
            tokens += parsed[0].get("n_tokens", 0) if parsed else 0
        rows.append({"namespace": d.name, "model": meta.get("model", "?"),
                     "sha256": meta.get("sha256", ""), "n_ctx_seq": meta.get("n_ctx_seq"),
                     "n_seq_max": meta.get("n_seq_max"), "entries": entries,
                     "tokens": tokens, "bytes": size, "path": str(d)})
    return rows


def clear(root: Path, model: str | None = None) -> list[dict]:
    """Delete every namespace (or those of one model, by name or sha256
    prefix) and return what was removed."""
    removed = []
    for row in list_entries(root):
        if model and model != row["model"] and not (
                len(model) >= 8 and row["sha256"].startswith(model)):
            continue
        d = Path(row["path"])
        for path in d.glob("*"):
            _unlink(path)
        try:
            d.rmdir()
        except OSError:
            pass            # a server wrote a new file meanwhile; it stays valid
        removed.append(row)
    return removed
