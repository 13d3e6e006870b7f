"""Run `llmctl serve MODEL` on a free loopback port for the length of a
benchmark, so `llmctl bench MODEL` measures exactly what users would serve."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import httpx

from llmctl.errors import ServeFailed

STARTUP_TIMEOUT_S = float(os.environ.get("LLMCTL_BENCH_STARTUP_TIMEOUT", "300"))


def free_port() -> int:
    # The port is free when we close it; serve binds it a moment later. The
    # race is harmless on a loopback interface nobody else is scanning.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as f:
            text = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _wait_healthy(proc: subprocess.Popen, url: str, log: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServeFailed(f"`llmctl serve` exited with code {proc.returncode}: {_tail(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise ServeFailed(f"`llmctl serve` was not healthy after {timeout:.0f}s: {_tail(log)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def serve(model: str, timeout: float = STARTUP_TIMEOUT_S) -> Iterator[str]:
    """Yield the base URL (http://127.0.0.1:PORT) of a healthy server."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "llmctl", "serve", model, "--port", str(port)]
    with tempfile.NamedTemporaryFile("w+", prefix="llmctl-bench-serve-", suffix=".log",
                                     delete=False) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        _wait_healthy(proc, url, log.name, timeout)
        yield url
    finally:
        _stop(proc)
        with contextlib.suppress(OSError):
            os.unlink(log.name)
