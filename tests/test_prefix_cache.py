"""The prompt-prefix KV cache: scheduler decisions without a model, then the
real default model for identical greedy output on memory and disk hits, and
the fault cases (each request must still succeed, with a cold prefill)."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from near_tie import assert_completions_agree, assert_greedy_agree
from plans import run_plan

from conftest import ServerProcess, smollm2_file
from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.llama.exactness import measure_rows
from llmctl.runtime.prefix_cache import disk as kv_disk
from llmctl.runtime.prefix_cache.rule import usable_prefix
from llmctl.runtime.sampling import SamplingParams

# ---- scheduler decisions, no model ----------------------------------------------


def seq(prompt: list[int]) -> Sequence:
    return Sequence(prompt=list(prompt), params=SamplingParams(), max_new=4)


def sharing(n_slots: int = 4, budget: int = 64) -> Scheduler:
    """Sharing without the flash-attention tile rule (test_flash_exact.py has it)."""
    return Scheduler(SchedulerConfig(n_slots, budget, prefix_sharing=True, min_share=4, tile=1))


def compute(s: Scheduler, rounds: int = 1) -> None:
    for _ in range(rounds):
        run_plan(s, s.schedule(), 999)


def test_usable_prefix_leaves_the_last_prompt_token():
    assert usable_prefix([1, 2, 3, 4], [1, 2, 3, 4]) == 3
    assert usable_prefix([1, 2, 9, 4], [1, 2, 3, 4, 5]) == 2
    assert usable_prefix(list(range(1000)), list(range(700)) + [0] * 50) == 700
    assert usable_prefix([], [1, 2]) == 0 and usable_prefix([1], [1]) == 0


def test_finished_slot_is_parked_and_reused_in_place():
    s = sharing(n_slots=2)
    a = seq(range(10))
    s.add(a)
    s.admit()
    compute(s)
    s.finish(a, "stop", park=a.tokens[:a.n_computed])
    assert s.parked_slots() == {a.slot: list(range(10))} and not s.is_free(a.slot)
    b = seq(list(range(8)) + [50, 51])
    s.add(b)
    s.admit()
    assert b.slot == a.slot and b.kv_src == (a.slot, 8) and b.wait_for is None


def test_parked_slots_are_evicted_least_recently_used():
    s = sharing(n_slots=2)
    a, b = seq(range(10)), seq(range(100, 110))
    for x in (a, b):
        s.add(x)
    s.admit()
    compute(s)
    s.finish(a, "stop", park=a.tokens[:a.n_computed])
    s.finish(b, "stop", park=b.tokens[:b.n_computed])
    c = seq(range(200, 210))        # matches nothing: takes the oldest parked slot
    s.add(c)
    s.admit()
    assert c.slot == a.slot and c.kv_src == (a.slot, 0)
    assert list(s.parked_slots()) == [b.slot]


def test_followers_wait_for_a_prefilling_leader_then_copy():
    s = sharing(n_slots=4, budget=16)
    shared = list(range(1, 41))
    lead, f1, f2 = seq(shared + [41, 42]), seq(shared + [77]), seq(shared + [88, 89])
    for x in (lead, f1, f2):
        s.add(x)
    s.admit()
    assert f1.wait_for is lead and f1.wait_until == 40 and f2.wait_for is lead
    plan = s.schedule()
    assert [w.seq for w in plan] == [lead]      # followers compute nothing meanwhile
    compute(s, rounds=2)                        # the leader has 32 of 40 shared tokens
    assert s.release_waiters() == []
    compute(s)
    ready = s.release_waiters()
    assert ready == [f1, f2]
    assert f1.kv_src == (lead.slot, 40) and f2.kv_src == (lead.slot, 40)


def test_waiters_are_released_when_the_leader_goes_away():
    s = sharing(budget=16)
    shared = list(range(1, 41))
    lead, f = seq(shared + [1]), seq(shared + [2])
    for x in (lead, f):
        s.add(x)
    s.admit()
    compute(s)                                  # the leader computed 16 tokens, then is cancelled
    s.finish(lead, "cancelled", park=lead.tokens[:lead.n_computed])
    ready = s.release_waiters()
    assert ready == [f] and f.wait_for is None
    assert f.kv_src == (lead.slot, 16)          # copies what the parked slot holds


def test_short_shared_prefix_is_not_worth_waiting_for():
    s = sharing()
    lead, f = seq([1, 2, 3] + list(range(10, 30))), seq([1, 2, 3] + list(range(50, 70)))
    for x in (lead, f):
        s.add(x)
    s.admit()
    assert f.wait_for is None and f.kv_src == (f.slot, 0)


def test_waiter_is_not_parked_and_sharing_off_changes_nothing():
    s = Scheduler(SchedulerConfig(2, 64))
    a, b = seq(range(1, 41)), seq(range(1, 41))
    for x in (a, b):
        s.add(x)
    s.admit()
    assert b.wait_for is None and b.kv_src == (b.slot, 0) and not s.should_park(a)
    s2 = sharing()
    c, d = seq(range(1, 41)), seq(range(1, 41))
    for x in (c, d):
        s2.add(x)
    s2.admit()
    assert d.wait_for is c and not s2.should_park(d)
    s2.finish(d, "cancelled", park=None)
    assert d.status is Status.FINISHED and s2.is_free(d.slot)


def test_block_chain_depends_on_namespace_and_every_earlier_token():
    toks = list(range(600))
    a = kv_disk.block_chain("ns1", toks, 2)
    assert len(a) == 2 and a != kv_disk.block_chain("ns2", toks, 2)
    changed = kv_disk.block_chain("ns1", [7] + toks[1:], 2)
    assert changed[0] != a[0] and changed[1] != a[1]
    assert kv_disk.block_chain("ns1", toks[:256] + [5] * 256, 2)[0] == a[0]


# ---- the real model ---------------------------------------------------------------

SHARED = " ".join(f"Note {i}: the lighthouse keeper counted {i * 7} boats." for i in range(26))
# Logprobs to tell a rounding flip at a near-tie from a wrong answer.
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=5)
SUFFIXES = [" What did the keeper count?", " Summarise the notes.", " How many notes are there?"]


def load(home: Path, **opts):
    os.environ["LLMCTL_HOME"] = str(home)
    from llmctl.runtime.llm import LLM, LoadOptions
    from llmctl.store.resolve import ResolvedModel

    # Flash attention off, this module's subject (test_flash_exact.py has it
    # on): any cut is exact there, so hits are compared wherever rows are.
    base = dict(ctx_size=512, max_num_seqs=4, max_num_batched_tokens=256, flash_attn=False)
    return LLM(ResolvedModel("smollm2", smollm2_file(), context=512), LoadOptions(**{**base, **opts}))


def ask(llm, suffix: str):
    """(the Completion, its cached prompt tokens)."""
    c = llm.complete(llm.text_tokens(SHARED + suffix), GREEDY)
    return c, c.usage.cached_tokens


def same(c, ref, cached: int | None = None) -> None:
    """`c` answers as the cold run `ref` did: identically where this
    machine's rows are exact with flash attention off (what this module's
    engines run with), else up to the first near-tie (a hit computes its prompt's
    tail in another batch shape than a cold prefill)."""
    if isinstance(c, tuple):
        c, got = c
        assert cached is None or got == cached
    assert_completions_agree(measure_rows(smollm2_file(), flash_attn=False), ref, c)


def same_text(text: str, ref) -> None:
    """A server's answer text against the engine's cold Completion `ref`."""
    assert_greedy_agree(measure_rows(smollm2_file(), flash_attn=False),
                        [lp.chosen.text for lp in ref.logprobs], text,
                        [[(a.text, a.logprob) for a in lp.top] for lp in ref.logprobs], ref.text)


def kv_files(home: Path) -> list[Path]:
    return sorted((home / "cache" / "prefix").glob("*/*.kv"))


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """Reference Completions with the prefix cache off (and flash attention
    off, as the runs with the cache have it: only the batch shapes differ)."""
    with load(tmp_path_factory.mktemp("cold"), prefix_cache=False, flash_attn=False) as llm:
        assert len(llm.text_tokens(SHARED)) > 300    # more than one 256-token block
        return {s: ask(llm, s)[0] for s in SUFFIXES}


@pytest.fixture(scope="module")
def warm_home(tmp_path_factory, cold):
    """A cache directory holding the state of SHARED + SUFFIXES[0]."""
    home = tmp_path_factory.mktemp("warm")
    with load(home) as llm:
        same(ask(llm, SUFFIXES[0]), cold[SUFFIXES[0]], 0)
        llm.prefix_cache.disk.flush()
    assert len(kv_files(home)) == 1
    return home


def fresh_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_memory_hits_give_identical_greedy_output(tmp_path, cold):
    with load(tmp_path, prefix_cache_size_gb=0) as llm:     # memory only
        same(ask(llm, SUFFIXES[0]), cold[SUFFIXES[0]], 0)
        c, cached = ask(llm, SUFFIXES[0])                   # parked slot, whole prompt
        tile = llm.engine.scheduler.cfg.tile                # left to compute (scheduler.py)
        same(c, cold[SUFFIXES[0]])
        assert cached == len(llm.text_tokens(SHARED + SUFFIXES[0])) - tile
        c, cached = ask(llm, SUFFIXES[1])                   # shared prefix only
        limit = min(len(llm.text_tokens(SHARED)) - 2, len(llm.text_tokens(SHARED + SUFFIXES[1])) - tile)
        same(c, cold[SUFFIXES[1]])
        assert cached >= limit
        assert llm.stats().cached_tokens > 0
    assert kv_files(tmp_path) == []


def test_concurrent_requests_compute_the_shared_prefix_once(tmp_path, cold):
    with load(tmp_path, prefix_cache_size_gb=0) as llm:
        results: dict[str, tuple[str, int]] = {}
        threads = [threading.Thread(target=lambda s=s: results.__setitem__(s, ask(llm, s)))
                   for s in SUFFIXES]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(results) == set(cold)
        for s, r in results.items():
            same(r[0], cold[s])
        lengths = {s: len(llm.text_tokens(SHARED + s)) for s in SUFFIXES}
        computed = sum(lengths[s] - results[s][1] for s in SUFFIXES)
        n_shared = len(llm.text_tokens(SHARED)) - 2
        # Close to one prefix plus the distinct parts (and the tile each hit
        # leaves to compute): the prefix was computed once.
        tile = llm.engine.scheduler.cfg.tile
        assert computed <= max(lengths.values()) + sum(n - n_shared + tile for n in lengths.values()) + 64
        assert llm.stats().cached_tokens == sum(r[1] for r in results.values())


def test_disk_hit_after_restart_gives_identical_output(tmp_path, cold, warm_home):
    home = fresh_copy(warm_home, tmp_path / "home")
    with load(home) as llm:
        c, cached = ask(llm, SUFFIXES[1])
        same(c, cold[SUFFIXES[1]])
        assert cached >= 256 and llm.stats().cached_tokens_disk == cached


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_file_is_deleted_and_request_prefills_cold(tmp_path, cold, warm_home, damage):
    home = fresh_copy(warm_home, tmp_path / "home")
    (path,) = kv_files(home)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[-1000] ^= 0xFF
    else:
        data = bytearray(os.urandom(4096))
    path.write_bytes(bytes(data))
    with load(home) as llm:
        same(ask(llm, SUFFIXES[1]), cold[SUFFIXES[1]], 0)
        llm.prefix_cache.disk.flush()
    # The cold prefill saved a good state under the same name.
    assert kv_files(home) == [path] and path.read_bytes() != bytes(data)
    assert kv_disk.read_header(path) is not None


def test_file_from_another_model_or_setting_never_matches(tmp_path, cold, warm_home):
    home = fresh_copy(warm_home, tmp_path / "home")
    (path,) = kv_files(home)
    with load(home, ctx_size=640) as other:     # another setting: another namespace
        ns_dir = home / "cache" / "prefix" / other.prefix_cache.disk.ns
        assert ns_dir != path.parent
        # Plant the foreign state exactly where this prompt's chain looks.
        tokens = other.text_tokens(SHARED + SUFFIXES[1])
        chain = kv_disk.block_chain(other.prefix_cache.disk.ns, tokens, len(tokens) // 256)
        ns_dir.mkdir(parents=True, exist_ok=True)
        planted = ns_dir / f"{chain[-1]}.kv"
        shutil.copy(path, planted)
        same(ask(other, SUFFIXES[1]), cold[SUFFIXES[1]], 0)
        other.prefix_cache.disk.flush()
        # The foreign file was dropped; what is there now is this setting's own.
        assert kv_disk.read_header(planted)[0]["ns"] == other.prefix_cache.disk.ns


def test_unwritable_cache_dir_logs_once_and_keeps_serving(tmp_path, cold, caplog):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "prefix").write_text("not a directory")   # fails even as root
    with caplog.at_level(logging.WARNING, logger="llmctl.prefix_cache"):
        with load(tmp_path) as llm:
            same(ask(llm, SUFFIXES[0])[0], cold[SUFFIXES[0]])
            for n in (300, 600):
                llm.prefix_cache.disk.save(list(range(n)), b"state")
            llm.prefix_cache.disk.flush()
            same(ask(llm, SUFFIXES[1])[0], cold[SUFFIXES[1]])
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1


def test_full_disk_and_tiny_budget(tmp_path, cold, monkeypatch):
    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with load(tmp_path / "full") as llm:
        monkeypatch.setattr(kv_disk, "atomic_write", no_space)
        same(ask(llm, SUFFIXES[0]), cold[SUFFIXES[0]], 0)
        llm.prefix_cache.disk.flush()
        monkeypatch.undo()
    assert kv_files(tmp_path / "full") == []
    with load(tmp_path / "tiny", prefix_cache_size_gb=0.001) as llm:  # 1 MB < one state
        same(ask(llm, SUFFIXES[0])[0], cold[SUFFIXES[0]])
        llm.prefix_cache.disk.flush()
    assert kv_files(tmp_path / "tiny") == []


def test_two_engines_share_one_cache_dir(tmp_path, cold):
    with load(tmp_path) as a, load(tmp_path) as b:
        out: dict = {}
        jobs = [threading.Thread(target=lambda n=n, llm=llm, s=s: out.__setitem__(n, ask(llm, s)))
                for n, (llm, s) in enumerate([(a, SUFFIXES[0]), (b, SUFFIXES[0]),
                                              (a, SUFFIXES[2]), (b, SUFFIXES[1])])]
        for j in jobs:
            j.start()
        for j in jobs:
            j.join()
        for n, s in enumerate((SUFFIXES[0], SUFFIXES[0], SUFFIXES[2], SUFFIXES[1])):
            same(out[n][0], cold[s])
        a.prefix_cache.disk.flush()
        b.prefix_cache.disk.flush()
    with load(tmp_path) as c:
        got, cached = ask(c, SUFFIXES[2])
        same(got, cold[SUFFIXES[2]])
        assert cached >= 256


def run_cli(home: Path, *args: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "llmctl", "cache", *args, "--json"],
                         env={**os.environ, "LLMCTL_HOME": str(home)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_cache_ls_and_clear(tmp_path, warm_home):
    home = fresh_copy(warm_home, tmp_path / "home")
    listing = run_cli(home, "ls")
    (row,) = listing["caches"]
    assert row["model"] == "smollm2" and row["entries"] == 1 and row["tokens"] > 256
    assert row["bytes"] == kv_files(home)[0].stat().st_size == listing["total_bytes"]
    assert run_cli(home, "clear", "--model", "other-model")["removed"] == []
    cleared = run_cli(home, "clear", "--model", "smollm2")
    assert cleared["freed_bytes"] == row["bytes"] and kv_files(home) == []
    assert run_cli(home, "ls")["caches"] == []


def test_server_reports_hit_tokens(tmp_path, cold):
    srv = ServerProcess(["smollm2", "--ctx-size", "512", "--max-num-seqs", "4",
                         "--max-num-batched-tokens", "256"], env={"LLMCTL_HOME": str(tmp_path)})
    try:
        srv.wait_ready()
        body = {"model": "smollm2", "prompt": SHARED + SUFFIXES[2], "max_tokens": 8,
                "temperature": 0}
        first = httpx.post(srv.url + "/v1/completions", json=body, timeout=120).json()
        second = httpx.post(srv.url + "/v1/completions", json=body, timeout=120).json()
        for r in (first, second):
            same_text(r["choices"][0]["text"], cold[SUFFIXES[2]])
        stats = httpx.get(srv.url + "/stats").json()
        assert stats["prefix_cache_hit_tokens"] == second["usage"]["prompt_tokens"] - 1
        metrics = httpx.get(srv.url + "/metrics").text
        assert f"prefix_cache_hit_tokens_total {stats['prefix_cache_hit_tokens']}" in metrics
    finally:
        srv.stop()
