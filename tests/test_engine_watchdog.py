"""The engine cannot be wedged (#20, finding 2 and the watchdog):

- a grammar llama.cpp constrains with exponential work fails its own
  request with a 400-class error within a bounded wait, frees its slot, and
  the requests beside and after it complete;
- an engine that has work and finishes no step reports it through
  `Engine.stalled()`, and /health with it; an idle spell is no stall.

Everything runs on the real SmolLM2 through real llama.cpp. The one
stand-in is a stuck step, made by holding the engine's Runner.run on an
event (what a wedged llama.cpp call looks like from outside)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from conftest import smollm2_file, wait_until
from llmctl.errors import InvalidParams, UsageError
from llmctl.runtime.llama.grammar_budget import GrammarBudget, GrammarClock
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.app import create_app
from llmctl.server.state import ServerState
from llmctl.settings import Settings
from llmctl.store.resolve import ResolvedModel

# What runtime/grammar.py made (as of 14a993b) of the 578-character schema
# of finding 2: {"$ref": "#/$defs/n", "$defs": {"n": {"anyOf": [8 x {"type":
# "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}]}}}. Written out so
# the test exercises the engine's backstop whatever the converter refuses.
# Every alternative starts with "[", so llama.cpp keeps eight times the parse
# stacks after each one, and no value ever ends: generation only nests.
WEDGE_GBNF = "\n".join([
    'space ::= " "?',
    "ref-n ::= ref-n-body",
    *(f'ref-n-body-{i} ::= "[" space ref-n ("," space ref-n){{0,}} "]" space' for i in range(8)),
    "ref-n-body ::= " + " | ".join(f"ref-n-body-{i}" for i in range(8)),
    "root ::= ref-n",
]) + "\n"
WEDGE_SCHEMA = {"$ref": "#/$defs/n", "$defs": {"n": {"anyOf": [
    {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}] * 8}}}

WAIT_S = 300      # a wedged engine never answers: the bound turns that into a failure


@pytest.fixture(scope="module")
def engine_llm(session_home):
    """An LLM of its own: should a test wedge it, the shared one stays usable."""
    import os
    os.environ["LLMCTL_HOME"] = str(session_home)
    llm = LLM(ResolvedModel("smollm2", smollm2_file(), context=512),
              LoadOptions(max_num_seqs=2, max_num_batched_tokens=128, prefix_cache=False))
    yield llm
    if llm.engine.stalled() is None and not llm.engine.scheduler.has_work():
        llm.close()     # a wedged engine's C call would crash on a freed context


def _run(fn, *args):
    """fn(*args) on a thread, waited for at most WAIT_S: (result, error)."""
    out: dict = {}

    def target():
        try:
            out["result"] = fn(*args)
        except Exception as e:
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def _done(thread: threading.Thread, out: dict) -> dict:
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"no answer within {WAIT_S} s: the engine is wedged"
    return out


def _prompt(llm: LLM) -> list[int]:
    return llm.chat_tokens([{"role": "user", "content": "Write some nested lists."}])


def _wait_for(cond, what: str, timeout: float = WAIT_S):
    return wait_until(cond, what, timeout)


# ---- the grammar budget ---------------------------------------------------------------


def test_an_exploding_grammar_fails_only_its_request(engine_llm):
    tokens = _prompt(engine_llm)
    before = engine_llm.stats().requests["error"]
    wedge = _run(engine_llm.complete, tokens,
                 SamplingParams(temperature=0, max_tokens=64, grammar=WEDGE_GBNF))
    beside = _run(engine_llm.complete, tokens, SamplingParams(temperature=0, max_tokens=24))
    error = _done(*wedge).get("error")
    assert isinstance(error, InvalidParams), error
    assert error.param == "response_format"
    assert "the response grammar is too ambiguous" in error.message
    assert "simplify the schema" in error.message
    # The request beside it, and one after it, finish normally.
    assert _done(*beside)["result"].finish_reason == "length"
    after = _done(*_run(engine_llm.complete, tokens, SamplingParams(temperature=0, max_tokens=8)))
    assert after["result"].usage.completion_tokens == 8
    stats = engine_llm.stats()
    assert stats.requests["error"] == before + 1
    assert (stats.running, stats.waiting) == (0, 0)        # its slot was freed


def _wedge_body(stream: bool) -> dict:
    return {"messages": [{"role": "user", "content": "Write some nested lists."}],
            "max_tokens": 64, "temperature": 0, "stream": stream,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "n", "schema": WEDGE_SCHEMA}}}


def test_over_http_a_400_whole_and_an_error_event_streamed(engine_llm, monkeypatch):
    # A converter that misses the ambiguity (as it did at 14a993b): the
    # engine must not trust it.
    monkeypatch.setattr("llmctl.server.tool_protocol.json_schema_grammar",
                        lambda schema: WEDGE_GBNF)
    app = create_app(ServerState.serving(engine_llm))

    async def send():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                     timeout=WAIT_S) as c:
            whole = await c.post("/v1/chat/completions", json=_wedge_body(False))
            streamed = await c.post("/v1/chat/completions", json=_wedge_body(True))
            plain = await c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            return whole, streamed, plain

    whole, streamed, plain = asyncio.run(asyncio.wait_for(send(), WAIT_S))
    assert whole.status_code == 400, whole.text
    err = whole.json()["error"]
    assert err["param"] == "response_format" and err["type"] == "invalid_request_error"
    assert "too ambiguous" in err["message"]
    assert streamed.status_code == 200
    frames = [line[len("data: "):] for line in streamed.text.splitlines()
              if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    assert "too ambiguous" in json.loads(frames[-2])["error"]["message"]
    assert plain.status_code == 200 and plain.json()["choices"][0]["finish_reason"] == "length"


def test_the_clock_refuses_an_accept_whose_growth_would_pass_the_budget():
    clock = GrammarClock(GrammarBudget(token_ms=2000, total_ms=30000))
    for seconds in (0.00005, 0.0012, 0.012):     # growing, yet the next fits 2 s
        clock.start_token()
        clock.accepted(seconds)
    clock.start_token()
    with pytest.raises(InvalidParams, match="the next would pass the limit of 2000 ms"):
        clock.accepted(0.1)         # 0.1 s x (0.1 / 0.012)^2 > 2 s


def test_the_clock_bounds_one_token_a_filter_and_the_whole_request():
    clock = GrammarClock(GrammarBudget(token_ms=100, total_ms=250))
    clock.start_token()
    with pytest.raises(InvalidParams, match=r"one token took 101 ms to constrain \(limit 100 ms\)"):
        clock.charge(0.101)
    clock.start_token()
    clock.charge(0.01)
    with pytest.raises(InvalidParams, match="filtering the vocabulary would take about"):
        clock.check_share(0.01, 256, 49152)   # the first slice says the rest takes ~1.9 s
    clock.start_token()
    clock.charge(0.09)
    clock.start_token()
    with pytest.raises(InvalidParams, match=r"limit 250 ms a request"):
        clock.charge(0.06)


def test_the_budget_comes_from_the_settings():
    settings = Settings.load({"LLMCTL_GRAMMAR_BUDGET_MS": "150", "LLMCTL_GRAMMAR_TOTAL_MS": "900"})
    assert GrammarBudget.of(settings) == GrammarBudget(150.0, 900.0)
    with pytest.raises(UsageError, match="LLMCTL_GRAMMAR_BUDGET_MS"):
        Settings.load({"LLMCTL_GRAMMAR_BUDGET_MS": "-1"})


# ---- the step watchdog ----------------------------------------------------------------


def test_an_engine_with_work_and_no_step_is_stalled(engine_llm, monkeypatch):
    engine = engine_llm.engine
    monkeypatch.setattr(engine, "stall_s", 0.5)
    time.sleep(0.6)                 # idle longer than the limit: that is no stall
    assert engine.stalled() is None
    stuck, entered = threading.Event(), threading.Event()
    run = engine.runner.run

    def stuck_run(plan):            # a step that does not return, as a wedged C call
        entered.set()
        stuck.wait(WAIT_S)
        return run(plan)

    monkeypatch.setattr(engine.runner, "run", stuck_run)
    request = _run(engine_llm.complete, _prompt(engine_llm),
                   SamplingParams(temperature=0, max_tokens=4))
    try:
        assert entered.wait(WAIT_S)
        why = _wait_for(engine.stalled, "stalled() to report the stuck step")
        assert "finished no step" in why and "1 running" in why
        assert engine.stats().step_age_s > 0.5
        health = asyncio.run(_get(create_app(ServerState.serving(engine_llm)), "/health"))
        assert health.status_code == 503 and "finished no step" in health.text
    finally:
        monkeypatch.setattr(engine.runner, "run", run)
        stuck.set()
    assert _done(*request)["result"].usage.completion_tokens == 4
    assert engine.stalled() is None and engine.stats().step_age_s == 0.0


def test_work_arriving_after_an_idle_spell_is_not_a_stall(engine_llm, monkeypatch):
    engine = engine_llm.engine
    monkeypatch.setattr(engine, "stall_s", 0.3)
    time.sleep(0.5)                 # idle for longer than the limit
    events = []
    seq = engine.submit(_prompt(engine_llm), SamplingParams(temperature=0, max_tokens=2),
                        events.append)
    # The age counts from the request's arrival, not from the last step
    # before the idle spell.
    assert engine.stalled() is None
    _wait_for(lambda: seq.finished_at is not None, "the request to finish")


def test_the_stall_limit_comes_from_the_settings(engine_llm):
    assert Settings.load({"LLMCTL_ENGINE_STALL_S": "7.5"}).engine_stall_s == 7.5
    for bad in ("soon", "0", "-3", "nan", "inf"):
        with pytest.raises(UsageError, match="LLMCTL_ENGINE_STALL_S"):
            Settings.load({"LLMCTL_ENGINE_STALL_S": bad})
    assert engine_llm.engine.stall_s == engine_llm.opts.settings.engine_stall_s == 60.0


async def _get(app, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        return await c.get(path)
