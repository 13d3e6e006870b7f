"""The event loop stays free whatever a request asks (issue #20 findings 1,
3 and 6): grammar conversion and large bodies run on their own workers
under deadlines, requests queued behind busy workers wait their turn (the
deadline is never theirs to pay, and plain chats skip the conversion lane),
nesting is measured before json.loads, SIGTERM still ends a server whose
worker is stuck, and a wedged engine is reported and refused."""

import json
import signal
import sys
import threading
import time

import httpx
import pytest

from llmctl.bench.launcher import Server
from llmctl.server.body import MAX_DEPTH, nesting_depth

MSG = [{"role": "user", "content": "hi"}]
SLOW = {"type": "object", "description": "slow"}     # the marker the patched converter spins on

# `llmctl serve` whose schema converter spins (pure Python, holding the GIL
# as the endless $ref loop of finding 1 did) on any schema marked "slow".
BOOT = """
import os, sys, time
import llmctl.runtime.formats.grammar as g
visit = g._Converter.visit
def spin(self, schema, *args, **kwargs):
    if isinstance(schema, dict) and schema.get("description") == "slow":
        end = time.monotonic() + float(os.environ.get("SPIN_S", "120"))
        release = os.environ.get("SPIN_RELEASE", "")
        while time.monotonic() < end and not (release and os.path.exists(release)):
            pass
    return visit(self, schema, *args, **kwargs)
g._Converter.visit = spin
from llmctl.cli.app import main
sys.argv = ["llmctl", *sys.argv[1:]]
main()
"""


@pytest.fixture(scope="module")
def spinning(session_home):
    # Qwen's template writes tool calls, so `tools` become a grammar too.
    srv = Server([sys.executable, "-c", BOOT, "serve", "qwen2.5-coder-0.5b", "--ctx-size", "512",
                  "--max-num-seqs", "2"], name="llmctl serve",
                 env={"LLMCTL_HOME": str(session_home), "LLMCTL_PARSE_DEADLINE_S": "2"})
    with srv:
        yield srv


def _slow_requests():
    tool = {"type": "function", "function": {"name": "f", "parameters": SLOW}}
    return [
        ("/v1/chat/completions", "response_format",
         {"messages": MSG, "response_format": {"type": "json_schema",
                                               "json_schema": {"name": "s", "schema": SLOW}}}),
        ("/v1/chat/completions", "tools", {"messages": MSG, "tools": [tool]}),
        ("/api/chat", "format", {"messages": MSG, "format": SLOW,
                                 "stream": False}),
    ]


@pytest.mark.slow
def test_a_spinning_conversion_is_a_400_and_never_blocks_the_loop(spinning):
    for path, field, body in _slow_requests():
        answer: list[httpx.Response] = []
        sender = threading.Thread(target=lambda answer=answer, path=path, body=body: answer.append(
            httpx.post(spinning.url + path, json=body, timeout=60)))
        sender.start()
        # Before the fix the converter ran on the event loop: /health hung
        # for as long as it spun.
        health = httpx.get(spinning.url + "/health", timeout=5)
        assert health.status_code == 200, health.text
        sender.join(60)
        r = answer[0]
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        message = error["message"] if isinstance(error, dict) else error
        assert f"'{field}' took longer than 2 s to convert" in message, r.text
        if isinstance(error, dict):
            assert error["param"] == field
    # Three workers still spin; plain requests are served meanwhile.
    chat = httpx.post(spinning.url + "/v1/chat/completions", timeout=60,
                      json={"messages": MSG, "max_tokens": 2})
    assert chat.status_code == 200, chat.text


@pytest.mark.slow
def test_sigterm_ends_a_server_whose_parse_worker_is_stuck(session_home):
    srv = Server([sys.executable, "-c", BOOT, "serve", "smollm2", "--ctx-size", "512"],
                 name="llmctl serve",
                 env={"LLMCTL_HOME": str(session_home), "LLMCTL_PARSE_DEADLINE_S": "60"})
    with srv:
        path, _, body = _slow_requests()[0]
        sender = threading.Thread(target=lambda: _post_quietly(srv.url + path, body))
        sender.start()
        # SIGTERM only once the slow request holds a parse worker.
        _wait_for_workers(srv.url, "parse", "busy", 1)
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        srv._proc.send_signal(signal.SIGTERM)
        # Not the kill stop() falls back to: the server ended on its own.
        assert srv._proc.wait(timeout=60) != -signal.SIGKILL
        sender.join(60)


def _wait_for_workers(url: str, kind: str, what: str, n: int) -> None:
    """Until /stats shows at least `n` of `kind`'s workers `what` ("busy",
    "queued"); fails after 60 s."""
    end = time.monotonic() + 60
    while (got := httpx.get(url + "/stats", timeout=10).json()["workers"][kind][what]) < n:
        assert time.monotonic() < end, f"{kind} workers {what}: {got}, never {n}"
        time.sleep(0.1)


def _post_in_thread(url: str, **kwargs) -> tuple[threading.Thread, list[httpx.Response]]:
    answer: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: answer.append(httpx.post(url, timeout=120, **kwargs)))
    sender.start()
    return sender, answer


