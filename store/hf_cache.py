"""The standard Hugging Face cache layout (blobs/, snapshots/, refs/), so
huggingface_hub and every tool built on it find what llmctl pulled. It is
part of the store: the hub writes pulls into it, and the store removes them
(`llmctl rm`).

Names in this layout come from outside (a Hub listing, a ref typed by the
user, a link in the cache), so each is checked before it becomes a path, the
way huggingface_hub's `_get_pointer_path` does."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from filelock import FileLock
from huggingface_hub import constants

from llmctl.errors import PathEscape
from llmctl.files import atomic_write, clean_stale_tmp, contained, safe_relpath, staged

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# The Hub's ETag names the blob: an LFS sha256, or a git blob sha1.
ETAG_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def hub_cache() -> Path:
    """HF_HUB_CACHE, else HF_HOME/hub, read now rather than at import."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def check_commit(commit: str) -> str:
    """`commit` if it is a full commit sha. Raises PathEscape otherwise."""
    if not isinstance(commit, str) or not COMMIT_RE.match(commit):
        raise PathEscape(f"unsafe commit id {commit!r}: expected 40 hex digits")
    return commit


def check_etag(path: str, etag: str) -> str:
    """`etag` if it is a sha256 or git sha1 in hex. Raises PathEscape
    otherwise (it names a file in blobs/)."""
    if not isinstance(etag, str) or not ETAG_RE.match(etag):
        raise PathEscape(f"{path}: unsafe checksum {etag!r}: expected a sha256 or sha1 in hex")
    return etag


class RepoCache:
    """One repo's folder in the HF cache. Methods that take a commit, path or
    etag raise PathEscape when it would lead outside that folder."""

    def __init__(self, repo_id: str, root: Path | None = None):
        self.repo_id = repo_id
        self.root = root or hub_cache()
        self.folder_name = "models--" + repo_id.replace("/", "--")
        self.dir = contained(self.root, self.folder_name)

    def blob(self, etag: str) -> Path:
        return self.dir / "blobs" / check_etag("blob", etag)

    def partial(self, etag: str) -> Path:
        # Not `<etag>.incomplete`: huggingface_hub would resume that file by
        # appending, which is wrong for a file filled in out of order.
        return self.dir / "blobs" / f"{check_etag('blob', etag)}.llmctl-partial"

    def lock(self, etag: str) -> Path:
        """The lock huggingface_hub takes for the same blob."""
        return self.root / ".locks" / self.folder_name / f"{check_etag('lock', etag)}.lock"

    def snapshot(self, commit: str) -> Path:
        return self.dir / "snapshots" / check_commit(commit)

    def file(self, commit: str, path: str) -> Path:
        return self.snapshot(commit) / safe_relpath(path)

    def _ref(self, revision: str) -> Path:
        return contained(self.dir / "refs", revision)

    def resolve_commit(self, revision: str | None) -> str | None:
        revision = revision or "main"
        if COMMIT_RE.match(revision):
            return revision if self.snapshot(revision).is_dir() else None
        try:
            commit = self._ref(revision).read_text().strip()
        except OSError:
            return None
        return check_commit(commit) if commit else None

    def write_ref(self, revision: str | None, commit: str) -> None:
        revision = revision or "main"
        if revision != commit:
            atomic_write(self._ref(revision), check_commit(commit))

    def has_file(self, commit: str, path: str, etag: str, size: int) -> bool:
        blob = self.blob(etag)
        return self.file(commit, path).exists() and blob.is_file() \
            and blob.stat().st_size == size

    def link(self, commit: str, path: str, etag: str) -> Path:
        """Point snapshots/<commit>/<path> at the blob, as a relative link."""
        target = self.file(commit, path)
        rel = os.path.relpath(self.blob(etag), target.parent)
        with staged(target, fsync=False) as tmp:   # a link has no data to sync
            os.symlink(rel, tmp)
        return target

    def clean_stale(self, commit: str, paths: list[str]) -> int:
        """Delete write-then-rename temps that dead processes left in the
        folders this pull writes to; resumable partial downloads stay."""
        folders = {self.dir / "blobs", self.dir / "refs"}
        folders |= {self.file(commit, p).parent for p in paths}
        return sum(clean_stale_tmp(d) for d in folders)

    def remove_file(self, commit: str, path: str) -> bool:
        """Delete snapshots/<commit>/<path>, its blob when no other snapshot
        links to it, and the folders and refs this leaves empty. Links are
        read, never followed: a link that leads outside blobs/ is removed but
        not its target. Returns whether a blob was deleted. Raises PathEscape
        for an unsafe commit or path."""
        link = self.file(commit, path)
        snapshots = os.path.realpath(self.dir / "snapshots")
        if not Path(os.path.realpath(link.parent)).is_relative_to(snapshots):
            raise PathEscape(f"{link}: its folder is a link that leaves {snapshots}")
        blob = self._blob_of(link)
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        deleted = False
        if blob is not None:
            with FileLock(str(self.lock(blob.name))):   # a pull links under this lock
                if not self._linked(blob):
                    with contextlib.suppress(FileNotFoundError):
                        blob.unlink()
                        deleted = True
        self._prune(link.parent, commit)
        return deleted

    def _blob_of(self, link: Path) -> Path | None:
        """The blob a snapshot link names, if it names one in this repo."""
        if not link.is_symlink():
            return None
        target = Path(os.path.normpath(link.parent / os.readlink(link)))
        blobs = self.dir / "blobs"
        return target if target.parent == blobs and ETAG_RE.match(target.name) else None

    def _linked(self, blob: Path) -> bool:
        for folder, dirs, files in os.walk(self.dir / "snapshots"):
            for name in files + dirs:
                link = Path(folder) / name
                if link.is_symlink() and self._blob_of(link) == blob:
                    return True
        return False

    def _prune(self, folder: Path, commit: str) -> None:
        snapshots = self.dir / "snapshots"
        while folder != snapshots and folder.is_relative_to(snapshots):
            try:
                folder.rmdir()
            except OSError:   # not empty: still used
                return
            folder = folder.parent
        refs = self.dir / "refs"
        for ref in refs.rglob("*") if refs.is_dir() else ():
            with contextlib.suppress(OSError):
                if ref.is_file() and ref.read_text().strip() == commit:
                    ref.unlink()
        for sub in ("refs", "snapshots", "blobs", ""):
            with contextlib.suppress(OSError):
                (self.dir / sub).rmdir()


def local_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of a pulled repo, or None if it was never pulled."""
    cache = RepoCache(repo_id)
    commit = cache.resolve_commit(revision)
    if commit is None:
        return None
    snap = cache.snapshot(commit)
    return snap if snap.is_dir() else None
