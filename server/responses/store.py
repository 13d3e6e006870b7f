"""Stored responses, on disk under the llmctl home: one JSON file per
response in <home>/responses/, written whole and renamed into place, so
they outlive a restart. The folder is bounded by count
(LLMCTL_RESPONSES_MAX) and bytes (LLMCTL_RESPONSES_MAX_MB); past either
the oldest responses go.

A response is readable the moment it is stored: it waits in memory until
its one writer thread has put it on disk, so a client that continues a
conversation right after the last event never misses it, and the event
loop never waits on the disk.

Reasoning handed back to a client (`include: ["reasoning.encrypted_content"]`)
is sealed here too: the thought's text with an HMAC under a secret kept in
the same folder, so only this home's servers accept it back."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from llmctl import settings
from llmctl.errors import InvalidParams
from llmctl.files import atomic_write
from llmctl.server.workers import DaemonExecutor
from llmctl.settings import Settings

log = logging.getLogger("llmctl.server")

ID_RE = re.compile(r"resp_[A-Za-z0-9]{1,64}")
_SEAL_PREFIX = "llmctl1"
_SECRET_FILE = "secret"


def new_id(prefix: str) -> str:
    """A fresh id: `prefix`, an underscore and 40 hex digits."""
    return f"{prefix}_{secrets.token_hex(20)}"


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: the response object as returned, the input
    items it was given (with ids) and the whole conversation as chat
    messages (without instructions), from which a continuation renders."""

    response: dict
    input_items: list[dict]
    messages: list[dict]

    def to_bytes(self) -> bytes:
        """The file's content."""
        return json.dumps({"response": self.response, "input_items": self.input_items,
                           "messages": self.messages}, ensure_ascii=False).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> StoredResponse:
        """The record in a file. Raises ValueError for a file that is not one."""
        obj = json.loads(raw)
        if not isinstance(obj, dict) or not all(
                isinstance(obj.get(k), t) for k, t in
                (("response", dict), ("input_items", list), ("messages", list))):
            raise ValueError("not a stored response")
        return cls(obj["response"], obj["input_items"], obj["messages"])


class ResponseStore:
    """The stored responses of one home. `put` never blocks; `get` and
    `delete` read the disk and belong on a worker thread."""

    def __init__(self, folder: Path, max_count: int, max_bytes: int):
        self.folder, self.max_count, self.max_bytes = folder, max_count, max_bytes
        self._lock = threading.Lock()
        self._pending: dict[str, StoredResponse] = {}
        self._index: OrderedDict[str, int] | None = None     # id -> bytes, oldest first
        self._writer = DaemonExecutor("llmctl-responses", 1)
        self._key: bytes | None = None

    def put(self, record: StoredResponse) -> None:
        """Store `record` under its response's id: readable at once, on disk
        soon after. Raises nothing; a failed write is logged."""
        rid = record.response["id"]
        with self._lock:
            self._pending[rid] = record
        self._writer.submit(self._write, rid, record)

    def get(self, rid: str) -> StoredResponse | None:
        """The response stored as `rid`; None when there is none (or the
        id could not be one). Blocking."""
        if not ID_RE.fullmatch(rid):
            return None
        with self._lock:
            record = self._pending.get(rid)
        if record is not None:
            return record
        try:
            return StoredResponse.from_bytes((self.folder / f"{rid}.json").read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("stored response %s is unreadable: %s", rid, e)
            return None

    def delete(self, rid: str) -> bool:
        """Remove the response stored as `rid`; whether there was one. Blocking."""
        if not ID_RE.fullmatch(rid):
            return False
        # Behind any write of it still queued, so the write cannot bring it back.
        return bool(self._writer.submit(self._remove, rid).result())

    def _remove(self, rid: str) -> bool:
        with self._lock:
            pending = self._pending.pop(rid, None) is not None
            self._load_index().pop(rid, None)
        try:
            (self.folder / f"{rid}.json").unlink()
        except FileNotFoundError:
            return pending
        return True

    def _load_index(self) -> OrderedDict[str, int]:
        """The files on disk, oldest first (called with the lock held)."""
        if self._index is None:
            found = []
            for path in self.folder.glob("resp_*.json"):
                try:
                    st = path.stat()
                except OSError:
                    continue
                found.append((st.st_mtime_ns, path.stem, st.st_size))
            self._index = OrderedDict((rid, size) for _, rid, size in sorted(found))
        return self._index

    def _write(self, rid: str, record: StoredResponse) -> None:
        data = record.to_bytes()
        try:
            atomic_write(self.folder / f"{rid}.json", data)
        except OSError as e:
            log.warning("could not store response %s: %s", rid, e)
            return
        finally:
            with self._lock:
                if self._pending.get(rid) is record:
                    del self._pending[rid]
        with self._lock:
            index = self._load_index()
            index[rid] = len(data)
            index.move_to_end(rid)
            doomed = []
            total = sum(index.values())
            while len(index) > self.max_count or (total > self.max_bytes and len(index) > 1):
                old, size = index.popitem(last=False)
                total -= size
                doomed.append(old)
        for old in doomed:
            try:
                (self.folder / f"{old}.json").unlink()
            except FileNotFoundError:
                pass

    # ---- sealed reasoning ----------------------------------------------------------

    def key(self) -> bytes:
        """This home's sealing secret, made on first use. Blocking. Raises
        OSError from the filesystem."""
        if self._key is None:
            path = self.folder / _SECRET_FILE
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                self._key = path.read_bytes()
            else:
                key = secrets.token_bytes(32)
                with os.fdopen(fd, "wb") as f:
                    f.write(key)
                self._key = key
        return self._key

    def seal(self, text: str) -> str:
        """`text` as an opaque string that unseal() gives back."""
        body = base64.urlsafe_b64encode(json.dumps({"v": 1, "text": text}).encode()).decode()
        return f"{_SEAL_PREFIX}.{body}.{self._mac(body)}"

    def unseal(self, sealed: str, param: str) -> str:
        """The text seal() sealed in `sealed`. Raises InvalidParams naming
        `param` for anything this home did not seal."""
        parts = sealed.split(".") if isinstance(sealed, str) else []
        if len(parts) != 3 or parts[0] != _SEAL_PREFIX or not hmac.compare_digest(
                self._mac(parts[1]).encode(), parts[2].encode("utf-8", "replace")):
            raise InvalidParams(f"'{param}' was not made by this llmctl server", param="input")
        try:
            obj = json.loads(base64.urlsafe_b64decode(parts[1]))
        except (ValueError, binascii.Error):
            raise InvalidParams(f"'{param}' is damaged", param="input") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise InvalidParams(f"'{param}' is damaged", param="input")
        return obj["text"]

    def _mac(self, body: str) -> str:
        return hmac.new(self.key(), body.encode(), hashlib.sha256).hexdigest()


_stores: dict[Path, ResponseStore] = {}
_stores_lock = threading.Lock()


def store_for_home(bounds: Settings) -> ResponseStore:
    """The store of this process's llmctl home (settings.home()/responses),
    bounded by `bounds`' responses_max and responses_max_mb when first made."""
    folder = settings.home() / "responses"
    with _stores_lock:
        if folder not in _stores:
            _stores[folder] = ResponseStore(folder, bounds.responses_max,
                                            int(bounds.responses_max_mb * (1 << 20)))
        return _stores[folder]
