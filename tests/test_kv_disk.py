"""The disk prefix store on its own, with small synthetic states (no model):
bad files of every kind are dropped without an exception, aliases and
symlinks never lead outside the cache, other users' files are left alone,
writes are durable and close() writes what is queued."""

from __future__ import annotations

import json
import logging
import os
import random
import stat
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest

from llmctl.runtime.prefix_cache import disk as kv_disk
from llmctl.runtime.prefix_cache.disk import BLOCK, DiskStore, block_chain

IDENTITY = {"model": "tiny", "sha256": "ab" * 32, "n_ctx_seq": 1024, "format": 1}
PROMPT = list(range(1000, 1600))        # two whole blocks and a tail
ASK = PROMPT + [7, 8, 9]                # a later request that starts with PROMPT
BLOB = bytes(range(256)) * 8


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "cache" / "prefix"


@pytest.fixture
def store(root):
    s = DiskStore(root, IDENTITY, budget_bytes=1 << 30)
    yield s
    s.close()


def chain_of(store: DiskStore, tokens: list[int]) -> list[str]:
    return block_chain(store.ns, tokens, len(tokens) // BLOCK)


def saved(store: DiskStore, tokens: list[int] = PROMPT, blob: bytes = BLOB) -> Path:
    assert store.save(tokens, blob)
    store.flush()
    path = store.dir / f"{chain_of(store, tokens)[-1]}.kv"
    assert path.is_file()
    return path


def header_for(store: DiskStore, tokens: list[int] = PROMPT) -> dict:
    return {"ns": store.ns, "n_tokens": len(tokens), "tokens": tokens,
            "chain": chain_of(store, tokens), "created": 1.0}


def state_file(header, payload: bytes = BLOB) -> bytes:
    """A state file whose checksums hold, whatever the header says."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return kv_disk.state_prefix(raw, payload) + raw + payload


def test_saved_state_is_found_again_by_a_new_store(store, root):
    saved(store)
    store.close()
    again = DiskStore(root, IDENTITY, budget_bytes=1 << 30)
    try:
        hit = again.lookup(ASK)
        assert hit is not None and hit.n == len(PROMPT) and again.load(hit) == BLOB
        # A prompt sharing only the first block finds the state through its alias.
        first = again.lookup(PROMPT[:300] + [5] * 300)
        assert first is not None and first.n == 300 and first.path == hit.path
    finally:
        again.close()


@pytest.mark.parametrize("change", [
    {"chain": 5}, {"chain": [5]}, {"tokens": "abc"}, {"tokens": [1, "x"]}, {"tokens": None},
    {"ns": 7}, {"n_tokens": "600"}, {"n_tokens": None}, "not a dict", "list",
])
def test_header_of_the_wrong_shape_is_dropped_not_raised(store, root, change):
    path = saved(store)
    header = header_for(store)
    if change == "not a dict":
        header = "a string"
    elif change == "list":
        header = [header]
    else:
        header.update(change)
    path.write_bytes(state_file(header))
    assert kv_disk.read_header(path) is None
    assert [row["entries"] for row in kv_disk.list_entries(root)] == [1]
    assert store.lookup(ASK) is None
    assert not path.exists()        # dropped: the next request does not hit it again


def _reset(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif os.path.lexists(path):
        path.unlink()


JUNK = [5, -1, 2 ** 70, 1.5, "x", "", None, True, [], {}, [1, "a"], [[1]], ["a"], [True],
        {"a": 1}, "0" * 32]


def _mutate(rng: random.Random, base: bytes, header: dict) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:                                   # flipped bytes anywhere
        data = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] ^= rng.randint(1, 255)
        return bytes(data)
    if kind == 1:                                   # torn write
        return base[:rng.randrange(len(base))]
    if kind == 2:                                   # padding or plain garbage
        tail = rng.randbytes(rng.randint(1, 64))
        return base + tail if rng.random() < 0.5 else tail
    if kind == 3:                                   # a field of the wrong type, checksums right
        h = dict(header)
        field = rng.choice(["ns", "n_tokens", "tokens", "chain", "created"])
        if rng.random() < 0.2:
            del h[field]
        else:
            h[field] = rng.choice(JUNK + [[rng.randint(-5, 5)] * rng.randint(0, 9)])
        return state_file(h)
    if kind == 4:                                   # right types, wrong values
        h = dict(header, tokens=[rng.randint(0, 2000) for _ in range(rng.randint(0, 700))],
                 chain=[rng.randbytes(16).hex() for _ in range(rng.randint(0, 3))])
        return state_file(h)
    raw = rng.choice([b"[" * 100000, b"\xff\xfe\x00", b'{"ns":', b"null", b"", rng.randbytes(40),
                      json.dumps(rng.choice(JUNK)).encode()])
    return state_file(raw)                          # a header that is not a JSON object


def test_fuzzed_states_and_aliases_never_raise(store, root, tmp_path):
    saved(store)
    chain = chain_of(store, PROMPT)
    header, base = header_for(store), state_file(header_for(store))
    kv, ref = store.dir / f"{chain[1]}.kv", store.dir / f"{chain[0]}.ref"
    outside = root.parent / "outside.kv"
    outside.write_bytes(base)
    rng = random.Random(20240611)
    hits = 0
    for i in range(2000):
        for p in (kv, ref):
            _reset(p)
        if rng.random() < 0.8:
            kv.write_bytes(_mutate(rng, base, header))
        else:                                       # only an alias, or something odd
            choice = rng.randrange(5)
            if choice == 0:
                os.mkdir(kv)
            elif choice == 1:
                kv.symlink_to(outside)
            elif choice == 2:
                os.mkfifo(kv)
            ref.write_bytes(rng.choice([b"../../outside", str(outside)[:-3].encode(),
                                        chain[1].encode(), chain[1][:-1].encode(),
                                        chain[1].upper().encode(), rng.randbytes(20)]))
        hit = store.lookup(ASK)
        if hit is not None:
            hits += 1
            assert 0 < hit.n < len(ASK)
            assert store.load(hit) in (None, BLOB)
        if i % 100 == 0:
            assert len(kv_disk.list_entries(root)) == 1
    assert hits > 0 and outside.read_bytes() == base


@pytest.mark.parametrize("target", ["../../x", "ABS", "../x/../../x", "A" * 32, "0" * 31])
def test_alias_to_anything_but_a_state_name_is_ignored_and_dropped(store, root, target):
    saved(store)
    chain = chain_of(store, PROMPT)
    (store.dir / f"{chain[1]}.kv").unlink()     # leave the first block's alias only
    victim = root.parent / "x.kv"               # where ../../x points from the namespace
    victim.write_bytes(b"not a state")
    if target == "ABS":
        target = str(victim)[:-3]
    if target[0] in "A0":                       # a lookalike name of a file that exists
        (store.dir / f"{target}.kv").write_bytes(state_file(header_for(store)))
    ref = store.dir / f"{chain[0]}.ref"
    ref.write_text(target)
    assert store.lookup(ASK) is None
    assert not ref.exists() and victim.read_bytes() == b"not a state"


def test_clear_and_eviction_never_follow_a_symlinked_namespace(store, root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "meta.json").write_text(json.dumps(IDENTITY))
    precious = elsewhere / ("f" * 32 + ".kv")
    precious.write_bytes(b"x" * (1 << 20))
    os.utime(precious, (1, 1))                  # the least recently used "state" of all
    own = saved(store)
    (root / "linked").symlink_to(elsewhere)
    (store.dir / ("e" * 32 + ".kv")).symlink_to(precious)
    store.budget = 2 * own.stat().st_size       # room for both real states, not for the link's
    saved(store, list(range(2000, 2300)))
    assert precious.exists() and own.exists()
    assert [row["path"] for row in kv_disk.list_entries(root)] == [str(store.dir)]
    removed = kv_disk.clear(root)
    assert [row["entries"] for row in removed] == [2]
    assert not store.dir.exists() and precious.exists() and (elsewhere / "meta.json").exists()


def test_cache_folders_are_owner_only(store, root):
    saved(store)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.dir.stat().st_mode) == 0o700
    os.chmod(store.dir, 0o755)                  # made by an older version, or by hand
    saved(store, list(range(3000, 3300)))
    assert stat.S_IMODE(store.dir.stat().st_mode) == 0o700


def test_other_users_files_are_neither_read_nor_deleted(store, root, monkeypatch, caplog):
    good = saved(store)
    bad = store.dir / f"{chain_of(store, [9] * 300)[-1]}.kv"
    bad.write_bytes(b"garbage")
    monkeypatch.setattr(os, "getuid", lambda: 4242)     # everything here is root's
    assert store.lookup(ASK) is None and store.lookup([9] * 300 + [1]) is None
    assert bad.read_bytes() == b"garbage" and kv_disk.read_header(good) is None
    assert kv_disk.list_entries(root) == [] and kv_disk.clear(root) == []
    with caplog.at_level(logging.WARNING, logger="llmctl.prefix_cache"):
        assert store.save(list(range(4000, 4300)), BLOB)
        store.flush()
    assert sorted(p.name for p in store.dir.iterdir()) == sorted(
        [good.name, bad.name, "meta.json", f"{chain_of(store, PROMPT)[0]}.ref"])
    assert any("cannot write" in r.getMessage() for r in caplog.records)


def test_header_checksum_is_checked_before_the_header_is_parsed(store, monkeypatch):
    path = saved(store)
    data = path.read_bytes()
    at = data.index(b'"created": ') + len(b'"created": ')
    digit = b"1" if data[at:at + 1] != b"1" else b"2"
    path.write_bytes(data[:at] + digit + data[at + 1:])     # still valid JSON
    parsed = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda *a, **k: parsed.append(a) or real_loads(*a, **k))
    assert store.lookup(ASK) is None and not path.exists() and parsed == []


def test_format_1_file_counts_as_foreign(store):
    path = saved(store)
    raw = json.dumps(header_for(store)).encode()
    old = struct.pack("<8sIIIQ", b"LLMCTLKV", 1, len(raw), zlib.crc32(BLOB, zlib.crc32(raw)),
                      len(BLOB))
    path.write_bytes(old + raw + BLOB)
    assert store.lookup(ASK) is None and not path.exists()
    saved(store)                                # and the cold prefill's state replaces it
    assert store.load(store.lookup(ASK)) == BLOB


def test_writes_are_fsynced(store, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    saved(store)
    # meta.json, the state and its alias, each file and the folder's rename
    assert len(synced) >= 6


def test_only_dead_writers_temp_files_are_cleaned(store):
    path = saved(store)
    done = subprocess.Popen(["true"])
    done.wait()
    dead = path.with_name(f".{path.name}.{done.pid}.deadbeef.tmp")
    live = path.with_name(f".{path.name}.{os.getpid()}.cafebabe.tmp")
    hours_ago = time.time() - 7200
    for tmp in (dead, live):
        tmp.write_bytes(b"half a state")
        os.utime(tmp, (hours_ago, hours_ago))
    saved(store, list(range(5000, 5300)))
    assert not dead.exists() and live.exists()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
def test_the_writer_yields_the_cores_to_the_engine(store):
    assert store._thread.native_id is not None
    # The policy is set as the thread starts; a queued write waits behind it.
    store.save(PROMPT, BLOB)
    store.flush()
    assert os.sched_getscheduler(store._thread.native_id) == os.SCHED_IDLE


def test_close_writes_everything_queued(root):
    store = DiskStore(root, IDENTITY, budget_bytes=1 << 30, max_pending=16)
    prompts = [list(range(n, n + 300)) for n in range(0, 8000, 1000)]
    assert all(store.save(p, BLOB * 64) for p in prompts)
    store.close()
    for p in prompts:
        assert (store.dir / f"{chain_of(store, p)[-1]}.kv").is_file()
    assert not store.save(list(range(9000, 9300)), BLOB)    # nothing queued behind the stop
    store.close()                                            # a second close returns at once
