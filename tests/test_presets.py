"""Presets (issue 26): `[presets.NAME]` tables of the config file, each a
model plus sampling defaults, a system prompt, a template override and its
variables. Checked as a user meets them: a bad preset is one line naming
file:line:key, `llmctl run PRESET` applies the preset under the user's own
flags, completion offers preset names, and a real server gives two presets
over one model one load and one prefix cache, each preset's defaults, and
a request's own fields over both."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import ollama
import openai
import pytest
from typer.testing import CliRunner

from conftest import ServerProcess
from llmctl.cli.app import app
from llmctl.config_file import load_config
from llmctl.presets import load_presets
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.openai.request import parse_request

runner = CliRunner()
# SmolLM2 answers "Hi" with far more than a few tokens at temperature 0, so a
# completion's length says which max-tokens won.
PRESETS = """\
[presets.terse]
model = "smollm2"
description = "short answers"
temperature = 0
max-tokens = 3
stop = ["\\n\\n\\n"]
min-p = 0.1

[presets.chatty]
model = "smollm2"
system = "You are a pirate."
temperature = 0.9
max-tokens = 8
"""


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "config.toml"
    monkeypatch.setenv("LLMCTL_CONFIG", str(path))
    for name in ("LLMCTL_MAX_TOKENS", "LLMCTL_TEMPERATURE"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_presets_parse_and_layer_between_request_and_server(config):
    config.write_text(PRESETS)
    presets = load_presets(load_config())
    terse = presets["terse"]
    assert (terse.model, terse.description, terse.system) == ("smollm2", "short answers", None)
    assert terse.sampling == {"temperature": 0, "max_tokens": 3, "stop": ("\n\n\n",),
                              "min_p": 0.1}
    server = SamplingParams(top_k=7)
    defaults = terse.params(server)
    messages = [{"role": "user", "content": "hi"}]
    # A request's own field > the preset's > the server's default.
    asked = parse_request({"messages": messages, "max_tokens": 50}, True, defaults).params
    assert (asked.max_tokens, asked.temperature, asked.top_k) == (50, 0, 7)
    plain = parse_request({"messages": messages}, True, defaults).params
    assert (plain.max_tokens, plain.stop, plain.min_p) == (3, ("\n\n\n",), 0.1)
    shown = json.loads(runner.invoke(app, ["config", "show", "--json"]).stdout)["presets"]
    assert shown["terse"] == {"model": "smollm2", "description": "short answers",
                              "source": f"{config}:1"}
    chatty = presets["chatty"]
    assert chatty.with_system(messages)[0] == {"role": "system", "content": "You are a pirate."}
    own = [{"role": "system", "content": "mine"}, *messages]
    assert chatty.with_system(own) == own


@pytest.mark.parametrize("body, line, says", [
    ('[presets.a]\nmodel = "smollm2"\ntemprature = 0\n', 3,
     "presets.a.temprature: no preset has this key"),
    ('[presets.a]\nmodel = "smollm2"\n\ntemperature = "hot"\n', 4,
     "presets.a.temperature: bad value 'hot'"),
    ('[presets.a]\nmodel = "smollm2"\nmax-tokens = 0\n', 3, "presets.a.max-tokens: bad value 0"),
    ('[presets.a]\nsystem = "x"\n', 1, "presets.a.model: a preset needs a model"),
    ('[presets.a]\nmodel = "smollm2"\n[presets.b]\nmodel = "a"\n', 4,
     "presets.b.model: 'a' is a preset"),
    ('[presets.smollm2]\nmodel = "smollm2"\n', 2, "'smollm2' is a models.toml model"),
    ('[presets.a]\nmodel = "smollm2"\ntemplate = "{% for %}"\n', 3,
     "presets.a.template: invalid chat template"),
    ('[presets.a]\nmodel = "smollm2"\nchat-template-kwargs = { messages = 1 }\n', 3,
     "'messages' is set by llmctl itself"),
])
def test_a_bad_preset_is_one_line_naming_file_line_and_key(config, body, line, says):
    config.write_text(body)
    for command in (["config", "show"], ["run", "smollm2", "Hi"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {config}:{line}: "), lines
        assert says in lines[0]


def _run(*args: str, env: dict[str, str] | None = None) -> dict:
    result = runner.invoke(app, ["run", *args, "--ctx-size", "256", "--json"], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_run_applies_a_preset_under_the_users_flags(config):
    # The config file's [run] table loses to the preset; a flag and a
    # variable the user set win over it.
    config.write_text("[run]\nmax-tokens = 5\n" + PRESETS)
    first = _run("terse", "Hi")
    assert (first["completion_tokens"], first["finish_reason"]) == (3, "length")
    assert _run("terse", "Hi", "--max-tokens", "2")["completion_tokens"] == 2
    assert _run("terse", "Hi", env={"LLMCTL_MAX_TOKENS": "4"})["completion_tokens"] == 4
    assert _run("smollm2", "Hi", "--temperature", "0")["completion_tokens"] == 5
    # Greedy, as the preset says: the same answer twice.
    assert _run("terse", "Hi")["text"] == first["text"]


def _chat_stats(*args: str) -> str:
    result = runner.invoke(app, ["chat", *args, "--ctx-size", "256", "--seed", "1"],
                           input="Hi\n/stats\n")
    assert result.exit_code == 0, result.output
    return next(line for line in result.stdout.splitlines() if line.startswith("prompt "))


def test_chat_applies_a_presets_defaults_and_system_prompt(config):
    config.write_text(PRESETS)
    assert "generated 3 tok" in _chat_stats("terse")
    # The preset's system prompt is the one --system would give.
    prompt = _chat_stats("chatty", "--max-tokens", "1").split(" tok")[0]
    assert prompt == _chat_stats("smollm2", "--system", "You are a pirate.",
                                 "--max-tokens", "1").split(" tok")[0]
    assert prompt != _chat_stats("smollm2", "--max-tokens", "1").split(" tok")[0]


def test_completion_offers_preset_names(config):
    config.write_text(PRESETS)
    result = runner.invoke(app, [], prog_name="llmctl", env={
        "_LLMCTL_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
        "_TYPER_COMPLETE_ARGS": "llmctl chat "})
    assert result.exit_code == 0, result.output
    names = result.output.split()
    assert {"terse", "chatty", "smollm2"} <= set(names)
    assert names.index("terse") < names.index("smollm2")


SERVED = """\
[presets.strict]
model = "smollm2"
temperature = 0
system = "Answer in one word."

