"""Waiting for a model holds no thread (issue #20 finding 4), and keep_alive
has Ollama's range while /api/ps and `llmctl ps` never fail on an expiry
(finding 9). Real models through the real loader and a real `llmctl serve`."""

import asyncio
import dataclasses
import os
import subprocess
import sys
import threading
import time

import httpx
import ollama
import pytest

from conftest import wait_until
from llmctl.bench.launcher import Server
from llmctl.errors import LlmctlError, ModelsBusy
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.pool.model_pool import Loaded, ModelPool, estimate_bytes
from llmctl.server.ollama.models import _expiry
from llmctl.server.state import ServerState
from llmctl.server.workers import run_on
from llmctl.settings import Settings
from llmctl.store.resolve import resolve_model

OPTS = LoadOptions(ctx_size=256, max_num_seqs=2, max_num_batched_tokens=64, threads=1,
                   prefix_cache=False)
MSG = [{"role": "user", "content": "hi"}]
# More than asyncio's default executor ever has (min(32, cores + 4)): before
# the fix each waiter held one of its threads.
WAITERS = 36


def test_waiting_for_room_holds_no_thread_and_a_cancelled_waiter_leaks_nothing():
    pool = ModelPool(OPTS, models_max=1, memory_budget=1 << 40)
    state = ServerState(pool, default="smollm2")

    async def scenario():
        held = await state.lease("smollm2")
        waiters = [asyncio.create_task(state.lease("gemma3-270m")) for _ in range(12)]
        await asyncio.sleep(1.0)
        assert not any(w.done() for w in waiters)
        # Twelve waiters, and no thread waits in the pool for them (before the
        # fix, every thread of asyncio's executor sat in ModelPool._wait);
        # the query workers are free.
        assert _threads_waiting_in_the_pool() == 0
        assert await asyncio.wait_for(run_on(state.workers.query, lambda: "free"), 10) == "free"
        waiters[0].cancel()
        held.release()
        async with asyncio.timeout(180):
            got = await asyncio.gather(*waiters[1:])
        assert {lease.name for lease in got} == {"gemma3-270m"}
        # The cancelled waiter's use was given back, whenever it was taken.
        await asyncio.sleep(0.5)
        assert pool.get("gemma3-270m").active == 11
        for lease in got:
            lease.release()
        assert pool.get("gemma3-270m").active == 0

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
        state.workers.shutdown()


def _threads_waiting_in_the_pool() -> int:
    """Threads, other than the keep-alive reaper, blocked in a wait with a
    frame of runtime/pool.py below it: a request waiting for room must hold
    none (before the fix each waiter held one in ModelPool._wait)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    count = 0
    for ident, frame in sys._current_frames().items():
        if names.get(ident) == "llmctl-keepalive" or ident == threading.get_ident():
            continue
        codes = []
        while frame is not None:
            codes.append(frame.f_code)
            frame = frame.f_back
        blocked = codes[0].co_name == "wait" and codes[0].co_filename.endswith("threading.py")
        if blocked and any(c.co_filename.endswith(os.path.join("runtime", "pool.py"))
                           for c in codes):
            count += 1
    return count


def test_a_wait_past_the_pool_limit_is_models_busy():
    pool = ModelPool(OPTS, models_max=1, memory_budget=1 << 40, wait_s=0.5)
    state = ServerState(pool, default="smollm2")

    async def scenario():
        held = await state.lease("smollm2")
        try:
            with pytest.raises(ModelsBusy, match="every loaded model is busy"):
                async with asyncio.timeout(30):
                    await state.lease("gemma3-270m")
        finally:
            held.release()

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
        state.workers.shutdown()


def _wait_for(url: str, body: dict, out: list) -> None:
    try:
        out.append(httpx.post(url, json=body, timeout=240).status_code)
    except httpx.TransportError as e:
        out.append(repr(e))


@pytest.mark.slow
def test_requests_waiting_for_room_starve_neither_the_loaded_model_nor_tags(session_home):
    with Server.llmctl_serve("smollm2", "--models-max", "1", "--ctx-size", "4096",
                             "--max-num-seqs", "2", "--max-queued", "64",
                             env={"LLMCTL_HOME": str(session_home)}) as srv:
        chat = srv.url + "/v1/chat/completions"
        with httpx.Client(timeout=120) as client, client.stream("POST", chat, json={
                "model": "smollm2", "messages": MSG, "stream": True, "max_tokens": 4000,
                "ignore_eos": True, "temperature": 0}) as slow:
            next(slow.iter_lines())            # smollm2 is leased for a long while
            results: list = []
            waiters = [threading.Thread(target=_wait_for, args=(chat, {
                "model": "gemma3-270m", "messages": MSG, "max_tokens": 1}, results))
                for _ in range(WAITERS)]
            for w in waiters:
                w.start()
            # They all wait for smollm2's room: the queue shows them.
            wait_until(lambda: httpx.get(srv.url + "/stats", timeout=30).json()["queue"]
                       ["by_model"].get("gemma3-270m") == WAITERS,
                       "every waiter to queue for gemma3-270m", timeout=120)
            # Bounded waits, well under the 300 s the deadlock lasted, and
            # loose enough for a machine shared with other test runs.
            answer = httpx.post(chat, timeout=120, json={"model": "smollm2", "messages": MSG,
                                                         "max_tokens": 2})
            assert answer.status_code == 200, answer.text
            tags = httpx.get(srv.url + "/api/tags", timeout=60)
            assert tags.status_code == 200 and tags.json()["models"], tags.text
            assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
        for w in waiters:                       # the stream closed: room for gemma
            w.join(300)
        assert len(results) == WAITERS and set(results) <= {200, 429, 503}, results


def _llmctl(*args, home):
    env = {**os.environ, "LLMCTL_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "llmctl", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_keep_alive_past_ollamas_range_is_a_400_and_ps_keeps_working(server, session_home):
    client = ollama.Client(host=server.url, timeout=120)
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="smollm2", messages=MSG, keep_alive="99999999h",
                    options={"num_predict": 1})
    assert refused.value.status_code == 400 and "keep_alive" in refused.value.error
    raw = httpx.post(server.url + "/api/generate", timeout=60,
                     json={"model": "smollm2", "prompt": "hi", "keep_alive": 1e13,
                           "stream": False})
    assert raw.status_code == 400 and "keep_alive" in raw.json()["error"], raw.text
    try:
        # The longest one accepted lists an expiry about 292 years out.
        client.chat(model="smollm2", messages=MSG, keep_alive="2562047h",
                    options={"num_predict": 1})
        ps = httpx.get(server.url + "/api/ps", timeout=30)
        assert ps.status_code == 200, ps.text
        assert int(ps.json()["models"][0]["expires_at"][:4]) > 2300
        assert client.ps().models[0].name == "smollm2"
        shown = _llmctl("ps", "--url", server.url, home=session_home)
        assert shown.returncode == 0 and "smollm2" in shown.stdout, shown.stderr
    finally:
        client.chat(model="smollm2", messages=MSG, keep_alive="5m", options={"num_predict": 1})


def test_an_expiry_past_what_a_datetime_holds_renders_as_far_future():
    resolved = resolve_model("smollm2")
    entry = Loaded("smollm2", resolved, 0, keep_alive_s=1e15, last_used=time.time())
    assert int(_expiry(entry, time.time())[:4]) > 2300


class Wakes:
    """A waiter that counts the pool's calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


