"""One harness for every HTTP server we start on a loopback port: `llmctl
bench MODEL`, the benchmark scripts and the tests all launch `llmctl serve`,
llama-server or a stub through `Server`, wait for it to be ready and stop it
the same way."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import httpx

from llmctl.errors import ServeFailed, UsageError
from llmctl.settings import Settings

STOP_GRACE_S = 20.0
POLL_S = 0.2


def variant(spec: str) -> tuple[str, list[str]]:
    """A benchmark arm given as NAME='FLAGS': its label and argv words.
    Raises ValueError for unbalanced quotes in FLAGS."""
    label, _, flags = spec.partition("=")
    return label, shlex.split(flags)


def source_tree(spec: str) -> tuple[str, Path]:
    """A benchmark arm given as NAME=DIR, a source tree to run llmctl from
    (Server.llmctl_serve's `tree`): its label and folder. Raises UsageError
    when DIR holds no llmctl package, where the run would quietly measure
    the installed one instead."""
    label, _, tree = spec.partition("=")
    if not (Path(tree) / "llmctl" / "__init__.py").is_file():
        raise UsageError(f"--tree {spec}: no llmctl package there")
    return label, Path(tree)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at this moment."""
    # The port is free when we close it; the server binds it a moment later.
    # The race is harmless on a loopback interface nobody else is scanning.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(*paths: str) -> Callable[[str], bool]:
    """A ready predicate: true once any of PATHS under the base URL answers
    200. Servers differ: llama-server has /health, llama-cpp-python's only
    /v1/models."""
    def ready(url: str) -> bool:
        for path in paths:
            try:
                if httpx.get(url + path, timeout=2.0).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
        return False
    return ready


class Server:
    """ARGV plus `--port PORT` (a free loopback port), its output in a
    temporary log.

    `start()` spawns it; `wait_ready()` polls READY(url) and raises
    ServeFailed, with the log's last lines, when the process exits first or is
    not ready in time; `stop()` sends SIGTERM (uvicorn and llama-server shut
    down gracefully on it, as on Ctrl-C, and unlike SIGINT a background job
    cannot have inherited it ignored) and kills it after a grace period. As a
    context manager it does all three and yields itself; `url` is
    http://127.0.0.1:PORT. With OWN_SESSION it runs in a session of its own,
    so a Ctrl-C at the terminal (meant for the program in front) never
    reaches it: only stop() ends it.
    """

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 ready: Callable[[str], bool] = http_ok("/health"), name: str | None = None,
                 startup_timeout: float | None = None, own_session: bool = False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [*argv, "--port", str(self.port)]
        self.name = name or Path(argv[0]).name
        # None: the settings' bench_startup_timeout_s (the harness's start-up).
        self.startup_timeout = (Settings.load().bench_startup_timeout_s if startup_timeout is None
                                else startup_timeout)
        self._env = {**os.environ, **(env or {})}
        self._ready = ready
        self._own_session = own_session
        self._proc: subprocess.Popen | None = None
        self._log: Path | None = None

    @classmethod
    def llmctl_serve(cls, *args: str, tree: Path | None = None,
                     env: Mapping[str, str] | None = None, **kwargs) -> "Server":
        """`llmctl serve ARGS` from the llmctl this interpreter imports, or
        with TREE from the llmctl package in that source tree (to measure a
        change against its parent side by side)."""
        if tree is None:
            return cls([sys.executable, "-m", "llmctl", "serve", *args], name="llmctl serve",
                       env=env, **kwargs)
        # -P keeps the working directory (maybe this checkout) off the path, and
        # PYTHONPATH comes before the editable install: that tree's llmctl runs.
        return cls([sys.executable, "-P", "-m", "llmctl", "serve", *args], name="llmctl serve",
                   env={**(env or {}), "PYTHONPATH": str(tree.resolve())}, **kwargs)

    @property
    def returncode(self) -> int | None:
        """The exit status, or None while it runs (or before start)."""
        return self._proc.poll() if self._proc else None

    def start(self) -> "Server":
        """Spawn the process; OSError if ARGV cannot be run."""
        fd, log = tempfile.mkstemp(prefix=f"llmctl-{self.name.replace(' ', '-')}-",
                                   suffix=".log")
        self._log = Path(log)
        with os.fdopen(fd, "w") as out:
            self._proc = subprocess.Popen(self.argv, env=self._env, stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=self._own_session)
        return self

    def wait_ready(self, timeout: float | None = None) -> "Server":
        """Return once ready; ServeFailed if it exits or is not ready within
        TIMEOUT seconds (default: startup_timeout)."""
        timeout = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            if self.returncode is not None:
                raise ServeFailed(f"`{self.name}` exited with code {self.returncode}: "
                                  f"{self.log_tail()}")
            if self._ready(self.url):
                return self
            if time.monotonic() > deadline:
                raise ServeFailed(f"`{self.name}` was not ready after {timeout:.0f}s: "
                                  f"{self.log_tail()}")
            time.sleep(POLL_S)

    def rss(self) -> int:
        """The server process's resident memory in bytes. Raises
        RuntimeError before start() or after it exited."""
        import psutil

        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"`{self.name}` is not running")
        return psutil.Process(self._proc.pid).memory_info().rss

    def log_tail(self, lines: int = 5) -> str:
        """The last non-blank lines of the output, joined with ' | '."""
        try:
            text = self._log.read_text(errors="replace") if self._log else ""
        except OSError:
            return ""
        return " | ".join([ln.strip() for ln in text.splitlines() if ln.strip()][-lines:])

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Terminate, wait up to GRACE seconds, then kill; remove the log."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> "Server":
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
