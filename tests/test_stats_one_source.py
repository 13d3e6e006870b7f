"""/metrics, /stats and chat's /stats read one snapshot of the engine's
counters, so after the same requests they report the same numbers."""

from __future__ import annotations

import asyncio
import re

import httpx

from conftest import smollm2_file
from llmctl.cli.chat import slash
from llmctl.runtime.chat_session import ChatSession
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.app import create_app
from llmctl.server.state import ServerState
from llmctl.store.resolve import ResolvedModel


def _metric(text: str, name: str) -> int:
    m = re.search(rf"^llmctl_{name} (\d+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return int(m.group(1))


def test_metrics_stats_and_chat_stats_agree(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMCTL_HOME", str(tmp_path))
    llm = LLM(ResolvedModel("smollm2", smollm2_file(), context=512),
              LoadOptions(max_num_seqs=2, max_num_batched_tokens=128, prefix_cache_size_gb=0))
    try:
        session = ChatSession(llm=llm, params=SamplingParams(temperature=0, max_tokens=12),
                              system="You are terse. " * 20)
        session.answer("Name a colour.")
        session.answer("Name another one.")     # the second turn reuses the first's KV

        app = create_app(ServerState.serving(llm))

        async def read():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                return (await c.get("/metrics")).text, (await c.get("/stats")).json()

        metrics, stats = asyncio.run(read())
        chat_text, _ = slash(session, "/stats")
    finally:
        llm.close()

    snapshot = llm.stats()
    assert snapshot.requests["ok"] == 2 and snapshot.cached_tokens > 0
    expected = {"prompt_tokens_total": snapshot.prompt_tokens,
                "prefix_cache_hit_tokens_total": snapshot.cached_tokens,
                "generation_tokens_total": snapshot.generation_tokens}
    assert {k: _metric(metrics, k) for k in expected} == expected
    assert (stats["prompt_tokens"], stats["prefix_cache_hit_tokens"], stats["generation_tokens"],
            stats["requests"]["ok"]) == (snapshot.prompt_tokens, snapshot.cached_tokens,
                                         snapshot.generation_tokens, 2)
    assert (f"session: 2 answers, prompt {snapshot.prompt_tokens} tok "
            f"({snapshot.cached_tokens} cached), generated {snapshot.generation_tokens} tok"
            in chat_text)
