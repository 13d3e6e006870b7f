"""`llmctl pull`: list, choose, download, verify, link into the HF cache,
register. Each step lives in its own module; this one only sequences them."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from llmctl.errors import HubError
from llmctl.hub import remote
from llmctl.hub.cache import RepoCache
from llmctl.hub.choose import RemoteFile, Selection, select_files
from llmctl.hub.parts import Parts
from llmctl.hub.progress import PullProgress
from llmctl.hub.ranged import RangeDownload
from llmctl.hub.reference import parse_reference
from llmctl.hub.space import check_space
from llmctl.hub.verify import verify
from llmctl.store.index import StoreIndex

_SHARD = re.compile(r"-(\d{5})-of-\d{5}\.gguf$")

DEFAULT_CONNECTIONS = 16
_HEX = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


@dataclass
class PulledFile:
    path: str
    size: int
    sha256: str | None
    local_path: str
    cached: bool          # already complete on disk before this pull


@dataclass
class PullResult:
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


def _fetch(cache: RepoCache, repo_id: str, commit: str, f: RemoteFile, connections: int,
           bar: PullProgress, result: PullResult) -> str:
    """Bring one file into blobs/, verified; return its sha256."""
    t0 = time.monotonic()
    src = remote.file_source(repo_id, commit, f.path)
    if src.xet:   # huggingface_hub's hf_xet path fetches chunks in parallel and resumes
        from huggingface_hub import hf_hub_download

        task = bar.file(f.path + " (xet)", f.size)
        got = hf_hub_download(repo_id, f.path, revision=commit, cache_dir=cache.root,
                              endpoint=remote.endpoint(), token=remote.token())
        bar.advance(task, f.size)
        result.bytes_downloaded += f.size
        result.transfer_seconds += time.monotonic() - t0
        return verify(Path(got).resolve(), f)
    with FileLock(str(cache.lock(f.etag))):
        blob = cache.blob(f.etag)
        if blob.is_file() and blob.stat().st_size == f.size:
            return verify(blob, f)   # another tool fetched it meanwhile
        parts = Parts.open(cache.partial(f.etag), f.etag, f.size, connections)
        task = bar.file(f.path, f.size, parts.bytes_done)
        result.bytes_downloaded += f.size - parts.bytes_done
        RangeDownload(src.url, src.headers, parts, connections,
                      on_bytes=lambda n: bar.advance(task, n)).run()
        result.transfer_seconds += time.monotonic() - t0
        try:
            sha256 = verify(parts.data, f)
        finally:
            parts.sidecar.unlink(missing_ok=True)
        os.replace(parts.data, blob)
        return sha256


def _register(result: PullResult, sel: Selection, shas: dict[str, str | None],
              cache: RepoCache) -> None:
    index = StoreIndex()
    # llama.cpp opens a split GGUF by its first shard and finds the rest
    # beside it, so only first shards become models.
    models = [g for g in sel.ggufs if not (m := _SHARD.search(g)) or m.group(1) == "00001"]
    for gguf in models:
        name = result.reference if len(models) == 1 else \
            f"{result.repo_id}:{Path(gguf).name.removesuffix('.gguf')}"
        local = cache.snapshot(result.commit) / gguf
        index.register_file(
            name, local, source=f"hf:{result.repo_id}@{result.commit[:12]}", owned=True,
            sha256=shas.get(gguf),
            extra={"repo": result.repo_id, "revision": result.revision,
                   "commit": result.commit, "file": gguf, "hf_cache": str(cache.dir)})
        result.registered.append(name)


def pull(model: str, *, revision: str | None = None, include: list[str] | None = None,
         exclude: list[str] | None = None, connections: int = DEFAULT_CONNECTIONS,
         dry_run: bool = False, quiet: bool = False) -> PullResult:
    t0 = time.monotonic()
    ref = parse_reference(model)
    cache = RepoCache(ref.repo_id)
    listing = _cached_listing(cache, ref.repo_id, revision) if remote.offline() \
        else remote.list_repo(ref.repo_id, revision)
    sel = select_files(listing.files, ref.repo_id, tag=ref.tag, file=ref.file,
                       include=include, exclude=exclude)
    result = PullResult(reference=ref.name, repo_id=ref.repo_id, revision=revision or "main",
                        commit=listing.commit, kind=sel.kind, dry_run=dry_run,
                        snapshot=str(cache.snapshot(listing.commit)))
    present = {f.path for f in sel.files if cache.has_file(listing.commit, f.path, f.etag, f.size)}
    for f in sel.files:
        result.files.append(PulledFile(f.path, f.size, f.sha256,
                                       str(cache.snapshot(listing.commit) / f.path),
                                       f.path in present))
    if dry_run:
        return result
    missing = [f for f in sel.files if f.path not in present]
    check_space(cache.dir, sum(f.size - _partial_bytes(cache, f) for f in missing))
    shas: dict[str, str | None] = {f.path: f.sha256 or (f.etag if _HEX.match(f.etag) and
                                                        len(f.etag) == 64 else None)
                                   for f in sel.files}
    with PullProgress(sum(f.size for f in missing), quiet=quiet) as bar:
        for f in missing:
            shas[f.path] = _fetch(cache, ref.repo_id, listing.commit, f, connections, bar,
                                  result)
            cache.link(listing.commit, f.path, f.etag)
    cache.write_ref(revision, listing.commit)
    t_reg = time.monotonic()
    _register(result, sel, shas, cache)
    result.register_seconds = round(time.monotonic() - t_reg, 3)
    result.transfer_seconds = round(result.transfer_seconds, 3)
    result.seconds = round(time.monotonic() - t0, 3)
    return result


def _partial_bytes(cache: RepoCache, f: RemoteFile) -> int:
    parts = Parts._load(cache.partial(f.etag), f.etag, f.size)
    return parts.bytes_done if parts else 0
