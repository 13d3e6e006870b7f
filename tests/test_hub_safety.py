"""Pull and rm against a hostile or racing world (issue 11): a Hub listing
whose names leave the cache, `rm` of a pulled model, two writers of one ref,
and the temps a killed pull leaves. All against the loopback fake Hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from fakehub import FakeHub, one_line_error, repo_dir, use_hub  # noqa: E402
from llmctl.cli.app import app  # noqa: E402
from llmctl.store.hf_cache import RepoCache  # noqa: E402
from llmctl.store.index import StoreIndex  # noqa: E402

GGUF_REPO = "test/Tiny-GGUF"
GGUF_FILE = "tiny-Q4_K_M.gguf"
ESCAPE = "../../../../escaped"   # from snapshots/<commit>/ or blobs/: above the cache


def tiny_gguf(tmp: Path) -> bytes:
    """A few hundred bytes of valid GGUF, enough for the store to register."""
    path = tmp / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> bytes:
    return tiny_gguf(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="module")
def hub(model):
    hub = FakeHub()
    hub.add_repo(GGUF_REPO, {GGUF_FILE: model})
    hub.add_repo("test/Weights", {"w.bin": os.urandom(2 << 20)})
    hub.add_repo("evil/Names", {f"{ESCAPE}/config.json": b"{}", "model.safetensors": b"w" * 99})
    hub.add_repo("evil/Commit", {GGUF_FILE: model}).commit = ESCAPE
    hub.add_repo("evil/Etag", {GGUF_FILE: model}).files[GGUF_FILE].sha256 = ESCAPE
    hub.add_repo("evil/BlobId", {"notes.txt": b"hi"}).files["notes.txt"].blob_id = ESCAPE
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    return use_hub(hub, tmp_path, monkeypatch)


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("ref", ["evil/Names", "evil/Commit:Q4_K_M", "evil/Etag:Q4_K_M",
                                 "evil/BlobId --include *.txt"])
def test_listing_names_that_leave_the_cache_are_refused(env, ref):
    one_line_error(cli("pull", *ref.split()), 6, "unsafe")
    cache = env / "hf" / "hub"
    outside = [p for p in env.rglob("*") if p != cache.parent and not p.is_relative_to(cache)]
    assert outside == []
    assert not list(env.rglob("*escaped*")) and StoreIndex().list() == []


def test_rm_deletes_the_blob_once_no_snapshot_links_it(env, hub, model):
    assert cli("pull", f"{GGUF_REPO}:Q4_K_M", "--quiet").exit_code == 0
    hub.add_repo(GGUF_REPO, {GGUF_FILE: model, "README.md": b"v2"})   # a new commit
    assert cli("pull", f"{GGUF_REPO}:q4_k_m", "--quiet").exit_code == 0
    blobs = repo_dir(env, GGUF_REPO) / "blobs"
    (blob,) = blobs.iterdir()
    first, second = (Path(StoreIndex().get(n).path) for n in
                     (f"{GGUF_REPO}:Q4_K_M", f"{GGUF_REPO}:q4_k_m"))
    assert first.parent != second.parent and first.resolve() == second.resolve() == blob

    r = cli("rm", f"{GGUF_REPO}:Q4_K_M", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["deleted_file"], r.output
    assert not first.parent.exists()          # its link and its snapshot folder
    assert blob.read_bytes() == model         # the other snapshot still links it

    assert cli("rm", f"{GGUF_REPO}:q4_k_m").exit_code == 0
    assert not repo_dir(env, GGUF_REPO).exists()   # blob, links, ref, folders: all gone


def test_rm_never_follows_a_link_out_of_the_cache(env):
    victim = env / "victim.gguf"
    victim.write_bytes(b"not the store's")
    assert cli("pull", f"{GGUF_REPO}:Q4_K_M", "--quiet").exit_code == 0
    link = Path(StoreIndex().get(f"{GGUF_REPO}:Q4_K_M").path)
    link.unlink()
    link.symlink_to(victim)                   # a tampered cache
    assert cli("rm", f"{GGUF_REPO}:Q4_K_M").exit_code == 0
    assert victim.read_bytes() == b"not the store's" and not link.is_symlink()

    assert cli("pull", f"{GGUF_REPO}:Q4_K_M", "--quiet").exit_code == 0
    snap = Path(StoreIndex().get(f"{GGUF_REPO}:Q4_K_M").path).parent
    outside = env / "elsewhere"
    outside.mkdir()
    (outside / GGUF_FILE).write_bytes(b"keep me")
    for p in snap.iterdir():
        p.unlink()
    snap.rmdir()
    snap.symlink_to(outside)                  # the snapshot folder itself leads out
    one_line_error(cli("rm", f"{GGUF_REPO}:Q4_K_M"), 6, "leaves")
    assert (outside / GGUF_FILE).read_bytes() == b"keep me"


def test_two_writers_of_one_ref_do_not_collide(tmp_path, monkeypatch):
    cache = RepoCache("org/repo", root=tmp_path)
    ours, theirs = "a" * 40, "b" * 40
    real_replace = os.replace

    def rename_after_another_pull(src, dst):
        # Another pull of the repo writes the same ref between our write and
        # our rename: with one shared temp name, our temp is gone by now.
        monkeypatch.setattr(os, "replace", real_replace)
        cache.write_ref("main", theirs)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", rename_after_another_pull)
    cache.write_ref("main", ours)
    assert cache.resolve_commit("main") == ours
    assert [p.name for p in (cache.dir / "refs").iterdir()] == ["main"]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_pull_cleans_dead_temps_and_keeps_what_resumes(env, hub, monkeypatch):
    monkeypatch.setenv("LLMCTL_PULL_RETRIES", "1")
    hub.faults.down_after = 300_000   # the first 1 MiB part lands, the second never
    args = ("pull", "test/Weights", "--include", "*.bin", "--connections", "1", "--quiet")
    one_line_error(cli(*args), 5, "resume")
    blobs = repo_dir(env, "test/Weights") / "blobs"
    (sidecar,) = blobs.glob("*.llmctl-partial.json")
    kept = json.loads(sidecar.read_text())["done"]
    assert sum(kept) > 0

    commit = hub.repos["test/Weights"].commit
    snap = repo_dir(env, "test/Weights") / "snapshots" / commit
    snap.mkdir(parents=True)
    pid, old = dead_pid(), time.time() - 3600
    stale = [blobs / f".{sidecar.name}.{pid}.0123abcd.tmp", snap / f".w.bin.{pid}.89abcdef.tmp"]
    for p in stale:
        p.write_bytes(b"left by a killed pull")
        os.utime(p, (old, old))

    hub.faults.down_after = 0         # this pull fails too, after its clean-up
    one_line_error(cli(*args), 5, "resume")
    assert not any(p.exists() for p in stale)
    assert json.loads(sidecar.read_text())["done"] == kept   # resumable data stays
    assert (blobs / sidecar.name.removesuffix(".json")).stat().st_size == 2 << 20

    hub.faults.down_after = None
    before = hub.total_served
    assert cli(*args).exit_code == 0
    assert hub.total_served - before == (2 << 20) - sum(kept)
