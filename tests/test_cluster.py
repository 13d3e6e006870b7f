"""`llmctl cluster`: llmctl replicas on Ray Serve. One local Ray cluster and
one deployment (2 SmolLM2 replicas, 1 thread each, one shared disk cache)
serve every slow test in this module; the fault test runs last. The
deployment has llmctl serve's access policy on: an API key, one allowed
origin and a 1 MiB body cap."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from near_tie import assert_greedy_agree, top_from_openai

from conftest import smollm2_file, wait_until
from llmctl.cluster.affinity import AFFINITY_CHARS, affinity_key, owner

# ~600 SmolLM2 tokens: more than two 256-token blocks, so the disk cache keys on it.
TENANT = ("You are the support assistant of the Acme {n} company. Answer briefly. " * 40).strip()
WAIT_S = 120    # hang guard for polling, never a performance bound
KEY = "cluster-s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "https://app.example.com"
CAP = 1 << 20   # the deployment's body cap


def _chat(system: str, user: str = "Hi", **extra) -> dict:
    return {"model": "smollm2", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}], **extra}


def _poll(fn, what: str):
    return wait_until(fn, what, WAIT_S, interval=0.5)


# ---- no cluster needed --------------------------------------------------------


def test_single_machine_commands_never_import_ray():
    probe = ("import sys, json\n"
             "import llmctl.cli.app, llmctl.cli.serve, llmctl.cli.run, llmctl.cli.chat\n"
             "import llmctl.cli.cluster, llmctl.server.startup, llmctl.runtime.llm\n"
             "import llmctl.cluster.affinity\n"
             "before = 'ray' in sys.modules\n"
             "import llmctl.cluster.router\n"
             "print(json.dumps([before, 'ray' in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # The router does import Ray, so the first False means something.
    assert json.loads(out.stdout.splitlines()[-1]) == [False, True]


def test_affinity_key_follows_the_leading_text():
    a, b = TENANT.format(n=1), TENANT.format(n=2)
    assert affinity_key(_chat(a, "one")) == affinity_key(_chat(a, "two"))
    assert affinity_key(_chat(a)) != affinity_key(_chat(b))
    assert affinity_key({"model": "smollm2", "prompt": a}) == \
        affinity_key({"model": "smollm2", "prompt": a + " and more"})
    # Past AFFINITY_CHARS nothing counts; another model never shares a key.
    long = "x" * AFFINITY_CHARS
    assert affinity_key({"prompt": long + "a"}) == affinity_key({"prompt": long + "b"})
    assert affinity_key({"model": "m1", "prompt": a}) != affinity_key({"model": "m2", "prompt": a})
    assert affinity_key({"model": "smollm2"}) is None and affinity_key([1]) is None


def test_agents_protocols_and_their_cache_hint_key_the_route():
    a, b = TENANT.format(n=1), TENANT.format(n=2)
    msgs = [{"role": "user", "content": "hi"}]
    # Anthropic's system and Responses' instructions lead the prompt.
    assert affinity_key({"model": "m", "system": a, "messages": msgs}) != \
        affinity_key({"model": "m", "system": b, "messages": msgs})
    assert affinity_key({"model": "m", "instructions": a, "input": "one"}) == \
        affinity_key({"model": "m", "instructions": a, "input": "one"})
    assert affinity_key({"model": "m", "input": a}) != affinity_key({"model": "m", "input": b})
    # prompt_cache_key wins over the text: the client says what shares a prompt.
    hinted = {"model": "m", "instructions": a, "input": "x", "prompt_cache_key": "conv-7"}
    assert affinity_key(hinted) == affinity_key({**hinted, "instructions": b})
    assert affinity_key(hinted) != affinity_key({**hinted, "prompt_cache_key": "conv-8"})


def test_rendezvous_owner_moves_only_the_lost_replicas_keys():
    replicas = ["r1", "r2", "r3", "r4"]
    keys = [affinity_key({"prompt": f"tenant {n}"}) for n in range(200)]
    before = {k: owner(k, replicas) for k in keys}
    after = {k: owner(k, [r for r in replicas if r != "r2"]) for k in keys}
    assert set(before.values()) == set(replicas)
    assert all(after[k] == before[k] for k in keys if before[k] != "r2")


def testreplica_options_follow_the_settings():
    pytest.importorskip("ray.serve")
    from ray.serve.config import AutoscalingConfig

    from llmctl.cluster.deploy import ClusterSettings, replica_options
    from llmctl.cluster.replica import ReplicaSpec
    from llmctl.cluster.router import AffinityRouter
    from llmctl.errors import UsageError
    from llmctl.runtime.load_options import LoadOptions
    from llmctl.store.resolve import ResolvedModel

    spec = ReplicaSpec(ResolvedModel("smollm2", smollm2_file()), LoadOptions(threads=3, max_num_seqs=6))
    fixed = replica_options(spec, ClusterSettings(replicas=4))
    assert fixed["ray_actor_options"] == {"num_cpus": 3} and fixed["num_replicas"] == 4
    assert fixed["max_ongoing_requests"] == 6 and "autoscaling_config" not in fixed
    router = fixed["request_router_config"]
    assert router.get_request_router_class().__name__ == AffinityRouter.__name__
    assert router.request_router_kwargs == {"overload_at": 6}
    scaled = replica_options(spec, ClusterSettings(replicas=2, min_replicas=1, max_replicas=8,
                                                    router="default"))
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "initial_replicas": 2,
                                            "max_replicas": 8, "target_ongoing_requests": 6}
    assert "num_replicas" not in scaled and "request_router_config" not in scaled
    AutoscalingConfig(**scaled["autoscaling_config"])     # Ray accepts it as it is
    on_gpus = replica_options(ReplicaSpec(spec.resolved, spec.load, gpus=1),
                              ClusterSettings(replicas=2))
    assert on_gpus["ray_actor_options"] == {"num_cpus": 3, "num_gpus": 1}
    for bad in ({"replicas": 0}, {"router": "random"}, {"min_replicas": 1},
                {"replicas": 9, "min_replicas": 1, "max_replicas": 8}):
        with pytest.raises(UsageError):
            ClusterSettings(**bad)


# ---- one local cluster ----------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(session_home, tmp_path_factory):
    pytest.importorskip("ray.serve")
    os.environ["LLMCTL_HOME"] = str(session_home)
    from llmctl.cluster.deploy import ClusterSettings, start, stop
    from llmctl.cluster.replica import ReplicaSpec
    from llmctl.runtime.load_options import LoadOptions
    from llmctl.server.state import HttpPolicy
    from llmctl.store.resolve import ResolvedModel

    cache = tmp_path_factory.mktemp("shared-cache")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = ReplicaSpec(ResolvedModel("smollm2", smollm2_file(), context=2048),
                       LoadOptions(ctx_size=2048, threads=1, max_num_seqs=2),
                       cache_dir=str(cache), port=port,
                       policy=HttpPolicy(api_key=KEY, allowed_origins=(ORIGIN,), max_body_bytes=CAP))
    try:
        url = start(spec, ClusterSettings(replicas=2), object_store_mb=128)
        with httpx.Client(base_url=url, timeout=WAIT_S, headers=AUTH) as client:
            _poll(lambda: client.get("/health").json()["replicas_up"] == 2, "both replicas to report")
            yield client, cache
    finally:
        stop()


def _stats(client: httpx.Client) -> dict:
    return client.get("/cluster/stats").json()


def _live(client: httpx.Client) -> list[str]:
    return sorted(rid for rid, r in _stats(client)["replicas"].items() if r["live"])


@pytest.mark.slow
def test_openai_client_streams_through_the_ingress(cluster):
    from openai import OpenAI

    client, _ = cluster
    from openai import AuthenticationError

    base = str(client.base_url).rstrip("/") + "/v1"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    api = OpenAI(base_url=base, api_key=KEY, max_retries=0)
    stream = api.chat.completions.create(**_chat("Be brief.", "Count to five.", max_tokens=12,
                                                 stream=True))
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1 and "".join(pieces).strip()
    done = api.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=4)
    # Sampled (no temperature given): it may stop early, never run past 4.
    assert done.choices[0].text and 0 < done.usage.completion_tokens <= 4
    assert done.choices[0].finish_reason in ("length", "stop")
    assert [m.id for m in api.models.list().data] == ["smollm2"]
    # llmctl's own validation answers through the ingress, in OpenAI's shape.
    bad = client.post("/v1/chat/completions", json={"model": "smollm2", "messages": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.slow
def test_a_repeated_prefix_goes_to_the_same_replica(cluster):
    client, _ = cluster
    owners = {}
    for n in range(1, 4):
        served = {client.post("/v1/chat/completions", json=_chat(TENANT.format(n=n), f"q{q}"))
                  .headers["x-llmctl-replica"] for q in range(3)}
        assert len(served) == 1, f"tenant {n} went to {served}"
        owners[n] = served.pop()
    assert set(owners.values()) <= set(_live(client))
    routing = _stats(client)["routing"]
    assert routing["owner"] >= 9 and routing.get("overloaded", 0) == 0
    metrics = client.get("/metrics").text
    assert 'llmctl_router_decisions_total{decision="owner"}' in metrics


@pytest.mark.slow
def test_a_prefix_computed_on_one_replica_is_a_disk_hit_on_the_other(cluster, exactness):
    client, cache = cluster
    body = _chat(TENANT.format(n="disk"), "Who are you?", logprobs=True, top_logprobs=5)
    first = client.post("/v1/chat/completions", json=body)
    assert first.status_code == 200
    a = first.headers["x-llmctl-replica"]
    (b,) = [r for r in _live(client) if r != a]
    _poll(lambda: list(Path(cache).glob("prefix/*/*.kv")), "replica A's state on disk")
    second = client.post("/v1/chat/completions", json=body, headers={"x-llmctl-replica": b})
    assert second.headers["x-llmctl-replica"] == b
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 256
    # The hit computes the prompt's tail in other batch shapes: identical
    # where this machine's rows are exact, else the same up to a near-tie.
    ref, hit = first.json()["choices"][0], second.json()["choices"][0]
    content = ref["logprobs"]["content"]
    assert_greedy_agree(exactness(serve_default=True), [c["token"] for c in content],
                        hit["message"]["content"], top_from_openai(content),
                        ref["message"]["content"])
    disk = _poll(lambda: _stats(client)["replicas"][b]["prefix_cache_hit_tokens_disk"],
                 "replica B's disk hit in its report")
    assert disk >= 256
    metrics = client.get("/metrics").text
    assert f'llmctl_replica_prefix_cache_disk_hit_tokens_total{{replica="{b}"}} {disk}' in metrics


@pytest.mark.slow
def test_a_client_gone_mid_stream_cancels_the_generation_on_its_replica(cluster):
    client, _ = cluster
    body = {**_chat("Be verbose.", "Tell a long story.", max_tokens=400), "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        replica = r.headers["x-llmctl-replica"]
        before = _stats(client)["replicas"][replica]["requests"]["cancelled"]
        lines = r.iter_lines()
        assert next(line for line in lines if '"content"' in line)
    # Leaving the block closed the connection after the first token.
    _poll(lambda: _stats(client)["replicas"][replica]["requests"]["cancelled"] > before,
          "the replica to count the request cancelled")


# ---- llmctl serve's access policy, at the ingress (#20 finding 8) ---------------

GUARDED = [("POST", "/v1/chat/completions"), ("GET", "/cluster/stats"), ("GET", "/metrics"),
           ("GET", "/v1/models"), ("GET", "/-/routes")]


@pytest.mark.slow
def test_every_route_but_health_needs_the_key(cluster):
    client, _ = cluster
    with httpx.Client(base_url=client.base_url, timeout=WAIT_S) as bare:
        for method, path in GUARDED:
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
                r = bare.request(method, path, json=_chat("Hi"), headers=headers)
                assert r.status_code == 401, (path, r.text)
                assert r.json()["error"]["code"] == "invalid_api_key"
                assert "x-llmctl-replica" not in r.headers     # never forwarded
        ollama = bare.post("/api/chat", json=_chat("Hi"))
        assert ollama.status_code == 401 and isinstance(ollama.json()["error"], str)
        assert bare.get("/health").status_code == 200
    # /-/routes is answered by Ray's proxy itself: the policy runs there too.
    assert client.get("/-/routes").status_code == 200
    assert client.get("/cluster/stats").status_code == 200


@pytest.mark.slow
def test_a_replica_called_around_the_ingress_applies_the_same_policy(cluster):
    from ray import serve

    replicas = serve.get_deployment_handle("LLMReplica", app_name="llmctl").options(stream=True)

    def status(headers: list) -> int:
        gen = replicas.handle.remote("GET", "/v1/models", b"", headers, b"")
        head = next(iter(gen))
        gen.cancel()
        return head["status"]

    assert status([]) == 401
    assert status([("authorization", f"Bearer {KEY}")]) == 200


@pytest.mark.slow
@pytest.mark.parametrize("headers", [{"Origin": "https://evil.example"},
                                     {"Origin": "null"},
                                     {"Host": "rebind.evil.example"},
                                     {"Host": "rebind.evil.example:8000"}])
def test_foreign_origins_and_rebound_hosts_are_refused(cluster, headers):
    client, _ = cluster
    for path in ("/health", "/v1/models", "/cluster/stats", "/metrics"):
        r = client.get(path, headers=headers)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["code"] == "forbidden" and "x-llmctl-replica" not in r.headers


@pytest.mark.slow
def test_the_allowed_origin_passes_and_its_preflight_needs_no_key(cluster):
    client, _ = cluster
    url = str(client.base_url).rstrip("/") + "/v1/chat/completions"
    pre = httpx.options(url, timeout=WAIT_S, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"]
    r = client.post("/v1/chat/completions", json=_chat("Hi"), headers={"Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"]


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_oversized_body_is_413_without_being_buffered(cluster, chunked):
    from raw_upload import PeakRss, ray_processes, upload

    client, _ = cluster
    pids = ray_processes("ray::ProxyActor", "ray::ServeReplica:llmctl:Ingress")
    total = 200 << 20
    with PeakRss(list(pids.values())) as rss:
        status, body, sent = upload(client.base_url.port, "/v1/chat/completions", total,
                                    chunked, AUTH)
    assert status == 413 and body["error"]["code"] == "payload_too_large", (status, body)
    # The answer came long before the body was sent (the sender kept going
    # meanwhile: what it had sent includes the sockets' buffers).
    assert sent < total // 4, sent
    # Neither the proxy nor the ingress kept the body (the issue measured +775 MB).
    growth = rss.growth()
    print(f"sent {sent >> 20} MiB before the 413; RSS growth (MiB):",
          {t: growth[p] >> 20 for t, p in pids.items()})
    assert all(g < 16 * CAP for g in growth.values()), {t: growth[p] >> 20 for t, p in pids.items()}
    assert client.post("/v1/chat/completions", json=_chat("Hi")).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_absurdly_nested_json_is_a_400_at_the_ingress(cluster, path):
    client, _ = cluster
    r = client.post(path, content=b"[" * 100_000, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert isinstance(error, str) if path.startswith("/api/") else \
        error["type"] == "invalid_request_error"
    assert "x-llmctl-replica" not in r.headers       # answered by the ingress itself


def _kill(replica_id: str) -> None:
    import ray

    (name,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
               if a["name"].endswith(f"#{replica_id}") and "LLMReplica" in a["name"]]
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def _stream_outcome(client: httpx.Client, body: dict) -> str:
    """'ok', 'retriable' (503 + Retry-After, or a stream ending in a
    replica_lost error) or what else happened."""
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        if r.status_code == 503:
            return "retriable" if r.headers.get("retry-after") else "503 without Retry-After"
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    if lines[-1] != "data: [DONE]":
        return f"unterminated: {lines[-1:]}"
    errors = [json.loads(line[6:]) for line in lines[:-1] if '"error"' in line]
    return "retriable" if errors and errors[0]["error"]["code"] == "replica_lost" else \
        "ok" if not errors else f"error: {errors}"


@pytest.mark.slow
def test_a_killed_replica_comes_back_and_requests_keep_being_served(cluster):
    client, _ = cluster
    before = _live(client)
    victim = client.post("/v1/chat/completions",
                         json=_chat(TENANT.format(n=1))).headers["x-llmctl-replica"]
    outcomes: list[str] = []
    # Long generations for the victim's tenant: in flight when it dies.
    jobs = [threading.Thread(target=lambda: outcomes.append(
        _stream_outcome(client, _chat(TENANT.format(n=1), "Tell a long story.", max_tokens=200))))
        for _ in range(3)]
    for j in jobs:
        j.start()
    _poll(lambda: _stats(client)["replicas"][victim]["requests_running"], "requests in flight")
    _kill(victim)
    # Meanwhile, new requests are served (by the survivor, or the replacement).
    served = [client.post("/v1/chat/completions", json=_chat(TENANT.format(n=n)))
              for n in range(1, 5)]
    assert [r.status_code for r in served] == [200] * 4
    for j in jobs:
        j.join(WAIT_S)
    assert not any(j.is_alive() for j in jobs) and len(outcomes) == 3
    assert set(outcomes) <= {"ok", "retriable"}, outcomes
    # Ray replaces the replica: two live ones again, the victim among the gone.
    _poll(lambda: len(_live(client)) == 2 and victim not in _live(client), "a replacement")
    health = client.get("/health").json()
    assert health["replicas"][victim] == "gone" and health["replicas_up"] == 2
    (new,) = set(_live(client)) - set(before)
    again = client.post("/v1/chat/completions", json=_chat("Hello"), headers={"x-llmctl-replica": new})
    assert again.status_code == 200 and again.headers["x-llmctl-replica"] == new