@pytest.mark.slow
def test_requests_behind_busy_workers_wait_their_turn_and_are_answered(session_home, tmp_path):
    # One body worker and one parse worker, so a few requests fill them; a
    # spinning conversion holds its worker past its 2 s deadline until the
    # test creates `release` (a fixed spin raced a slow machine's chat).
    release = tmp_path / "release"
    srv = Server([sys.executable, "-c", BOOT, "serve", "smollm2", "--ctx-size", "512"],
                 name="llmctl serve",
                 env={"LLMCTL_HOME": str(session_home), "LLMCTL_PARSE_DEADLINE_S": "2",
                      "LLMCTL_WORKERS_PARSE": "1", "LLMCTL_WORKERS_BODY": "1",
                      "SPIN_S": "120", "SPIN_RELEASE": str(release)})
    chat = {"messages": MSG, "max_tokens": 2}
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    formatted = {**chat, "max_tokens": 20, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    with srv:
        url = srv.url + "/v1/chat/completions"
        # Large bodies fill the body workers; a small chat never waits on them.
        big = b'{"messages": [' + b"[]," * ((7 << 20) // 3) + b'[]]}'
        floods = [_post_in_thread(url, content=big, headers={"Content-Type": "application/json"})
                  for _ in range(3)]
        _wait_for_workers(srv.url, "body", "busy", 1)
        r = httpx.post(url, json=chat, timeout=60)
        assert r.status_code == 200, r.text
        for sender, answer in floods:
            sender.join(120)
            assert answer[0].status_code == 400, answer[0].text     # not chat messages
        # A conversion that spins holds the one parse worker ...
        path, _, body = _slow_requests()[0]
        spinner = _post_in_thread(srv.url + path, json=body)
        _wait_for_workers(srv.url, "parse", "busy", 1)
        # ... conversions behind it wait, however long, and are answered:
        # its deadline was the spinner's, never theirs ...
        queued = [_post_in_thread(url, json=formatted) for _ in range(5)]
        _wait_for_workers(srv.url, "parse", "queued", 5)
        # ... while a plain chat skips the conversion lane altogether.
        r = httpx.post(srv.url + "/api/chat", json={**chat, "stream": False}, timeout=60)
        assert r.status_code == 200, r.text
        assert httpx.get(srv.url + "/stats", timeout=30).json()["workers"]["parse"]["queued"] == 5
        assert not any(answer for _, answer in queued)
        spinner[0].join(120)
        release.touch()
        assert spinner[1][0].status_code == 400     # it ran past its deadline: its own fault
        assert "took longer than 2 s" in spinner[1][0].text
        for sender, answer in queued:
            sender.join(120)
            assert answer[0].status_code == 200, answer[0].text
            assert json.loads(answer[0].json()["choices"][0]["message"]["content"]).keys() \
                <= {"a"}


def _post_quietly(url: str, body: dict) -> None:
    try:
        httpx.post(url, json=body, timeout=60)
    except httpx.TransportError:
        pass                # the server went away mid-request, as it should


def test_nesting_is_measured_on_the_raw_bytes():
    assert nesting_depth(b'{"a": [[1], {"b": []}]}') == 4
    # Brackets inside strings, escaped quotes and backslashes do not count.
    assert nesting_depth(b'{"a": "[[[[\\"]]]]{", "b": "\\\\", "c": [1]}') == 2
    assert nesting_depth(b"[" * 100_000) == MAX_DEPTH + 1     # stops at the limit
    assert nesting_depth(b'{"a": "never closed [[[[') == 1


def test_brackets_100000_deep_are_a_400_on_both_apis(server):
    deep = b"[" * 100_000
    for path in ("/v1/chat/completions", "/api/chat", "/v1/embeddings"):
        r = httpx.post(server.url + path, content=deep, timeout=30,
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        message = error["message"] if isinstance(error, dict) else error
        assert "nested deeper than" in message, r.text
    # A field nested just past the limit is still named.
    body = {"messages": MSG, "metadata": json.loads("[" * MAX_DEPTH + "1" + "]" * MAX_DEPTH)}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata", r.text


def test_a_large_body_parses_on_a_worker_and_answers(server):
    text = "hello world " * 20_000          # 240 KB: past the inline limit
    r = httpx.post(server.url + "/tokenize", json={"content": text}, timeout=60)
    assert r.status_code == 200, r.text
    assert len(r.json()["tokens"]) >= 20_000
    bad = b'{"content": "' + b"x" * 100_000 + b'", "n": NaN}'
    r = httpx.post(server.url + "/tokenize", content=bad, timeout=60,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "NaN" in r.json()["error"]["message"], r.text


def test_health_reports_a_stalled_engine(llm, monkeypatch):
    import asyncio

    from llmctl.server.app import create_app
    from llmctl.server.state import ServerState

    app = create_app(ServerState.serving(llm))

    async def probe():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get("/health")

    assert asyncio.run(probe()).status_code == 200
    # A wedged step, as the engine's watchdog reports it.
    monkeypatch.setattr(llm.engine, "stalled", lambda: "no step for 30 s with 1 running")
    health = asyncio.run(probe())
    assert health.status_code == 503, health.text
    assert health.json() == {"status": "error",
                             "error": "model 'smollm2': no step for 30 s with 1 running"}


def test_a_stalled_engine_is_refused_like_a_dead_one(llm, monkeypatch):
    import asyncio

    from llmctl.server.app import create_app
    from llmctl.server.state import ServerState

    app = create_app(ServerState.serving(llm))

    async def chat(path: str, body: dict):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.post(path, json=body, timeout=60)

    body = {"messages": MSG, "max_tokens": 2}
    assert asyncio.run(chat("/v1/chat/completions", body)).status_code == 200
    monkeypatch.setattr(llm.engine, "stalled", lambda: "no step for 30 s with 1 running")
    # Before the fix the request queued on the wedged engine (here, one that
    # still steps: it answered 200).
    r = asyncio.run(chat("/v1/chat/completions", body))
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "engine_failed", r.text
    assert "is stalled: no step for 30 s" in r.json()["error"]["message"], r.text
    r = asyncio.run(chat("/api/chat", {**body, "stream": False}))
    assert r.status_code == 503 and "is stalled" in r.json()["error"], r.text
