"""One `llmctl serve` with no model on its command line, serving SmolLM2 and
Gemma 3 270M on demand under a memory budget that fits only one of them:
requests alternate, idle models unload after their keep-alive, `llmctl ps`
agrees with /api/ps, `llmctl stop` unloads, and a long prefix computed
before an unload is a disk hit after the reload."""

import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from llmctl.bench.launcher import Server
from llmctl.cli.serve import MOVE_CACHED_RUNS
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.pool.model_pool import estimate_bytes
from llmctl.store.resolve import resolve_model

MODELS = ("smollm2", "gemma3-270m")
ARGS = ["--ctx-size", "1024", "--max-num-seqs", "2", "--threads", "1"]
LONG = "You are a careful assistant who answers in one short sentence. " * 24


@pytest.fixture(autouse=True)
def _no_model_at_start(monkeypatch):
    # These servers start with no model, loading each on demand; conftest's
    # LLMCTL_MODEL would fill serve's MODEL argument and load one at start.
    monkeypatch.delenv("LLMCTL_MODEL", raising=False)


@pytest.fixture(scope="module")
def budget(session_home):
    # As the server loads them: serve's defaults include moving cached runs.
    opts = LoadOptions(ctx_size=1024, max_num_seqs=2, move_cached_runs=MOVE_CACHED_RUNS)
    sizes = [estimate_bytes(resolve_model(m), opts) for m in MODELS]
    return max(sizes) + (8 << 20)       # one model fits, never both


@pytest.fixture(scope="module")
def multi(session_home, budget):
    with Server.llmctl_serve(*ARGS, "--memory-budget", str(budget), "--keep-alive", "10m",
                             env={"LLMCTL_HOME": str(session_home)}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(multi):
    return openai.OpenAI(base_url=multi.url + "/v1", api_key="unused", max_retries=0)


def loaded(srv) -> list[str]:
    return [m["name"] for m in httpx.get(srv.url + "/api/ps", timeout=30).json()["models"]]


def llmctl(*args, home):
    env = {**os.environ, "LLMCTL_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "llmctl", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def ask(client, model, content="Say hi.", **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user",
                                                                  "content": content}],
                                          max_tokens=4, temperature=0, **kw)


def test_starts_empty_and_healthy(multi):
    assert httpx.get(multi.url + "/health").json()["status"] == "ok"
    assert loaded(multi) == []


def test_requests_alternate_between_models_swapping_under_the_budget(multi, client):
    for model in MODELS + MODELS:
        r = ask(client, model)
        assert r.model == model and r.choices[0].message.content is not None
        assert loaded(multi) == [model]


def test_concurrent_requests_to_both_models_all_succeed(multi, client):
    # Each waits for the other model to go idle; none fails.
    with cf.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda m: ask(client, m).model, MODELS * 3))
    assert answers == list(MODELS * 3)


def test_llmctl_ps_agrees_with_api_ps(multi, client, session_home):
    ask(client, "smollm2")
    shown = llmctl("ps", "--url", multi.url, "--json", home=session_home)
    assert shown.returncode == 0, shown.stderr
    api = httpx.get(multi.url + "/api/ps").json()["models"]
    cli = json.loads(shown.stdout)["models"]
    assert [(m["name"], m["size"], m["context_length"]) for m in cli] == \
        [(m["name"], m["size"], m["context_length"]) for m in api] == [("smollm2", api[0]["size"], 1024)]
    table = llmctl("ps", "--url", multi.url, home=session_home)
    assert "smollm2" in table.stdout and "1024" in table.stdout


def test_llmctl_stop_unloads_and_says_when_not_loaded(multi, client, session_home):
    ask(client, "smollm2")
    stopped = llmctl("stop", "smollm2", "--url", multi.url, home=session_home)
    assert stopped.returncode == 0 and "unloaded smollm2" in stopped.stderr
    assert loaded(multi) == []
    again = llmctl("stop", "smollm2", "--url", multi.url, home=session_home)
    assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1
    assert "not loaded" in again.stderr and "Traceback" not in again.stderr
    gone = llmctl("ps", "--url", "http://127.0.0.1:9", home=session_home)
    assert gone.returncode != 0 and "cannot reach" in gone.stderr


def test_a_request_keep_alive_unloads_the_idle_model(multi, client):
    ask(client, "gemma3-270m", extra_body={"keep_alive": "1s"})
    deadline = time.monotonic() + 60
    while loaded(multi) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert loaded(multi) == []


def test_a_prefix_computed_before_an_unload_is_a_disk_hit_after_the_reload(multi, client):
    first = ask(client, "smollm2", LONG + "Name a colour.")
    assert first.usage.prompt_tokens > 256
    httpx.post(multi.url + "/api/generate", json={"model": "smollm2", "keep_alive": 0})
    assert loaded(multi) == []
    stats = httpx.get(multi.url + "/stats").json()
    again = ask(client, "smollm2", LONG + "Name a fruit.")
    after = httpx.get(multi.url + "/stats").json()
    assert again.usage.prompt_tokens_details.cached_tokens >= 256
    assert after["prefix_cache_hit_tokens_disk"] - stats["prefix_cache_hit_tokens_disk"] >= 256


def test_unknown_models_and_paths_are_404_naming_the_field(multi):
    for model in ("no-such-model", "/etc/passwd", "../x.gguf"):
        r = httpx.post(multi.url + "/v1/chat/completions",
                       json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text


def test_a_model_over_the_budget_is_507_with_figures(session_home):
    with Server.llmctl_serve(*ARGS, "--memory-budget", "50MB",
                             env={"LLMCTL_HOME": str(session_home)}) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                       json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 507 and "budget is 0.05 GB" in r.json()["error"]["message"]
        assert srv.returncode is None          # the server lives on