def _one_model_pool(opts=OPTS, **kw) -> ModelPool:
    return ModelPool(opts, models_max=1, memory_budget=1 << 40, **kw)


# LLMCTL_MODEL_WAITERS_MAX=2, as Settings.load() reads it.
TWO_WAITERS = dataclasses.replace(OPTS, settings=Settings.load({"LLMCTL_MODEL_WAITERS_MAX": "2"}))


def test_a_release_that_frees_no_room_wakes_no_waiter():
    pool = _one_model_pool()
    try:
        first, second = pool.acquire("smollm2"), pool.acquire("smollm2")
        legacy, named = Wakes(), Wakes()
        pool.add_waiter(legacy)                 # as server/state.py calls it today
        pool.add_waiter(named, "gemma3-270m")
        assert pool.try_reserve(pool.resolve("gemma3-270m"), None).entry is None
        for _ in range(5):                      # finished chats on the busy model
            pool.acquire_loaded("smollm2").release()
        first.release()                         # smollm2 is still in use
        assert (legacy.calls, named.calls) == (0, 0)
        second.release()                        # now it is idle: room for one model
        assert (legacy.calls, named.calls) == (1, 1)
        pool.remove_waiter(named)               # it left: the room is handed on, to
        assert legacy.calls == 1                # a named waiter only (none is left)
    finally:
        pool.close()


def test_waiters_are_woken_oldest_first_and_only_as_many_as_the_room_holds():
    pool = _one_model_pool()
    try:
        held = pool.acquire("smollm2")
        gemma, qwen = pool.resolve("gemma3-270m"), pool.resolve("qwen2.5-coder-0.5b")
        for resolved in (gemma, qwen):          # both wait; their sizes are known now
            assert pool.try_reserve(resolved, None).entry is None
        for_gemma = [Wakes() for _ in range(20)]
        for_qwen = [Wakes() for _ in range(20)]
        for a, b in zip(for_gemma, for_qwen, strict=False):
            pool.add_waiter(a, "gemma3-270m")
            pool.add_waiter(b, "qwen2.5-coder-0.5b")
        held.release()                          # one model slot frees
        assert [w.calls for w in for_gemma] == [1] + [0] * 19
        assert sum(w.calls for w in for_qwen) == 0
        # The woken one reserves gemma; its load ending wakes gemma's waiters
        # (they can all take it now), none of qwen's (no room appeared).
        got = pool.try_reserve(gemma, None)
        assert got.fresh
        assert sum(w.calls for w in for_gemma) == 1 and sum(w.calls for w in for_qwen) == 0
        lease = pool.fill(got.entry)
        assert [w.calls for w in for_gemma] == [2] + [1] * 19
        for w in for_gemma:                     # they took it and left
            pool.remove_waiter(w)
        assert sum(w.calls for w in for_qwen) == 0
        lease.release()
        # gemma is idle after that last release: one qwen waiter, the oldest.
        assert [w.calls for w in for_qwen] == [1] + [0] * 19
        pool.remove_waiter(for_qwen[0])         # it left without taking the room
        assert [w.calls for w in for_qwen] == [1, 1] + [0] * 18
    finally:
        pool.close()


