"""Every `model` a request names that is not a model gets one answer, and no
request makes the server look at a path (issue #20 finding 12). The CLI
still takes paths."""

import os
from pathlib import Path

import httpx
import pytest

from conftest import REPO, smollm2_file
from llmctl.errors import ModelNotFound
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.pool.model_pool import ModelPool
from llmctl.store.resolve import UNKNOWN_MODEL, resolve_model

MSG = [{"role": "user", "content": "hi"}]


def _names() -> list[str]:
    # Files that exist (relative to the server's working directory, the
    # repository, and absolute), paths that do not, and plain unknown names.
    return ["scripts/llmctl", "scripts/nope", "x.gguf/", "x.gguf", "README.md", "tests",
            str(REPO / "scripts" / "llmctl"), str(smollm2_file()), "/etc/passwd",
            "../x.gguf", "~", "~/x.gguf", "C:\\x.gguf", "no-such-model", "nope:latest",
            "smollm3", "./smollm2"]


def test_every_unknown_name_gets_byte_identical_errors_on_both_apis(server):
    assert Path("scripts/llmctl").exists()       # the server's cwd is this one
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for path, body, status in (
                ("/v1/chat/completions", {"messages": MSG}, 404),
                ("/api/chat", {"messages": MSG, "stream": False}, 404),
                ("/api/show", {}, 404),
                ("/tokenize", {"content": "hi"}, 404)):
            answers = {}
            for name in _names():
                r = http.post(path, json={**body, "model": name})
                assert r.status_code == status, (path, name, r.text)
                answers[name] = r.content
            assert len(set(answers.values())) == 1, (path, answers)
            error = r.json()["error"]
            assert (error["message"] if isinstance(error, dict) else error) == UNKNOWN_MODEL
            if isinstance(error, dict):
                assert error["code"] == "model_not_found" and error["param"] == "model"
        for name in ("smollm2", "smollm2:latest"):       # models still answer
            r = http.post("/v1/chat/completions",
                          json={"model": name, "messages": MSG, "max_tokens": 1})
            assert r.status_code == 200, (name, r.text)


def test_resolving_a_request_name_never_stats_it(monkeypatch):
    pool = ModelPool(LoadOptions(), memory_budget=1 << 40)
    seen: list[str] = []
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        seen.append(os.fspath(path) if not isinstance(path, int) else "")
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    try:
        for name in _names():
            with pytest.raises(ModelNotFound) as e:
                pool.resolve(name)
            assert e.value.message == UNKNOWN_MODEL and e.value.param == "model"
        stem = [n for n in _names() if n not in ("~",)]
        assert not [p for p in seen if any(p.endswith(n.rstrip("/")) for n in stem)], seen
    finally:
        pool.close()


def test_the_cli_still_takes_paths():
    path = smollm2_file()
    resolved = resolve_model(str(path))
    assert resolved.path == path and resolved.name == path.stem
    with pytest.raises(ModelNotFound, match="model file not found"):
        resolve_model("missing.gguf")
