"""The default model answers simple questions: twenty held-out prompts
(bench/simple_prompts.py) asked through `llmctl chat` as a user pipes
them, at temperature 0, with no model named."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from llmctl.bench.simple_prompts import PROMPTS, SimplePrompt
from llmctl.cli.app import app
from llmctl.store.registry import load_registry
from llmctl.store.resolve import default_model_name

CLEARED = "Conversation cleared.\n"


def test_the_checks_tell_right_from_wrong():
    capital = SimplePrompt("fact", "?", r"\btokyo\b")
    assert capital.passes("The capital of Japan is Tokyo.")
    assert not capital.passes("Kyoto")
    division = next(p for p in PROMPTS if "144" in p.prompt)
    assert division.passes("144 / 12 = 12") and not division.passes("It is 12, or maybe 13.")
    shout = next(p for p in PROMPTS if "capital letters" in p.prompt)
    assert shout.passes("HELLO") and not shout.passes("hello")
    assert len(PROMPTS) == 20 and {p.kind for p in PROMPTS} == {"fact", "arithmetic",
                                                               "instruction"}


def test_the_default_is_an_instruct_model_and_the_variable_overrides_it(monkeypatch):
    monkeypatch.delenv("LLMCTL_MODEL", raising=False)
    registry = load_registry()
    assert registry.get(default_model_name()).kind == "instruct"
    monkeypatch.setenv("LLMCTL_MODEL", "qwen2.5-coder-0.5b")
    assert default_model_name() == "qwen2.5-coder-0.5b"


@pytest.mark.slow
def test_the_default_model_answers_17_of_20_simple_prompts(monkeypatch):
    monkeypatch.delenv("LLMCTL_MODEL", raising=False)
    piped = "".join(f"{p.prompt}\n/clear\n" for p in PROMPTS)
    result = CliRunner().invoke(app, ["chat", "--temperature", "0", "--max-tokens", "256",
                                      "--ctx-size", "1024"], input=piped)
    assert result.exit_code == 0, result.output
    answers = result.stdout.split(CLEARED)[:-1]
    assert len(answers) == len(PROMPTS), result.stdout
    wrong = [(p.prompt, a.strip()) for p, a in zip(PROMPTS, answers, strict=True)
             if not p.passes(a.strip())]
    assert len(PROMPTS) - len(wrong) >= 17, wrong