def test_a_failed_load_wakes_every_waiter_for_it_with_its_error():
    def broken(resolved, opts):
        raise LlmctlError("no such luck")

    pool = _one_model_pool(loader=broken)
    try:
        got = pool.try_reserve(pool.resolve("gemma3-270m"), None)
        waits = [pool.try_reserve(pool.resolve("gemma3-270m"), None) for _ in range(3)]
        wakes = [Wakes() for _ in waits]
        for w in wakes:
            pool.add_waiter(w, "gemma3-270m")
        with pytest.raises(LlmctlError, match="no such luck"):
            pool.fill(got.entry)
        assert [w.calls for w in wakes] == [1, 1, 1]
        for waited in waits:
            with pytest.raises(LlmctlError, match="no such luck"):
                waited.raise_failed()
    finally:
        pool.close()


def test_past_the_waiter_cap_a_request_is_models_busy_at_once():
    pool = _one_model_pool(TWO_WAITERS, wait_s=120)
    state = ServerState(pool, default="smollm2")

    async def scenario():
        held = await state.lease("smollm2")
        waiting = [asyncio.create_task(state.lease("gemma3-270m")) for _ in range(2)]
        await asyncio.sleep(0.5)
        try:
            with pytest.raises(ModelsBusy, match="already wait"):
                async with asyncio.timeout(30):     # at once, not after wait_s
                    await state.lease("gemma3-270m")
            assert not any(w.done() for w in waiting)
            # Per model: another model's waiters have a cap of their own.
            extra = Wakes()
            pool.add_waiter(extra, "qwen2.5-coder-0.5b")
            pool.remove_waiter(extra)
        finally:
            held.release()
        async with asyncio.timeout(180):
            for lease in await asyncio.gather(*waiting):
                lease.release()

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
        state.workers.shutdown()


def test_the_cap_counts_each_model_on_its_own():
    pool = _one_model_pool(TWO_WAITERS)
    try:
        waiting = [Wakes() for _ in range(2)]
        for w in waiting:
            pool.add_waiter(w, "gemma3-270m")
        with pytest.raises(ModelsBusy, match="'gemma3-270m'"):
            pool.add_waiter(Wakes(), "gemma3-270m")
        pool.add_waiter(Wakes(), "qwen2.5-coder-0.5b")
        pool.remove_waiter(waiting[0])
        pool.add_waiter(Wakes(), "gemma3-270m")     # a place freed
    finally:
        pool.close()


def _returns_while(view) -> bool:
    """Whether `view()` returns on another thread within a bounded wait (it
    hung, before the fix, until the slow work ended)."""
    out = []
    viewer = threading.Thread(target=lambda: out.append(view()), daemon=True)
    viewer.start()
    viewer.join(20)
    return bool(out)


def test_views_do_not_wait_while_an_unload_closes_an_engine():
    pool = ModelPool(OPTS, memory_budget=1 << 40)
    try:
        pool.acquire("smollm2").release()
        llm = pool.get("smollm2").llm
        closing, go, real_close = threading.Event(), threading.Event(), llm.close

        def slow_close():                       # our own LLM.close, made slow
            closing.set()
            go.wait(60)
            real_close()

        llm.close = slow_close
        unloader = threading.Thread(target=pool.unload, args=("smollm2",))
        unloader.start()
        try:
            assert closing.wait(60)
            # /health reads loaded(), /api/ps get(), a request acquire_loaded.
            assert _returns_while(pool.loaded) and pool.loaded() == []
            assert _returns_while(lambda: pool.get("smollm2")) and pool.get("smollm2") is None
            assert _returns_while(lambda: pool.acquire_loaded("smollm2"))
            assert pool.acquire_loaded("smollm2") is None
            assert _returns_while(pool.stats)
        finally:
            go.set()
            unloader.join(60)
        assert not unloader.is_alive() and not llm.engine.alive
    finally:
        pool.close()


def test_views_do_not_wait_while_a_file_is_estimated():
    reading, go = threading.Event(), threading.Event()

    def slow_estimate(resolved, opts):          # the real estimate, slow for gemma
        if resolved.name == "gemma3-270m":
            reading.set()
            go.wait(60)
        return estimate_bytes(resolved, opts)

    pool = ModelPool(OPTS, memory_budget=1 << 40, estimator=slow_estimate)
    try:
        pool.acquire("smollm2").release()
        reserver = threading.Thread(target=lambda: pool.acquire("gemma3-270m").release())
        reserver.start()
        try:
            assert reading.wait(60)
            assert _returns_while(pool.loaded)
            assert _returns_while(lambda: pool.acquire_loaded("smollm2").release() or True)
        finally:
            go.set()
            reserver.join(120)
        assert [e.name for e in pool.loaded()] == ["gemma3-270m", "smollm2"]
    finally:
        pool.close()
