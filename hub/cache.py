"""The standard Hugging Face cache layout (blobs/, snapshots/, refs/), so
huggingface_hub and every tool built on it find what llmctl pulled."""

from __future__ import annotations

import os
import re
from pathlib import Path

from huggingface_hub import constants

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def hub_cache() -> Path:
    """HF_HUB_CACHE, else HF_HOME/hub, read now rather than at import."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


class RepoCache:
    def __init__(self, repo_id: str, root: Path | None = None):
        self.repo_id = repo_id
        self.root = root or hub_cache()
        self.folder_name = "models--" + repo_id.replace("/", "--")
        self.dir = self.root / self.folder_name

    def blob(self, etag: str) -> Path:
        return self.dir / "blobs" / etag

    def partial(self, etag: str) -> Path:
        # Not `<etag>.incomplete`: huggingface_hub would resume that file by
        # appending, which is wrong for a file filled in out of order.
        return self.dir / "blobs" / f"{etag}.llmctl-partial"

    def lock(self, etag: str) -> Path:
        """The lock huggingface_hub takes for the same blob."""
        return self.root / ".locks" / self.folder_name / f"{etag}.lock"

    def snapshot(self, commit: str) -> Path:
        return self.dir / "snapshots" / commit

    def resolve_commit(self, revision: str | None) -> str | None:
        revision = revision or "main"
        if _COMMIT_RE.match(revision):
            return revision if self.snapshot(revision).is_dir() else None
        try:
            return (self.dir / "refs" / revision).read_text().strip() or None
        except OSError:
            return None

    def write_ref(self, revision: str | None, commit: str) -> None:
        revision = revision or "main"
        if revision == commit:
            return
        ref = self.dir / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{ref.name}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)

    def has_file(self, commit: str, path: str, etag: str, size: int) -> bool:
        blob = self.blob(etag)
        return (self.snapshot(commit) / path).exists() and blob.is_file() \
            and blob.stat().st_size == size

    def link(self, commit: str, path: str, etag: str) -> Path:
        """Point snapshots/<commit>/<path> at the blob, as a relative link."""
        target = self.snapshot(commit) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        rel = os.path.relpath(self.blob(etag), target.parent)
        tmp = target.with_name(f".{target.name}.llmctl-link")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(rel, tmp)
        os.replace(tmp, target)
        return target


def local_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of a pulled repo, or None if it was never pulled."""
    cache = RepoCache(repo_id)
    commit = cache.resolve_commit(revision)
    if commit is None:
        return None
    snap = cache.snapshot(commit)
    return snap if snap.is_dir() else None
