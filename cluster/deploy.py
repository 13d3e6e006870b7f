"""Deploying llmctl on Ray Serve: a Board, N engine replicas (each declaring
its threads as num_cpus, and its GPUs as num_gpus) and one ingress, as one Serve application, with
llmctl serve's access policy at the proxies, the ingress and the replicas."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from llmctl import settings as settings_module
from llmctl.cluster.ingress import Board, Ingress
from llmctl.cluster.policy import proxy_env
from llmctl.cluster.replica import Replica, ReplicaSpec
from llmctl.errors import ServeFailed, UsageError

if TYPE_CHECKING:
    from ray.serve import Deployment

APP_NAME = "llmctl"
ROUTERS = ("affinity", "default")


@dataclass(frozen=True)
class ClusterSettings:
    """How many replicas, how they scale and how requests reach them."""

    replicas: int = 2
    min_replicas: int | None = None     # with max_replicas: autoscaling on ongoing requests
    max_replicas: int | None = None
    router: str = "affinity"            # "default": Ray Serve's power-of-two-choices

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise UsageError("--replicas must be at least 1")
        if self.router not in ROUTERS:
            raise UsageError(f"--router must be one of {', '.join(ROUTERS)}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise UsageError("--min-replicas and --max-replicas go together")
        lo, hi = self.min_replicas, self.max_replicas      # both set, or neither, past here
        if lo is not None and hi is not None and not 0 <= lo <= self.replicas <= hi:
            raise UsageError("need --min-replicas <= --replicas <= --max-replicas")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None


def replica_options(spec: ReplicaSpec, settings: ClusterSettings) -> dict:
    """The replicas' Ray Serve deployment options."""
    from ray.serve.config import RequestRouterConfig

    from llmctl.cluster.router import AffinityRouter

    slots = spec.load.max_num_seqs
    opts: dict = {
        "name": "LLMReplica",
        "ray_actor_options": {"num_cpus": spec.load.threads or 1,
                              **({"num_gpus": spec.gpus} if spec.gpus else {})},
        # No more than its batch slots: the rest wait in Ray's router, which
        # hands each to the first replica with a free slot (the owner of its
        # prefix if that one frees first), never to an engine queue behind
        # a busy replica while another idles.
        "max_ongoing_requests": slots,
        "health_check_period_s": 2.0,
        "graceful_shutdown_timeout_s": 5.0,
    }
    if settings.autoscaling:
        opts["autoscaling_config"] = {"min_replicas": settings.min_replicas,
                                      "initial_replicas": settings.replicas,
                                      "max_replicas": settings.max_replicas,
                                      "target_ongoing_requests": slots}
    else:
        opts["num_replicas"] = settings.replicas
    if settings.router == "affinity":
        opts["request_router_config"] = RequestRouterConfig(
            # cast: Ray annotates every keyword of this __init__ as a dict.
            request_router_class=cast(Any, AffinityRouter),
            # The owner keeps its keys until its slots are all busy.
            request_router_kwargs={"overload_at": slots})
    return opts


def _deployment(target: Any, **options: Any) -> Deployment:
    """serve.deployment(target, **options): `target` as a Deployment."""
    from ray import serve

    # cast: Ray annotates serve.deployment as returning the decorator, which
    # it returns only when called without the class.
    return cast("Deployment", serve.deployment(target, **options))


def build_app(spec: ReplicaSpec, settings: ClusterSettings):
    """The Serve application: Board <- replicas <- ingress."""
    from ray import serve

    board = _deployment(Board, name="Board", num_replicas=1,
                        ray_actor_options={"num_cpus": 0}).bind()
    replicas = _deployment(Replica, **replica_options(spec, settings)).bind(spec, board)
    # Late-bound ASGI: Ingress.__serve_build_asgi_app__ wraps it in the policy.
    ingress = serve.ingress()(Ingress)
    return _deployment(ingress, name="Ingress", num_replicas=1, max_ongoing_requests=1000,
                       ray_actor_options={"num_cpus": 0}).bind(replicas, board, spec.policy,
                                                               spec.host)


def connect(address: str | None = None, num_cpus: int = 1, object_store_mb: int = 256) -> None:
    """Join the Ray cluster at `address`, or start a local one declaring at
    least `num_cpus` CPUs (what the replicas reserve)."""
    import ray

    # The replicas read llmctl's settings (LLMCTL_HOME, ...) as this process has them.
    env = settings_module.passed_on()
    init: dict = {"runtime_env": {"env_vars": env}, "include_dashboard": False,
                  "log_to_driver": False}
    if address:
        init["address"] = address
    else:
        init |= {"num_cpus": max(os.cpu_count() or 1, num_cpus),
                 "object_store_memory": object_store_mb << 20}
    ray.init(**init)


def deploy(spec: ReplicaSpec, settings: ClusterSettings) -> str:
    """Deploy (or replace) the application on the connected cluster; returns
    once every replica has loaded its model, with the ingress URL. Raises
    ServeFailed when the deployment fails."""
    from ray import serve

    # The proxies inherit the controller's environment, and with it the policy.
    serve.start(http_options={"host": spec.host, "port": spec.port},
                controller_options={"runtime_env": {"env_vars": proxy_env(spec.policy,
                                                                          spec.host)}})
    try:
        serve.run(build_app(spec, settings), name=APP_NAME, route_prefix="/")
    except Exception as e:
        raise ServeFailed(f"the cluster deployment failed: {e}") from e
    return f"http://{spec.host}:{spec.port}"


def start(spec: ReplicaSpec, settings: ClusterSettings, address: str | None = None,
          object_store_mb: int = 256) -> str:
    """connect() and deploy(); leaves Ray again when the deployment fails.
    Returns the ingress URL. Raises ServeFailed."""
    connect(address, settings.replicas * (spec.load.threads or 1), object_store_mb)
    try:
        return deploy(spec, settings)
    except BaseException:
        stop()
        raise


def undeploy() -> None:
    """Delete the application (its replicas free their CPUs); Ray stays up."""
    from ray import serve

    serve.delete(APP_NAME)


def stop() -> None:
    """Tear the application down and leave Ray (stopping a local cluster)."""
    import ray
    from ray import serve

    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()
