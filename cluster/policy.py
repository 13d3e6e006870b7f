"""llmctl serve's access policy in the cluster's HTTP proxies.

Ray Serve's proxy (one per node, in front of the ingress) reads every
request body into its own queue, as fast as the client sends it, before
the ingress asks for any of it: a cap applied only at the ingress would
leave a 200 MiB upload in the proxy's memory. So the proxies run the same
middleware (server/middleware.py `layers`) ahead of their own app: an
unauthorised, foreign or oversized request is answered there, and the
proxy never queues more than the cap.

Ray builds a proxy's middleware from the function named by
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH, called in the proxy's process
(Ray's HTTPOptions.middlewares is gone), so the policy travels in the Serve
controller's environment, which its proxies inherit. That applies only to
proxies the Serve instance starts: on a cluster whose Serve was already
running, the ingress (which applies the same policy) is the only gate."""

from __future__ import annotations

import dataclasses
import json

from llmctl.settings import handed_over

CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
POLICY_ENV = "LLMCTL_CLUSTER_POLICY"


def proxy_env(policy, bind_host: str | None) -> dict[str, str]:
    """The environment variables that make Serve's proxies apply `policy`
    (an HttpPolicy) with `bind_host` accepted in the Host header."""
    spec = {"policy": dataclasses.asdict(policy), "bind_host": bind_host}
    return {CALLBACK_ENV: f"{__name__}:proxy_middlewares", POLICY_ENV: json.dumps(spec)}


def proxy_middlewares() -> list:
    """Ray's proxy callback: the policy's middleware for this process,
    from POLICY_ENV (none when it is not set). Raises ValueError for a
    malformed POLICY_ENV, which fails the proxy's start: a proxy must not
    come up without the policy it was given."""
    from llmctl.server.middleware import layers
    from llmctl.server.state import HttpPolicy

    raw = handed_over(POLICY_ENV)
    if not raw:
        return []
    spec = json.loads(raw)
    fields = spec["policy"]
    fields["allowed_origins"] = tuple(fields["allowed_origins"])
    # Ray wraps its app in each middleware of the list in turn, so the last
    # one runs first: the reverse of Starlette's order, which layers() has.
    return layers(HttpPolicy(**fields), spec["bind_host"])[::-1]
