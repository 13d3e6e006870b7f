"""`llmctl cluster serve`: llmctl engine replicas on Ray Serve behind one
OpenAI-compatible ingress. Ray (the `cluster` extra) is imported only when
the command runs."""

from __future__ import annotations

import inspect
import signal
import sys
import threading
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli import serve as serve_command
from llmctl.cli.common import err, handle_errors

if TYPE_CHECKING:
    from llmctl.cluster.deploy import ClusterSettings
    from llmctl.cluster.replica import ReplicaSpec
    from llmctl.server.middleware import HttpPolicy

group = typer.Typer(help="Serve a model from replicas on a Ray cluster.\n\n"
                         "Example: llmctl cluster serve qwen2.5-coder-0.5b --replicas 2",
                    no_args_is_help=True)


class Router(str, Enum):
    affinity = "affinity"
    default = "default"


# The access policy's options, as `llmctl serve` declares them.
POLICY_OPTIONS = ("api_key", "allowed_origins", "max_body_mb", "metrics_public")


def with_policy(fn: Callable) -> Callable:
    """Give the command `fn` `llmctl serve`'s access-policy options (the
    same declarations, flags and LLMCTL_* variables, read from its
    signature: one definition) in place of its `policy` parameter, and call
    `fn` with them as one HttpPolicy. Raises KeyError at decoration if
    `llmctl serve` lacks one of POLICY_OPTIONS."""
    theirs = inspect.signature(serve_command.serve, eval_str=True).parameters
    ours = inspect.signature(fn, eval_str=True)
    params = [p for p in ours.parameters.values() if p.name != "policy"]
    params += [theirs[name].replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for name in POLICY_OPTIONS]

    def gather(kwargs: dict[str, Any]) -> dict[str, Any]:
        from llmctl.server.middleware import http_policy

        return {"policy": http_policy(**{name: kwargs.pop(name) for name in POLICY_OPTIONS})}

    return o.replace_parameters(fn, params, gather)


def describe(policy: HttpPolicy) -> str:
    """The policy in a few words, for the start-up line."""
    key = "API key required" if policy.api_key else "no API key"
    metrics = " (/metrics open)" if policy.api_key and policy.metrics_public else ""
    origins = f"; origins: {', '.join(policy.allowed_origins)}" if policy.allowed_origins else ""
    return f"{key}{metrics}; bodies up to {policy.max_body_bytes / (1 << 20):g} MiB{origins}"


Replicas = Annotated[int, typer.Option(
    "--replicas", min=1, envvar="LLMCTL_REPLICAS",
    help="Engine replicas (the initial count when autoscaling).")]
Address = Annotated[Optional[str], typer.Option(
    "--address", envvar="LLMCTL_RAY_ADDRESS",
    help="Join this Ray cluster (e.g. ray://head:10001 or auto); default: start a local one.")]
MinReplicas = Annotated[Optional[int], typer.Option(
    "--min-replicas", min=0, envvar="LLMCTL_MIN_REPLICAS",
    help="With --max-replicas: autoscale on ongoing requests.")]
MaxReplicas = Annotated[Optional[int], typer.Option(
    "--max-replicas", min=1, envvar="LLMCTL_MAX_REPLICAS")]
GpusPerReplica = Annotated[float, typer.Option(
    "--gpus-per-replica", min=0.0, envvar="LLMCTL_GPUS_PER_REPLICA",
    help="GPUs each replica reserves in Ray (num_gpus): each gets its own device(s), and "
         "--n-gpu-layers auto fills them. 0: CPU only.")]
Threads = Annotated[int, typer.Option(
    "--threads", min=1, envvar="LLMCTL_THREADS",
    help="CPU threads per replica, also what each replica reserves in Ray (num_cpus).")]
MaxNumSeqs = Annotated[int, typer.Option(
    "--max-num-seqs", min=1, max=256, envvar="LLMCTL_MAX_NUM_SEQS", help="Batch slots per replica.")]