[presets.creative]
model = "smollm2"
temperature = 0.9
max-tokens = 8

[presets.bare]
model = "smollm2"
system = "S. "
template = "{{ lead }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
chat-template-kwargs = { lead = "Q: " }
"""
# Long enough that the prefix cache keeps some of it for the second preset.
SHARED = [{"role": "system", "content": "You are a careful assistant. " * 20},
          # An answer that cannot end within 8 tokens.
          {"role": "user", "content": "Count from 1 to 100, separated by commas."}]


@pytest.fixture(scope="module")
def url(session_home, tmp_path_factory):
    path = tmp_path_factory.mktemp("presets") / "config.toml"
    path.write_text(SERVED)
    srv = ServerProcess(["strict", "--ctx-size", "1024", "--max-num-seqs", "2",
                         "--max-num-batched-tokens", "256"],
                        env={"LLMCTL_HOME": str(session_home), "LLMCTL_CONFIG": str(path)})
    try:
        yield srv.wait_ready(600).url
    finally:
        srv.stop()


@pytest.mark.slow
def test_two_presets_share_one_model_and_its_prefix_cache(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    # temperature 0 (the request's own, over the preset's 0.9) keeps the
    # answer from ending by chance before the preset's 8 tokens.
    first = client.chat.completions.create(model="creative", messages=SHARED, temperature=0)
    assert first.model == "creative"
    assert (first.choices[0].finish_reason, first.usage.completion_tokens) == ("length", 8)
    # The other preset, the same messages: the same model's cache, the request's max_tokens.
    second = client.chat.completions.create(model="strict", messages=SHARED, max_tokens=3)
    assert second.model == "strict" and second.usage.completion_tokens <= 3
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    again = client.chat.completions.create(model="strict", messages=SHARED, max_tokens=3)
    assert again.choices[0].message.content == second.choices[0].message.content  # greedy
    assert len(httpx.get(url + "/api/ps").json()["models"]) == 1
    ids = {m.id for m in client.models.list()}
    assert {"strict", "creative", "bare"} <= ids
    local = ollama.Client(host=url)
    assert {"strict", "creative"} <= {m.model for m in local.list().models}
    reply = local.chat(model="creative", messages=SHARED[1:], options={"temperature": 0})
    assert reply.model == "creative" and reply.eval_count <= 8 and reply.done_reason == "length"
    assert len(httpx.get(url + "/api/ps").json()["models"]) == 1
    # The chat page picks presets like models, loaded when their model is.
    page = {m["name"]: m for m in httpx.get(url + "/webui/models").json()["models"]}
    assert page["creative"]["loaded"] and page["creative"]["preset_of"] == "smollm2"


@pytest.mark.slow
def test_every_protocol_takes_a_preset(url):
    anthropic = httpx.post(url + "/v1/messages", json={
        "model": "creative", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert anthropic.status_code == 200 and anthropic.json()["model"] == "creative"
    responses = httpx.post(url + "/v1/responses", json={"model": "creative", "input": "Hi"},
                           timeout=60).json()
    assert responses["model"] == "creative" and responses["usage"]["output_tokens"] <= 8
    vectors = httpx.post(url + "/v1/embeddings", json={"model": "creative", "input": "Hi"})
    assert vectors.status_code == 200 and vectors.json()["model"] == "creative"
    shown = httpx.post(url + "/api/show", json={"model": "strict"}).json()
    assert shown["system"] == "Answer in one word."


@pytest.mark.slow
def test_a_presets_template_variables_and_system_prompt(url):
    # bare renders "{lead}{contents}": its system prompt first, then the user's turn.
    chat = httpx.post(url + "/v1/chat/completions", json={
        "model": "bare", "max_tokens": 1, "messages": [{"role": "user", "content": "hello"}]})
    text = httpx.post(url + "/v1/completions", json={
        "model": "smollm2", "max_tokens": 1, "prompt": "Q: S. hello"})
    assert chat.status_code == 200 and text.status_code == 200
    assert chat.json()["usage"]["prompt_tokens"] == text.json()["usage"]["prompt_tokens"]
    # A request that brings its own system message keeps it instead.
    own = httpx.post(url + "/v1/chat/completions", json={
        "model": "bare", "max_tokens": 1,
        "messages": [{"role": "system", "content": "Be kind and brief. "},
                     {"role": "user", "content": "hello"}]})
    own_text = httpx.post(url + "/v1/completions", json={
        "model": "smollm2", "max_tokens": 1, "prompt": "Q: Be kind and brief. hello"})
    assert own.json()["usage"]["prompt_tokens"] == own_text.json()["usage"]["prompt_tokens"]
