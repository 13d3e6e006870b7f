"""Test helpers for oversized uploads: a raw-socket client that keeps
sending a huge body while it waits for the server's answer, and a sampler
of other processes' peak RSS meanwhile."""

from __future__ import annotations

import json
import socket
import threading
import time

import psutil

BLOCK = 256 << 10


def upload(port: int, path: str, total: int, chunked: bool, headers: dict,
           timeout: float = 120) -> tuple[int | None, dict | None, int]:
    """POST `total` bytes of spaces to 127.0.0.1:`port`, by Content-Length
    or in chunks, as fast as the server takes them, while reading its
    answer. Returns (status, JSON body, bytes sent when the answer came);
    the status is None if the connection ended with no answer."""
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
            *(f"{k}: {v}" for k, v in headers.items()),
            "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"]
    block = (b"%x\r\n" % BLOCK + b" " * BLOCK + b"\r\n") if chunked else b" " * BLOCK
    sent, answered = [0], threading.Event()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())

        def pump() -> None:
            try:
                while sent[0] < total and not answered.is_set():
                    sock.sendall(block)
                    sent[0] += BLOCK
            except OSError:
                pass    # the server closed the connection: it stopped reading

        sender = threading.Thread(target=pump, daemon=True)
        sender.start()
        data = b""
        try:
            while not _complete(data):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        at_answer = sent[0]
        answered.set()
        sender.join(timeout)
    if not data.startswith(b"HTTP/1.1 "):
        return None, None, at_answer
    headers_raw, _, body = data.partition(b"\r\n\r\n")
    return int(headers_raw.split()[1]), json.loads(body) if body else None, at_answer


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


class PeakRss:
    """The highest RSS each process reached while the block ran, sampled
    every 10 ms by a thread, and its RSS at the start."""

    def __init__(self, pids: list[int]):
        self.procs = [psutil.Process(pid) for pid in pids]
        self.start = {p.pid: p.memory_info().rss for p in self.procs}
        self.peak = dict(self.start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def growth(self) -> dict[int, int]:
        """Peak minus start, in bytes, per pid."""
        return {pid: self.peak[pid] - self.start[pid] for pid in self.start}

    def _sample(self) -> None:
        while not self._stop.is_set():
            for p in self.procs:
                self.peak[p.pid] = max(self.peak[p.pid], p.memory_info().rss)
            time.sleep(0.01)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.5)     # a buffer still growing after the answer counts too
        self._stop.set()
        self._thread.join()


def ray_processes(*titles: str) -> dict[str, int]:
    """This process's descendants (a local Ray cluster it started) whose
    process title starts with each of `titles`, by title. Raises
    AssertionError unless each title names exactly one process."""
    found: dict[str, list[int]] = {t: [] for t in titles}
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        for t in titles:
            if cmd and cmd[0].startswith(t):
                found[t].append(p.pid)
    assert all(len(pids) == 1 for pids in found.values()), found
    return {t: pids[0] for t, pids in found.items()}