CacheDir = Annotated[Optional[str], typer.Option(
    "--cache-dir", envvar="LLMCTL_CACHE_DIR",
    help="The disk prefix cache every replica shares (shared storage on a multi-node "
         "cluster); default: each node's LLMCTL_HOME/cache.")]
PrefixCacheSize = Annotated[float, typer.Option(
    "--prefix-cache-size", min=0.0, envvar="LLMCTL_PREFIX_CACHE_SIZE",
    help="Disk budget of the shared prefix cache, in GB (each replica enforces it over "
         "the whole folder).")]
RouterOpt = Annotated[Router, typer.Option(
    "--router", envvar="LLMCTL_ROUTER",
    help="affinity: a prompt's leading text picks its replica (prefix-cache hits); "
         "default: Ray Serve's power of two choices.")]


@group.command("serve")
@handle_errors
@with_policy
def serve(
    model: o.ModelArg = None,
    replicas: Replicas = 2,
    address: Address = None,
    min_replicas: MinReplicas = None,
    max_replicas: MaxReplicas = None,
    threads: Threads = 1,
    gpus_per_replica: GpusPerReplica = 0.0,
    n_gpu_layers: o.GpuLayers = "auto",
    max_num_seqs: MaxNumSeqs = 4,
    ctx_size: o.CtxSize = None,
    cache_dir: CacheDir = None,
    prefix_cache_size: PrefixCacheSize = 4.0,
    host: serve_command.Host = "127.0.0.1",
    port: serve_command.Port = 8000,
    router: RouterOpt = Router.affinity,
    policy=None,    # with_policy passes an HttpPolicy
) -> None:
    """Serve a model from N replicas on Ray Serve, behind one ingress.

    The ingress speaks OpenAI's API (/v1/chat/completions, /v1/completions,
    /v1/models), aggregates /metrics over the replicas and reports each one's
    health at /health and its prefix-cache hit rate at /cluster/stats. The
    API key, origin, Host and body-size rules are `llmctl serve`'s, applied
    before a request is forwarded.

    Example: llmctl cluster serve smollm2 --replicas 2 --threads 4
    """
    from llmctl.extras import require

    require("cluster")      # before anything starts: Ray is imported as the cluster starts
    from llmctl.cluster.deploy import ClusterSettings
    from llmctl.cluster.replica import ReplicaSpec
    from llmctl.runtime.load_options import LoadOptions
    from llmctl.settings import Settings
    from llmctl.store.resolve import resolve_model

    settings = ClusterSettings(replicas=replicas, min_replicas=min_replicas,
                               max_replicas=max_replicas, router=router.value)
    spec = ReplicaSpec(resolve_model(model),
                       LoadOptions(ctx_size=ctx_size, threads=threads, max_num_seqs=max_num_seqs,
                                   prefix_cache_size_gb=prefix_cache_size,
                                   n_gpu_layers=n_gpu_layers, settings=Settings.load()),
                       cache_dir=cache_dir, host=host, port=port, policy=policy,
                       gpus=gpus_per_replica)
    err.print(f"Starting {replicas} replica(s) of {spec.resolved.name} on Ray "
              f"({address or 'a local cluster'}; {describe(policy)}) ...")
    _run(spec, settings, address)


def _run(spec: ReplicaSpec, settings: ClusterSettings, address: str | None) -> None:
    """Start the deployment and serve until Ctrl-C or SIGTERM, then tear it down."""
    from llmctl.cluster.deploy import start, stop

    if not address:
        # The local cluster's HTTP proxy binds here: say so now, not after Ray
        # has started and its proxy failed (the check `llmctl serve` makes).
        from llmctl.server.startup import check_port

        check_port(spec.host, spec.port)
    try:
        url = start(spec, settings, address)
        # `kill` (systemd, docker stop) tears the deployment down as Ctrl-C
        # does; set after ray.init, which installs a SIGTERM handler of its own.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        err.print(f"Serving on {url}/v1 (router: {settings.router}; /health, /metrics, "
                  "/cluster/stats; Ctrl-C to stop)")
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop()


def register(app: typer.Typer) -> None:
    app.add_typer(group, name="cluster")
