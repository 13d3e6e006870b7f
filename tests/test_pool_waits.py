"""Waiting for a model holds no thread (issue #20 finding 4), and keep_alive
has Ollama's range while /api/ps and `llmctl ps` never fail on an expiry
(finding 9). Real models through the real loader and a real `llmctl serve`."""

import asyncio
import os
import subprocess
import sys
import threading
import time

import httpx
import ollama
import pytest

from llmctl.bench.launcher import Server
from llmctl.errors import ModelsBusy
from llmctl.runtime.config import LoadOptions
from llmctl.runtime.pool import Loaded, ModelPool
from llmctl.server.ollama_models import _expiry
from llmctl.server.state import ServerState
from llmctl.server.workers import run_on
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
    """Threads whose stack is inside one of ModelPool's blocking waits."""
    waits = {"_wait", "_wait_or_reserve", "acquire"}
    count = 0
    for frame in sys._current_frames().values():
        while frame is not None:
            code = frame.f_code
            if code.co_filename.endswith("pool.py") and code.co_name in waits:
                count += 1
                break
            frame = frame.f_back
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
                             "--max-num-seqs", "2", "--max-queue", "64",
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
            time.sleep(3)                       # they all wait for smollm2's room
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
