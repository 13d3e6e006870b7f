"""File helpers every part of llmctl shares, defined once: write-then-rename,
checksums, free-space checks, stale temp clean-up and path containment.

Nothing on disk is ever lost to a crash: every write goes to a temp file
beside its target, is fsynced, then renamed over it. Temp names carry the
writer's pid, so a later process can tell a dead writer's leftovers from a
live one's work in progress."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import stat
import time
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterable, Iterator

from llmctl.errors import DiskSpaceError, PathEscape

CHUNK = 8 << 20
# Room left for the index, logs and the OS after a big write.
HEADROOM = 64 << 20
_TMP_RE = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}\.tmp$")


def tmp_path(path: Path) -> Path:
    """A temp name beside `path`, unique per process and call:
    `.NAME.PID.RANDOM.tmp`, which `clean_stale_tmp` recognises."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _fsync_dir(directory: Path) -> None:
    # The rename itself is durable only once the folder's entry is on disk.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def staged(path: Path, fsync: bool = True) -> Iterator[Path]:
    """Yield a temp path beside `path` for the caller (or a library) to
    write; on success fsync it and rename it into place, on any error delete
    it. Raises whatever the body raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if fsync:
            _fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write(path: Path, data: bytes | str | Iterable[bytes | memoryview], fsync: bool = True) -> None:
    """Replace `path` with `data` (bytes, text, or byte parts) all at once:
    readers see the old file or the new one, never half of either. Raises
    OSError from the filesystem."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    parts = [data.encode()] if isinstance(data, str) else [data] if isinstance(data, bytes) else data
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if fsync:
            _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def clean_stale_tmp(directory: Path, min_age_s: float = 60.0) -> int:
    """Delete temp files in `directory` (not below it) left by processes
    that no longer run and older than `min_age_s`; return how many."""
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        m = _TMP_RE.match(entry.name)
        if not m or entry.is_symlink() or _pid_alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):
            if now - entry.stat(follow_symlinks=False).st_mtime >= min_age_s:
                os.unlink(entry.path)
                removed += 1
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sha256_file(path: Path, h=None) -> str:
    """Hex digest of a file's bytes (sha256 unless another hash is given)."""
    h = h if h is not None else hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def require_space(where: Path, needed: int, what: str) -> None:
    """Fail before writing, not when the disk fills halfway. Raises
    DiskSpaceError naming both figures in MB."""
    free = free_bytes(where)
    if needed + HEADROOM > free:
        raise DiskSpaceError(f"not enough disk space in {where} for {what}: need about "
                             f"{(needed + HEADROOM) / 1e6:,.0f} MB, {free / 1e6:,.0f} MB free")


def safe_relpath(name: str) -> PurePosixPath:
    """A relative POSIX path from outside (a Hub listing, a request), checked
    to stay inside whatever folder it is joined to. Raises PathEscape for
    absolute paths, `..`, empty parts, backslashes and NUL bytes."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        raise PathEscape(f"unsafe path {name!r}")
    rel = PurePosixPath(name)
    if rel.is_absolute() or any(part in ("..", ".", "") for part in name.split("/")):
        raise PathEscape(f"unsafe path {name!r}: it would leave its folder")
    return rel


def contained(base: Path, name: str) -> Path:
    """`base / name` once `name` is known to stay below `base`. Raises
    PathEscape otherwise."""
    return base / safe_relpath(name)


@contextlib.contextmanager
def file_lock(path: Path):
    """An advisory inter-process lock, so two llmctl processes never
    interleave read-modify-write cycles on the same file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ---- files of ours only: shared folders (caches) hold nothing else we trust ----

def owned_stat(path: Path, follow: bool = False, kind=stat.S_ISREG) -> os.stat_result | None:
    """`path`'s stat when it is of `kind` and owned by this user; a symlink
    is looked at itself unless `follow`."""
    with contextlib.suppress(OSError):
        st = os.stat(path) if follow else os.lstat(path)
        if st.st_uid == os.getuid() and kind(st.st_mode):
            return st
    return None


def ensure_private_dir(path: Path, follow: bool = False) -> None:
    """Create `path` owner-only, or check the one there is a directory of
    ours and tighten its mode. Raises OSError when it cannot be used."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = owned_stat(path, follow, stat.S_ISDIR)
    if st is None:
        raise PermissionError(errno.EPERM, "not a directory owned by this user", str(path))
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)   # prompts can be read back out of a state


def open_owned(path: Path) -> tuple[BinaryIO, int] | None:
    """(open file, size) for a regular file of ours, opened without
    following a symlink or blocking on a FIFO; None when it is missing, a
    symlink, someone else's or not a regular file. Raises other OSErrors."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        return None
    return os.fdopen(fd, "rb"), st.st_size


def remove_owned(path: Path, symlinks: bool = False) -> None:
    """Delete `path` when it is a regular file of ours (or, with `symlinks`,
    a symlink of ours: the link, never its target). Never raises."""
    if owned_stat(path, kind=lambda m: stat.S_ISREG(m) or symlinks and stat.S_ISLNK(m)):
        with contextlib.suppress(OSError):
            os.unlink(path)


def is_foreign(path: Path) -> bool:
    """Whether something other than a regular file of ours is at `path`:
    a write must not replace it."""
    return os.path.lexists(path) and owned_stat(path) is None
