"""Checksums the Hub publishes: the LFS sha256, or for small files stored
in git, the git blob sha1."""

from __future__ import annotations

import hashlib
from pathlib import Path

from llmctl.errors import IntegrityError
from llmctl.hub.choose import RemoteFile

CHUNK = 8 << 20


def _digest(path: Path, h) -> str:
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, remote: RemoteFile) -> str:
    """Return the file's sha256; delete it and raise if it is not the Hub's."""
    sha256 = _digest(path, hashlib.sha256())
    if remote.sha256:
        ok, want, got = sha256 == remote.sha256, remote.sha256, sha256
    elif remote.blob_id:
        git = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
        got = _digest(path, git)
        ok, want = got == remote.blob_id, remote.blob_id
    else:
        return sha256   # the Hub gave no checksum to compare with
    if not ok:
        path.unlink(missing_ok=True)
        raise IntegrityError(f"{remote.path}: checksum mismatch (expected {want[:12]}…, got "
                             f"{got[:12]}…); the download was deleted and nothing registered")
    return sha256
