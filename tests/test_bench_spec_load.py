"""scripts/bench_spec_load.py's switch, on the shared SmolLM2 engine: off
is `--spec off` (no proposals, no hooks, no room for guesses), on is the
loaded `--spec auto` again, and the greedy texts of a batch are the same
either way on the exact default."""

from __future__ import annotations

import pytest

from conftest import script_module


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_spec_load") as module:
        yield module


def test_switch_turns_auto_off_and_back(llm, bench, monkeypatch):
    for owner, name in bench.TIMED:     # put back as they were after the test
        monkeypatch.setattr(owner, name, getattr(owner, name))
    bench.install_timers()
    switch = bench.Switch(llm)
    batch = bench.prompts(llm, 4, seed=0)
    assert all(len(p) <= bench.PROMPT_TOKENS for p in batch)
    try:
        switch.set("off")
        off = bench.run(llm, batch, 4, 64)
        switch.set("auto")
        auto = bench.run(llm, batch, 4, 64)
    finally:
        switch.set("auto")
    assert off["hooks_s"] == 0 and off["declined"] == 0 and off["spec_steps"] == 0
    assert auto["hooks_s"] > 0
    assert auto["declined"] + auto["spec_steps"] > 0
    assert auto["texts"] == off["texts"]
    assert llm.engine.spec is switch.on[0]
