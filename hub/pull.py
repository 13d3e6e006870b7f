"""`llmctl pull`: list, choose, download, verify, link into the HF cache,
register. Each step lives in its own module; this one only sequences them.

Everything the Hub's listing names (the commit, each file's path and ETag)
becomes part of a path in the cache, so it is checked before anything is
written: a hostile mirror must not write outside the cache."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from llmctl.errors import HubError
from llmctl.files import require_space, safe_relpath
from llmctl.hub import remote
from llmctl.hub.choose import RemoteFile, Selection, select_files
from llmctl.hub.events import PullEvents, Silent
from llmctl.hub.part_ledger import Parts
from llmctl.hub.ranged import RangeDownload
from llmctl.hub.reference import Reference, parse_reference
from llmctl.hub.verify import verify
from llmctl.settings import Settings
from llmctl.store.gguf_info import is_later_shard
from llmctl.store.hf_cache import RepoCache, check_commit, check_etag
from llmctl.store.index import StoreIndex

DEFAULT_CONNECTIONS = 16


@dataclass
class PulledFile:
    """One file of a pull: its repo path, size, sha256, local path and whether
    it was complete on disk already."""

    path: str
    size: int
    sha256: str | None
    local_path: str
    cached: bool          # already complete on disk before this pull


@dataclass
class PullResult:
    """What a pull did: the reference, repo, revision and commit, its files and
    the names it registered, and its byte and time figures."""

    reference: str
    repo_id: str
    revision: str
    commit: str
    kind: str
    snapshot: str
    files: list[PulledFile] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)
    dry_run: bool = False
    bytes_downloaded: int = 0
    transfer_seconds: float = 0.0   # time on the wire, without hashing and registering
    register_seconds: float = 0.0   # reading the GGUF header into the store index
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _cached_listing(cache: RepoCache, repo_id: str, revision: str | None):
    """The file list of a pulled revision, read from the cache alone."""
    commit = cache.resolve_commit(revision)
    if commit is None:
        raise HubError(f"offline mode (HF_HUB_OFFLINE is set) and {repo_id}@{revision or 'main'}"
                       " is not in the cache; unset HF_HUB_OFFLINE to download it")
    snap, files = cache.snapshot(commit), []
    for p in sorted(snap.rglob("*")):
        if p.is_file():
            etag = Path(os.readlink(p)).name if p.is_symlink() else ""
            files.append(RemoteFile(path=p.relative_to(snap).as_posix(), size=p.stat().st_size,
                                    sha256=etag if len(etag) == 64 else None,
                                    blob_id=etag if len(etag) == 40 else None))
    return remote.RepoListing(repo_id=repo_id, commit=commit, files=files)


def _check_names(files: list[RemoteFile]) -> None:
    """Raise PathEscape unless every file's path and ETag can safely become
    path components in the cache."""
    for f in files:
        safe_relpath(f.path)
        check_etag(f.path, f.etag)


@dataclass(frozen=True)
class Transfer:
    """How files are fetched: parallel ranges per file, and the settings'
    retries, back-off and stall timeout."""

    connections: int
    settings: Settings


def _fetch(cache: RepoCache, repo_id: str, commit: str, f: RemoteFile, how: Transfer,
           events: PullEvents, result: PullResult) -> str:
    """Bring one file into blobs/, verified, and link it into the snapshot;
    return its sha256."""
    t0 = time.monotonic()
    src = remote.file_source(repo_id, commit, f.path)
    if src.xet:   # huggingface_hub's hf_xet path fetches chunks in parallel and resumes
        from huggingface_hub import hf_hub_download

        events.on_file(f.path, f.size, 0)
        got = hf_hub_download(repo_id, f.path, revision=commit, cache_dir=cache.root,
                              endpoint=remote.endpoint(), token=remote.token())
        events.on_bytes(f.path, f.size)
        result.bytes_downloaded += f.size
        result.transfer_seconds += time.monotonic() - t0
        sha256 = verify(Path(got).resolve(), f)
        cache.link(commit, f.path, f.etag)
        return sha256
    # Linked under the blob's lock, so an `rm` that deletes unlinked blobs
    # never takes this one between the download and the link.
    with FileLock(str(cache.lock(f.etag))):
        blob = cache.blob(f.etag)
        if blob.is_file() and blob.stat().st_size == f.size:
            sha256 = verify(blob, f)   # another tool fetched it meanwhile
        else:
            sha256 = _download(cache, src, f, how, events, result)
        cache.link(commit, f.path, f.etag)
        return sha256


def _download(cache: RepoCache, src: remote.FileSource, f: RemoteFile, how: Transfer,
              events: PullEvents, result: PullResult) -> str:
    """Range-download into the resumable partial file, verify it, move it to
    blobs/; return its sha256."""
    parts = Parts.open(cache.partial(f.etag), f.etag, f.size, how.connections)
    if parts.bytes_done:
        events.on_note(f"resuming {f.path}: {parts.bytes_done / 1e6:,.1f} MB already on disk")
    events.on_file(f.path, f.size, parts.bytes_done)
    result.bytes_downloaded += f.size - parts.bytes_done
    t0 = time.monotonic()
    RangeDownload(src.url, src.headers, parts, how.connections,
                  on_bytes=lambda n: events.on_bytes(f.path, n), patience=how.settings).run()
    result.transfer_seconds += time.monotonic() - t0
    try:
        sha256 = verify(parts.data, f)
    finally:
        parts.sidecar.unlink(missing_ok=True)
    os.replace(parts.data, cache.blob(f.etag))
    return sha256


def _register(result: PullResult, sel: Selection, shas: dict[str, str | None],
              cache: RepoCache) -> None:
    index = StoreIndex()
    models = [g for g in sel.ggufs if not is_later_shard(g)]
    for gguf in models:
        name = result.reference if len(models) == 1 else \
            f"{result.repo_id}:{Path(gguf).name.removesuffix('.gguf')}"
        index.register_file(
            name, cache.file(result.commit, gguf),
            source=f"hf:{result.repo_id}@{result.commit[:12]}", owned=True,
            sha256=shas.get(gguf),
            extra={"repo": result.repo_id, "revision": result.revision,
                   "commit": result.commit, "file": gguf, "hf_cache": str(cache.dir)})
        result.registered.append(name)


def _plan(ref: Reference, cache: RepoCache, revision: str | None, include: list[str] | None,
          exclude: list[str] | None, dry_run: bool) -> tuple[PullResult, Selection]:
    """List and choose; nothing is written. Raises PathEscape for unsafe names."""
    listing = _cached_listing(cache, ref.repo_id, revision) if remote.offline() \
        else remote.list_repo(ref.repo_id, revision)
    check_commit(listing.commit)
    sel = select_files(listing.files, ref.repo_id, tag=ref.tag, file=ref.file,
                       include=include, exclude=exclude)
    _check_names(sel.files)
    result = PullResult(reference=ref.name, repo_id=ref.repo_id, revision=revision or "main",
                        commit=listing.commit, kind=sel.kind, dry_run=dry_run,
                        snapshot=str(cache.snapshot(listing.commit)))
    for f in sel.files:
        cached = cache.has_file(listing.commit, f.path, f.etag, f.size)
        result.files.append(PulledFile(f.path, f.size, f.sha256,
                                       str(cache.file(listing.commit, f.path)), cached))
    return result, sel


def pull(model: str, *, revision: str | None = None, include: list[str] | None = None,
         exclude: list[str] | None = None, connections: int = DEFAULT_CONNECTIONS,
         dry_run: bool = False, events: PullEvents | None = None,
         settings: Settings | None = None) -> PullResult:
    """Pull `model` (a models.toml name or ORG/REPO[:TAG]) into the HF cache
    and register its GGUF models; `events` hears about progress (see
    llmctl.hub.events); `settings` holds the retries and timeouts (None:
    Settings.load(), this process's). Raises UsageError (bad reference, nothing matches),
    HubError, IntegrityError, DiskSpaceError, and PathEscape when the Hub's
    listing names paths outside the cache."""
    t0 = time.monotonic()
    how = Transfer(connections, settings or Settings.load())
    events = events or Silent()
    ref = parse_reference(model)
    cache = RepoCache(ref.repo_id)
    result, sel = _plan(ref, cache, revision, include, exclude, dry_run)
    if dry_run:
        return result
    cache.clean_stale(result.commit, [f.path for f in sel.files])
    cached = {f.path for f in result.files if f.cached}
    missing = [f for f in sel.files if f.path not in cached]
    require_space(cache.dir, sum(f.size - _partial_bytes(cache, f) for f in missing),
                  f"the pull of {ref.repo_id}")
    shas = {f.path: f.sha256 for f in sel.files}
    events.on_start(sum(f.size for f in missing))
    for f in missing:
        shas[f.path] = _fetch(cache, ref.repo_id, result.commit, f, how, events, result)
    cache.write_ref(revision, result.commit)
    t_reg = time.monotonic()
    _register(result, sel, shas, cache)
    result.register_seconds = round(time.monotonic() - t_reg, 3)
    result.transfer_seconds = round(result.transfer_seconds, 3)
    result.seconds = round(time.monotonic() - t0, 3)
    return result


def _partial_bytes(cache: RepoCache, f: RemoteFile) -> int:
    parts = Parts._load(cache.partial(f.etag), f.etag, f.size)
    return parts.bytes_done if parts else 0
