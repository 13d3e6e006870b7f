"""Checksums the Hub publishes: the LFS sha256, or for small files stored
in git, the git blob sha1."""

from __future__ import annotations

import hashlib
from pathlib import Path

from llmctl.errors import IntegrityError
from llmctl.files import sha256_file
from llmctl.hub.choose import RemoteFile


def verify(path: Path, remote: RemoteFile) -> str:
    """Return the file's sha256. Raises IntegrityError (and deletes the file)
    when it is not the Hub's."""
    sha256 = sha256_file(path)
    if remote.sha256:
        ok, want, got = sha256 == remote.sha256, remote.sha256, sha256
    elif remote.blob_id:
        got = sha256_file(path, hashlib.sha1(f"blob {path.stat().st_size}\0".encode()))
        ok, want = got == remote.blob_id, remote.blob_id
    else:
        return sha256   # the Hub gave no checksum to compare with
    if not ok:
        path.unlink(missing_ok=True)
        raise IntegrityError(f"{remote.path}: checksum mismatch (expected {want[:12]}…, got "
                             f"{got[:12]}…); the download was deleted and nothing registered")
    return sha256
