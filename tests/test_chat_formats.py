"""Templates you can trust (issue 26): a GGUF without a chat template gets
its architecture's llama.cpp built-in format where its vocabulary speaks
one, and is otherwise refused with one line, by `run`, `chat` and every chat
endpoint, while `run --raw` and /v1/completions still serve it. Never a
silent ChatML.

The fixtures are SmolLM2 copies with their metadata rewritten in place (a
key or a token renamed to one of the same length, so nothing moves and the
file still loads); llmctl's own GGUF reader checks the result."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from conftest import ServerProcess, smollm2_file
from llmctl.cli.app import app
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.store.gguf_header import read_header
from llmctl.store.index import StoreIndex

FAST = ["--max-tokens", "8", "--temperature", "0", "--ctx-size", "512"]
LOAD = LoadOptions(ctx_size=512, max_num_seqs=1, prefix_cache=False)
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Write a haiku about autumn."}]
runner = CliRunner()


KEY = (b"tokenizer.chat_template", b"tokenizer.chat_templatX")
MARKER = (b"<|im_start|>", b"<|xx_start|>")


@pytest.fixture(scope="module")
def offsets() -> dict[bytes, int]:
    """Where SmolLM2's template key and its <|im_start|> token's text lie in
    the file: each is a GGUF string, its uint64 length before it."""
    head = smollm2_file().read_bytes()[:16 << 20]
    found = {}
    for text, _ in (KEY, MARKER):
        at = head.find(struct.pack("<Q", len(text)) + text)
        assert at > 0, text
        found[text] = at + 8
    return found


def rewritten(target: Path, offsets: dict[bytes, int], *renames: tuple[bytes, bytes]) -> Path:
    """SmolLM2 with each (old, new) rename made in place: the same length,
    so nothing after it moves."""
    shutil.copyfile(smollm2_file(), target)
    with open(target, "r+b") as f:
        for old, new in renames:
            assert len(old) == len(new)
            f.seek(offsets[old])
            assert f.read(len(old)) == old
            f.seek(offsets[old])
            f.write(new)
    header = read_header(target, keep_arrays=("tokenizer.ggml.tokens",))
    assert "tokenizer.chat_template" not in header.metadata
    return target


@pytest.fixture(scope="module")
def speaks_chatml(tmp_path_factory, offsets) -> Path:
    """No tokenizer.chat_template; the vocabulary still has ChatML's markers."""
    return rewritten(tmp_path_factory.mktemp("fmt") / "no-template.gguf", offsets, KEY)


@pytest.fixture(scope="module")
def base_model(tmp_path_factory, offsets) -> Path:
    """No template, and <|im_start|> renamed: it speaks no format at all."""
    return rewritten(tmp_path_factory.mktemp("fmt") / "base.gguf", offsets, KEY, MARKER)


def test_gemma3_gets_gemmas_turns_never_chatml():
    """The gemma3-270m GGUF has no template: llama.cpp's `gemma` format."""
    with LLM.load("gemma3-270m", LOAD) as llm:
        assert (llm.template_source.origin, llm.template_source.text) == ("builtin", "gemma")
        prompt = llm.template.render(MESSAGES)
    assert prompt.startswith("<start_of_turn>user\nBe brief.")
    assert prompt.endswith("<end_of_turn>\n<start_of_turn>model\n")
    run = runner.invoke(app, ["run", "gemma3-270m", "Write a haiku about autumn.", *FAST])
    assert run.exit_code == 0, run.output
    assert "<|im_start|>" not in run.stdout and "<|im_end|>" not in run.stdout
    # models.toml calls it a base model, and the user is told so.
    assert "base model" in run.stderr
    shown = runner.invoke(app, ["show", "gemma3-270m", "--json"])
    assert '"kind": "base"' in shown.stdout and "built-in 'gemma' format" in shown.stdout


def test_a_templateless_gguf_gets_the_format_its_vocabulary_speaks(speaks_chatml):
    with LLM.load(str(speaks_chatml), LOAD) as llm:
        assert (llm.template_source.origin, llm.template_source.text) == ("builtin", "chatml")
        prompt = llm.template.render(MESSAGES)
        assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                          "Write a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n")
        answer = llm.complete(llm.chat_tokens(MESSAGES), SamplingParams(temperature=0,
                                                                         max_tokens=8))
    assert answer.text and "<|im_start|>" not in answer.text
    shown = runner.invoke(app, ["show", str(speaks_chatml)])
    assert "built-in 'chatml'" in shown.stdout


def test_a_model_without_any_format_is_refused_in_one_line(base_model):
    for command in (["run", str(base_model), "Hi", *FAST], ["chat", str(base_model), *FAST]):
        result = runner.invoke(app, command, input="Hi\n")
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "base model" in lines[0], lines
        assert "run --raw" in lines[0] and "/v1/completions" in lines[0]
    raw = runner.invoke(app, ["run", str(base_model), "The capital of France is", "--raw", *FAST])
    assert raw.exit_code == 0 and raw.stdout.strip(), raw.output
    shown = runner.invoke(app, ["show", str(base_model)])
    assert "none: a base model" in shown.stdout


@pytest.fixture(scope="module")
def base_server(base_model, tmp_path_factory):
    home = tmp_path_factory.mktemp("base-home")
    StoreIndex(home).register_file("base-fixture", base_model)
    srv = ServerProcess(["base-fixture", "--ctx-size", "512", "--max-num-seqs", "2"],
                        env={"LLMCTL_HOME": str(home)})
    try:
        yield srv.wait_ready(300).url
    finally:
        srv.stop()


def test_every_chat_endpoint_refuses_a_base_model_and_completions_serve_it(base_server):
    chat = {"model": "base-fixture", "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hi"}]}
    openai = httpx.post(f"{base_server}/v1/chat/completions", json=chat, timeout=60)
    assert openai.status_code == 400 and "base model" in openai.json()["error"]["message"]
    anthropic = httpx.post(f"{base_server}/v1/messages", json=chat, timeout=60,
                           headers={"anthropic-version": "2023-06-01"})
    assert anthropic.status_code == 400, anthropic.text
    assert anthropic.json()["type"] == "error" and "base model" in anthropic.text
    ollama = httpx.post(f"{base_server}/api/chat", json={**chat, "stream": False}, timeout=60)
    assert ollama.status_code == 400 and "base model" in ollama.json()["error"]
    done = httpx.post(f"{base_server}/v1/completions", timeout=60,
                      json={"model": "base-fixture", "prompt": "The capital of France is",
                            "max_tokens": 8, "temperature": 0})
    assert done.status_code == 200 and done.json()["choices"][0]["text"].strip()
