"""`--spec auto` on a verbatim run: asked for 60 lines of code back with
one change, the default model copies most of its prompt, and auto must
guess those runs as forced n-gram guessing does (docs/speculation.md), on
the default model and the default settings, as a user runs it. Counted
from the server's own /stats: accepted guesses, and so fewer decode steps
than the tokens generated (each plain step makes one token)."""

from __future__ import annotations

import httpx
import pytest

from conftest import ServerProcess

MODEL = "qwen2.5-coder-1.5b"

CODE = "\n".join(
    [f"def compute_total_{i}(items, rate={i}):\n"
     f"    subtotal = sum(item.price * item.count for item in items)\n"
     f"    return round(subtotal * (1 + rate / 100), 2)\n"
     for i in range(12)]
    + ["class Ledger:\n"
       "    def __init__(self):\n"
       "        self.entries = []\n\n"
       "    def add(self, name, amount):\n"
       "        self.entries.append((name, amount))\n\n"
       "    def balance(self):\n"
       "        return sum(amount for _, amount in self.entries)\n"])
PROMPT = ("Rename the method `balance` to `total` in this Python code, changing nothing "
          "else. Reply with the whole code only.\n\n" + CODE)


@pytest.fixture(scope="module")
def url(session_home):
    srv = ServerProcess([MODEL, "--ctx-size", "4096", "--max-num-seqs", "1"],
                        env={"LLMCTL_HOME": str(session_home)})
    try:
        yield srv.wait_ready(900).url
    finally:
        srv.stop()


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/stats", timeout=30).json()["models"][MODEL]


@pytest.mark.slow
def test_auto_guesses_a_verbatim_copy_and_saves_steps(url):
    assert 55 <= len(CODE.splitlines()) <= 65
    before = _stats(url)
    r = httpx.post(f"{url}/v1/chat/completions", timeout=900, json={
        "model": MODEL, "temperature": 0, "max_tokens": 1024,
        "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200, r.text
    answer = r.json()
    text = answer["choices"][0]["message"]["content"]
    assert "def total(self)" in text and "compute_total_11" in text
    after = _stats(url)
    generated = after["generation_tokens"] - before["generation_tokens"]
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert generated == answer["usage"]["completion_tokens"] > 400
    # Most of the answer is the prompt again: auto checks those runs and
    # keeps them, so the answer takes well under one step a token.
    steps = generated - accepted
    assert accepted >= generated // 3, (accepted, generated)
    assert steps < generated * 2 // 3
