"""The loop guard: an answer that repeats one block over and over ends, and
each protocol says so with a stop reason its clients know plus
`stop_details` (Ollama: done_reason "loop"). The detector alone first, then
the real SmolLM2 through `serve --loop-guard`, driven by the official
clients, with the request header turning it off for one request."""

from __future__ import annotations

import random

import anthropic
import httpx
import ollama
import openai
import pytest

from conftest import ServerProcess
from llmctl.cli import launch_agents
from llmctl.errors import InvalidParams
from llmctl.runtime.engine.repetition import MIN_SPAN, LoopDetector
from llmctl.server import fields

# SmolLM2, greedy, answers this with "I am a mercy." again and again.
LOOPING = "Repeat after me, forever: la la la la la la la la la la"
CAP = 400
HEADER = fields.LOOP_GUARD_HEADER


def _fires_at(tokens: list[int]) -> tuple[int, int] | None:
    d = LoopDetector()
    for i, t in enumerate(tokens):
        if d.push(t):
            return i + 1, d.period
    return None


def test_detector_fires_on_a_repeated_block_and_names_its_length():
    assert _fires_at([7] * 1000) == (MIN_SPAN, 1)
    assert _fires_at(list(range(50)) * 20) == (MIN_SPAN, 50)
    # A long block must come round four times, however long the span.
    assert _fires_at(list(range(100)) * 10) == (400, 100)
    # A prose opening, then the loop: found once it has filled the span.
    opening = [1000 + i for i in range(300)]
    assert _fires_at(opening + [5, 6, 7] * 200) == (300 + MIN_SPAN, 3)


def test_detector_leaves_varied_and_numbered_text_alone():
    rng = random.Random(1)
    assert _fires_at([rng.randrange(50) for _ in range(5000)]) is None
    # A numbered list: the same shape every line, never the same tokens.
    assert _fires_at([t for n in range(400) for t in (n, 13, 220, 9)]) is None
    # A block longer than the longest period looked for.
    assert _fires_at(list(range(300)) * 5) is None


def test_header_values_and_the_launch_side_agree():
    assert fields.loop_guard({}, True) is True and fields.loop_guard({}, False) is False
    assert fields.loop_guard({HEADER: " ON "}, False) is True
    assert fields.loop_guard({HEADER: "0"}, True) is False
    with pytest.raises(InvalidParams, match=HEADER) as e:
        fields.loop_guard({HEADER: "maybe"}, False)
    assert e.value.param == HEADER
    assert launch_agents.LOOP_GUARD_HEADER == HEADER


@pytest.fixture(scope="module")
def url(session_home):
    srv = ServerProcess(["smollm2", "--ctx-size", "2048", "--max-num-seqs", "2",
                         "--loop-guard"], env={"LLMCTL_HOME": str(session_home)})
    try:
        yield srv.wait_ready(600).url
    finally:
        srv.stop()


def _chat(url: str, **headers: str):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=CAP, extra_headers=headers,
        messages=[{"role": "user", "content": LOOPING}])


@pytest.mark.slow
def test_chat_ends_the_loop_and_the_header_turns_it_off(url):
    guarded = _chat(url)
    choice = guarded.choices[0]
    assert choice.finish_reason == "stop" and guarded.usage.completion_tokens < CAP
    assert choice.model_extra["stop_details"]["type"] == "loop"
    free = _chat(url, **{HEADER: "off"})
    assert free.choices[0].finish_reason == "length"
    assert free.usage.completion_tokens == CAP and "stop_details" not in free.choices[0].model_extra
    # The guard ended the same text the free run went on with.
    assert free.choices[0].message.content.startswith(choice.message.content)


@pytest.mark.slow
def test_streamed_chat_and_the_other_protocols_say_it_fired(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=CAP, stream=True,
        messages=[{"role": "user", "content": LOOPING}]))
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1].choices[0]
    assert last.finish_reason == "stop" and last.model_extra["stop_details"]["type"] == "loop"

    claude = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    message = claude.messages.create(model="smollm2", max_tokens=CAP, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": LOOPING}])
    assert message.stop_reason == "end_turn" and message.usage.output_tokens < CAP
    assert message.model_dump()["stop_details"]["type"] == "loop"
    with claude.messages.stream(model="smollm2", max_tokens=CAP, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": LOOPING}]) as stream:
        deltas = [e for e in stream if e.type == "message_delta"]
    assert deltas[-1].delta.stop_reason == "end_turn"
    assert deltas[-1].delta.model_dump()["stop_details"]["type"] == "loop"

    response = client.responses.create(model="smollm2", input=LOOPING, temperature=0,
                                       max_output_tokens=CAP)
    assert response.status == "completed" and response.usage.output_tokens < CAP
    assert response.model_dump()["stop_details"]["type"] == "loop"

    line = ollama.Client(host=url).chat(model="smollm2", messages=[
        {"role": "user", "content": LOOPING}], options={"temperature": 0, "num_predict": CAP})
    assert line.done_reason == "loop" and line.eval_count < CAP


@pytest.mark.slow
def test_a_bad_header_is_a_400_in_each_shape(url):
    bad = {HEADER: "sometimes"}
    chat = httpx.post(f"{url}/v1/chat/completions", headers=bad, timeout=60,
                      json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == HEADER
    messages = httpx.post(f"{url}/v1/messages", headers=bad, timeout=60,
                          json={"model": "smollm2", "max_tokens": 8,
                                "messages": [{"role": "user", "content": "hi"}]})
    assert messages.status_code == 400
    assert messages.json()["error"]["type"] == "invalid_request_error"
    assert HEADER in messages.json()["error"]["message"]
