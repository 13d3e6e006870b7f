"""Parallel HTTP range downloads that resume.

hf_transfer cannot fetch a sub-range of a file nor report which chunks have
landed (and it deletes the file on error), so it cannot resume; this engine
runs one persistent connection per worker thread instead, each fetching whole
parts front to back and recording its progress in `Parts`."""

from __future__ import annotations

import http.client
import os
import queue
import random
import ssl
import threading
import time
from typing import Callable
from urllib.parse import urlsplit

from llmctl.errors import HubError
from llmctl.hub.part_ledger import Parts
from llmctl.settings import Settings

BUF = 256 * 1024     # small reads: Ctrl-C stops a throttled stream promptly


class _Retry(Exception):
    """A transient failure: reconnect, back off, try the part again."""


class _Stopped(Exception):
    pass


def _connect(url: str, timeout: float) -> http.client.HTTPConnection:
    u = urlsplit(url)
    if u.hostname is None:
        raise HubError(f"cannot download {url!r}: the URL names no host")
    if u.scheme == "https":
        return http.client.HTTPSConnection(u.hostname, u.port, timeout=timeout,
                                           context=ssl.create_default_context())
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


class RangeDownload:
    """One file fetched in parts over parallel ranged connections, resumable
    through `parts`. run() raises HubError when a part fails past its retries or the
    server ignores ranges, and the first other error a connection hits."""

    def __init__(self, url: str, headers: dict[str, str], parts: Parts, connections: int,
                 on_bytes: Callable[[int], None] = lambda n: None,
                 patience: Settings | None = None):
        self.url, self.headers, self.parts = url, headers, parts
        self.connections = max(1, connections)
        self.on_bytes = on_bytes
        patience = patience or Settings()       # pull_retries, _backoff_s, _timeout_s
        self.retries = patience.pull_retries
        self.backoff = patience.pull_backoff_s
        self.timeout = patience.pull_timeout_s
        self.stop = threading.Event()
        self.error: BaseException | None = None
        u = urlsplit(url)
        self.target = u.path + (f"?{u.query}" if u.query else "")

    def run(self) -> None:
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(self.parts.count):
            if self.parts.remaining(i) > 0:
                todo.put(i)
        workers = [threading.Thread(target=self._worker, args=(todo,), daemon=True)
                   for _ in range(min(self.connections, self.parts.count))]
        for w in workers:
            w.start()
        try:
            saved = time.monotonic()
            while any(w.is_alive() for w in workers):
                workers[0].join(0.1)
                if time.monotonic() - saved > 0.5:   # what a kill -9 keeps
                    self.parts.save()
                    saved = time.monotonic()
        except BaseException:   # Ctrl-C: stop the workers, keep what arrived
            self.stop.set()
            for w in workers:
                w.join(self.timeout)
            raise
        finally:
            self.parts.save()
        if self.error is not None:
            raise self.error

    def _worker(self, todo: queue.SimpleQueue) -> None:
        conn = _connect(self.url, self.timeout)
        fd = os.open(self.parts.data, os.O_WRONLY)
        buf = bytearray(BUF)
        try:
            while not self.stop.is_set():
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                conn = self._part_with_retries(conn, fd, buf, i)
        except _Stopped:
            pass
        except BaseException as e:   # fail the whole file; the others stop too
            self.error = self.error or e
            self.stop.set()
        finally:
            os.close(fd)
            conn.close()

    def _part_with_retries(self, conn, fd: int, buf: bytearray, i: int):
        failures = 0
        while self.parts.remaining(i) > 0:
            before = self.parts.done[i]
            try:
                self._fetch(conn, fd, buf, i)
            except (_Retry, OSError, http.client.HTTPException) as e:
                conn.close()
                conn = _connect(self.url, self.timeout)
                failures = 1 if self.parts.done[i] > before else failures + 1
                if failures > self.retries:
                    kept = self.parts.bytes_done / 1e6
                    raise HubError(f"download failed after {self.retries} retries ({e}); "
                                   f"{kept:.1f} MB kept, run the same pull again to "
                                   "resume") from e
                delay = self.backoff * 2 ** (failures - 1) * (1 + random.random() / 4)
                if self.stop.wait(delay):
                    raise _Stopped() from None
        return conn

    def _fetch(self, conn, fd: int, buf: bytearray, i: int) -> None:
        start, end = self.parts.span(i)
        offset = start + self.parts.done[i]
        conn.request("GET", self.target, headers={
            **self.headers, "Range": f"bytes={offset}-{end - 1}",
            "Accept-Encoding": "identity"})
        resp = conn.getresponse()
        if resp.status == 200 and (offset, end) != (0, self.parts.size):
            raise HubError("the server ignores HTTP range requests; cannot download in parts")
        if resp.status in (429, 500, 502, 503, 504):
            resp.read()
            raise _Retry(f"HTTP {resp.status}")
        if resp.status not in (200, 206):
            raise HubError(f"download of {self.url} failed: HTTP {resp.status} {resp.reason}")
        view = memoryview(buf)
        while offset < end:
            if self.stop.is_set():
                raise _Stopped()
            n = resp.readinto(view[:min(BUF, end - offset)])
            if not n:
                raise _Retry(f"connection closed at byte {offset}")
            os.pwrite(fd, view[:n], offset)
            offset += n
            self.parts.advance(i, n)
            self.on_bytes(n)
