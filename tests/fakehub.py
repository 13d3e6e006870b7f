"""A loopback stand-in for the Hugging Face Hub: the small part of its API
that huggingface_hub and llmctl use, plus knobs for the faults a real
network has (slow streams, dropped connections, bad bytes, auth).

    hub = FakeHub(); hub.add_repo("org/x-GGUF", {"x-Q4_K_M.gguf": data}); hub.start()
    os.environ["HF_ENDPOINT"] = hub.url
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_SHA_CACHE: dict[int, tuple[str, str]] = {}


def _hashes(data: bytes) -> tuple[str, str]:
    """(sha256, git blob sha1), cached: the same 100 MB file backs many repos."""
    key = id(data)
    if key not in _SHA_CACHE:
        git = hashlib.sha1(f"blob {len(data)}\0".encode())
        git.update(data)
        _SHA_CACHE[key] = (hashlib.sha256(data).hexdigest(), git.hexdigest())
    return _SHA_CACHE[key]


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up is what the fault tests cause on purpose. The
    stock handle_error prints its traceback to sys.stderr, which a CliRunner
    running at that moment captures as the CLI's own output; so a dropped
    connection is ignored here, and anything else is kept for the test."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.errors: list[BaseException] = []

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError):
            self.errors.append(error)


@dataclass
class FakeFile:
    data: bytes
    lfs: bool
    sha256: str
    blob_id: str

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class FakeRepo:
    files: dict[str, FakeFile]
    commit: str
    private: bool = False


@dataclass
class Faults:
    rate: float | None = None          # bytes/s per connection, like a CDN's per-stream cap
    cut_after: int | None = None       # drop a response after this many body bytes...
    cuts_left: int | None = None       # ...this many times (None: every time)
    down_after: int | None = None      # after this many body bytes in total, drop everything
    pause_after: int | None = None     # after this many body bytes in total, hold every
                                       # stream until hub.resume is set (hub.paused tells)
    corrupt: set = field(default_factory=set)   # (repo, path) served with one byte flipped


class FakeHub:
    token = "hf_fake_token"

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.faults = Faults()
        self.served: Counter = Counter()      # body bytes per (repo, path)
        self.requests: list[tuple[str, str, str | None]] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        self.paused = threading.Event()    # a stream reached faults.pause_after
        self.resume = threading.Event()
        self.server: _QuietServer | None = None

    # -- set-up -----------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, bytes], *, private: bool = False) -> FakeRepo:
        entries = {}
        for path, data in files.items():
            lfs = len(data) > 100_000 or path.endswith((".gguf", ".safetensors"))
            sha256, sha1 = _hashes(data)
            entries[path] = FakeFile(data, lfs, sha256, sha1)
        commit = hashlib.sha1(repo_id.encode() + b"".join(
            f.etag.encode() for f in entries.values())).hexdigest()
        self.repos[repo_id] = FakeRepo(entries, commit, private)
        return self.repos[repo_id]

    def start(self) -> "FakeHub":
        self.server = _QuietServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.resume.set()   # let held streams end
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            assert not self.server.errors, f"the fake hub failed: {self.server.errors!r}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def reset(self) -> None:
        self.faults = Faults()
        self.paused.clear()
        self.resume.clear()
        self.served.clear()
        self.requests.clear()
        self.max_active = 0

    @property
    def total_served(self) -> int:
        return sum(self.served.values())

    # -- bookkeeping used by the handler -----------------------------------
    def _count(self, key, n: int) -> None:
        with self._lock:
            self.served[key] += n

    def _take_cut(self) -> bool:
        with self._lock:
            f = self.faults
            if f.cuts_left is None:
                return True
            if f.cuts_left > 0:
                f.cuts_left -= 1
                return True
            return False


_API_RE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+)|"
                     r"/tree/(?P<tree>[^/]+)(?:/.*)?)?$")
_RESOLVE_RE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _reply(self, status: int, body: bytes = b"", headers: dict | None = None,
                   ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str, msg: str) -> None:
            self._reply(status, json.dumps({"error": msg}).encode(),
                        {"X-Error-Code": code, "X-Error-Message": msg})

        def _repo(self, repo_id: str, rev: str | None) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            if repo.private and self.headers.get("Authorization") != f"Bearer {hub.token}":
                self._error(401, "GatedRepo", "Access to this repo is restricted. Please log in.")
                return None
            if rev not in (None, "main", repo.commit):
                self._error(404, "RevisionNotFound", "Invalid rev id")
                return None
            return repo

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            if m := _API_RE.match(path):
                return self._api(m)
            if m := _RESOLVE_RE.match(path):
                return self._resolve(m)
            self._error(404, "EntryNotFound", "not found")

        def _api(self, m) -> None:
            repo = self._repo(m["repo"], m["rev"] or m["tree"])
            if repo is None:
                return
            if m["tree"]:
                body = [{"type": "file", "path": p, "size": len(f.data), "oid": f.blob_id,
                         **({"lfs": {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}}
                            if f.lfs else {})} for p, f in repo.files.items()]
            else:
                body = {"id": m["repo"], "modelId": m["repo"], "sha": repo.commit,
                        "private": repo.private, "gated": False, "tags": ["gguf"],
                        "siblings": [{"rfilename": p, "size": len(f.data), "blobId": f.blob_id,
                                      **({"lfs": {"sha256": f.sha256, "size": len(f.data),
                                                  "pointerSize": 134}} if f.lfs else {})}
                                     for p, f in repo.files.items()]}
            self._reply(200, json.dumps(body).encode())

        def _resolve(self, m) -> None:
            repo = self._repo(m["repo"], m["rev"])
            if repo is None:
                return
            f = repo.files.get(m["path"])
            if f is None:
                return self._error(404, "EntryNotFound", "Entry not found")
            size = len(f.data)
            start, end, status = 0, size - 1, 200
            if (rng := self.headers.get("Range")) and (r := _RANGE_RE.match(rng)):
                start = int(r[1])
                end = min(int(r[2]) if r[2] else size - 1, size - 1)
                status = 206
                if start >= size:
                    return self._error(416, "RangeNotSatisfiable", "bad range")
            headers = {"ETag": f'"{f.etag}"', "X-Repo-Commit": repo.commit,
                       "Accept-Ranges": "bytes", "Content-Length": str(end - start + 1)}
            if f.lfs:
                headers.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(size)})
            if status == 206:
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command == "GET":
                self._body(f, (m["repo"], m["path"]), start, end + 1)

        def _body(self, f: FakeFile, key, start: int, end: int) -> None:
            faults = hub.faults
            step = 64 * 1024 if faults.rate else 1 << 20
            bad = len(f.data) // 2 if key in faults.corrupt else -1
            view = memoryview(f.data)
            pos, sent, t0 = start, 0, time.monotonic()
            with hub._lock:
                hub.active += 1
                hub.max_active = max(hub.max_active, hub.active)
            try:
                while pos < end:
                    self._maybe_pause()
                    if self._should_cut(sent):
                        return self._cut()
                    chunk = view[pos:min(end, pos + step)]
                    if pos <= bad < pos + len(chunk):
                        chunk = bytearray(chunk)
                        chunk[bad - pos] ^= 0xFF
                    self.wfile.write(chunk)
                    pos += len(chunk)
                    sent += len(chunk)
                    hub._count(key, len(chunk))
                    if faults.rate:
                        delay = t0 + sent / faults.rate - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            finally:
                with hub._lock:
                    hub.active -= 1

        def _maybe_pause(self) -> None:
            limit = hub.faults.pause_after
            if limit is not None and hub.total_served >= limit:
                hub.paused.set()
                hub.resume.wait()

        def _should_cut(self, sent: int) -> bool:
            f = hub.faults
            if f.down_after is not None and hub.total_served >= f.down_after:
                return True
            return f.cut_after is not None and sent >= f.cut_after and hub._take_cut()

        def _cut(self) -> None:
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    return Handler


# -- what the pull tests share ---------------------------------------------
def use_hub(hub: FakeHub, tmp: Path, monkeypatch) -> Path:
    """Point huggingface_hub and llmctl at `hub` and fresh folders in `tmp`."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp / "hf"))
    monkeypatch.setenv("LLMCTL_HOME", str(tmp / "llmctl"))
    monkeypatch.setenv("LLMCTL_PULL_BACKOFF", "0.02")
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp / "no-token"))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    hub.reset()
    return tmp


def repo_dir(tmp: Path, repo: str) -> Path:
    """The repo's folder in the HF cache that use_hub set up."""
    return tmp / "hf" / "hub" / ("models--" + repo.replace("/", "--"))


def one_line_error(result, code: int, *needles: str) -> str:
    """Assert a CliRunner result failed with `code` and one `error:` line
    holding every needle; return that line."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
