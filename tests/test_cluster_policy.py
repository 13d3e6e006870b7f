"""`llmctl cluster serve` takes llmctl serve's access policy, flags and
LLMCTL_* variables alike, and hands it to the cluster's HTTP proxies intact.
No cluster starts here; tests/test_cluster.py shows the policy applied by a
running one (#20 finding 8)."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from llmctl.cli.app import app
from llmctl.cli.cluster import POLICY_OPTIONS

POLICY_VARS = ("LLMCTL_API_KEY", "LLMCTL_ALLOWED_ORIGINS", "LLMCTL_MAX_BODY_MB",
               "LLMCTL_METRICS_PUBLIC")


def _params(*path: str) -> dict:
    import click
    import typer.main

    root = typer.main.get_command(app)
    command = root.load(path[0])[path[0]]       # the lazily loaded command module
    for name in path[1:]:
        command = command.get_command(click.Context(command), name)
    return {p.name: p for p in command.params}


def test_cluster_serve_declares_the_policy_options_as_serve_does():
    serve, cluster = _params("serve"), _params("cluster", "serve")
    for name in POLICY_OPTIONS:
        ours, theirs = cluster[name], serve[name]
        assert (ours.opts, ours.envvar, ours.help, ours.default) == \
            (theirs.opts, theirs.envvar, theirs.help, theirs.default)


@pytest.fixture
def busy_port():
    """A port something listens on: `cluster serve` checks it and stops
    there, after it built its policy and before Ray starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("args,env,says", [
    ([], {}, "no API key; bodies up to 8 MiB"),
    (["--api-key", "k1"], {}, "API key required; bodies up to 8 MiB"),
    ([], {"LLMCTL_API_KEY": "k2", "LLMCTL_MAX_BODY_MB": "0.5"}, "API key required; bodies up to 0.5 MiB"),
    ([], {"LLMCTL_API_KEY": "k3", "LLMCTL_METRICS_PUBLIC": "1",
          "LLMCTL_ALLOWED_ORIGINS": "https://a.example, https://b.example"},
     "API key required (/metrics open); bodies up to 8 MiB; origins: https://a.example, "
     "https://b.example"),
])
def test_the_policy_comes_from_the_flags_or_the_variables(busy_port, monkeypatch, args, env, says):
    for var in POLICY_VARS:
        monkeypatch.delenv(var, raising=False)
    r = CliRunner().invoke(app, ["cluster", "serve", "smollm2", "--port", str(busy_port), *args],
                           env=env)
    assert f"{says}) ..." in " ".join(r.stderr.split()), r.output     # rich wraps lines
    assert "already in use" in r.output and "Traceback" not in r.output


def test_the_proxies_get_the_policy_the_ingress_has(monkeypatch):
    from llmctl.cluster.policy import proxy_env, proxy_middlewares
    from llmctl.server.middleware import layers
    from llmctl.server.state import HttpPolicy

    policy = HttpPolicy(api_key="k", metrics_public=True, allowed_origins=("https://a.example",),
                        max_body_bytes=12345)
    for name, value in proxy_env(policy, "10.0.0.5").items():
        monkeypatch.setenv(name, value)
    # In Ray's order (the last runs first): see the next test.
    got, want = proxy_middlewares(), layers(policy, "10.0.0.5")[::-1]
    assert [(m.cls, m.args, m.kwargs) for m in got] == [(m.cls, m.args, m.kwargs) for m in want]
    monkeypatch.delenv("LLMCTL_CLUSTER_POLICY")
    assert proxy_middlewares() == []


def test_the_proxies_apply_the_layers_in_serves_order(monkeypatch):
    # Ray wraps its proxy app in the callback's list in turn (the last runs
    # first): the origin check must still come first, and a preflight pass
    # without the key, as in llmctl serve.
    pytest.importorskip("ray.serve")
    import asyncio

    import httpx
    from ray.serve._private.http_util import _apply_middlewares
    from starlette.responses import PlainTextResponse

    from llmctl.cluster.policy import proxy_env, proxy_middlewares
    from llmctl.server.state import HttpPolicy

    origin = "https://app.example.com"
    for name, value in proxy_env(HttpPolicy(api_key="k", allowed_origins=(origin,)), None).items():
        monkeypatch.setenv(name, value)
    proxy = _apply_middlewares(PlainTextResponse("proxied"), proxy_middlewares())

    async def requests() -> list[int]:
        transport = httpx.ASGITransport(app=proxy, client=("127.0.0.1", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return [(await c.options("/v1/chat/completions", headers={
                        "Origin": origin, "Access-Control-Request-Method": "POST"})).status_code,
                    (await c.get("/v1/models", headers={"Origin": "https://evil.example"})).status_code,
                    (await c.get("/v1/models")).status_code,
                    (await c.get("/v1/models", headers={"Origin": origin,
                                                         "Authorization": "Bearer k"})).status_code]

    assert asyncio.run(requests()) == [200, 403, 401, 200]
