"""`llmctl launch AGENT [MODEL] [-- ARGS]`: start a server sized for a
coding agent (or use one at --url), run the agent pointed at it, and stop
the server when the agent exits. The agents are data, in launch_agents."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import typer
from typer.core import TyperCommand
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, print_json
from llmctl.cli.complete import model_names
from llmctl.cli.launch_agents import (
    AGENTS,
    PLACEHOLDER_KEY,
    Agent,
    Pointing,
    Target,
    agent_command,
    find_agent,
)
from llmctl.errors import LlmctlError, ModelNotFound, UsageError

if TYPE_CHECKING:
    from llmctl.bench.launcher import Server

# A coding agent's first prompt (system prompt plus tool schemas) is 6-25k
# tokens, so the context is the model's trained one up to this cap: more
# costs memory per slot and, on a CPU, prefill time no agent waits for.
AGENT_CTX = 32768
# Claude Code sends small side requests (titles, the haiku model's chores,
# subagents) while a turn runs; a second slot keeps them from queuing
# behind a long prefill. Every slot holds a full context, so no more.
AGENT_SLOTS = 2
# Models under this many parameters call tools, but do not finish an
# agent's task (docs/tools.md, docs/launch.md): launch says so.
AGENT_MIN_PARAMETERS = 1_000_000_000
AGENT_ARGS = "llmctl.launch.args"

EPILOG = f"""Agents: {', '.join(AGENTS)}. Arguments after -- go to the agent.

Example: llmctl launch claude qwen2.5-coder-0.5b

  llmctl launch codex --url http://127.0.0.1:8000 -- exec "fix the test"

  llmctl launch openai smollm2 -- aider --model openai/smollm2
"""


class AgentCommand(TyperCommand):
    """A command whose arguments after the first `--` are the agent's:
    they are kept aside, in ctx.meta, before the command's own are parsed."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            args, ctx.meta[AGENT_ARGS] = args[:cut], args[cut + 1:]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- ARGS]..."]


@dataclass
class Plan:
    """What launch will do: the agent, its command line and the variables
    it adds, the Target, and the server it starts (None: one at --url)."""

    agent: Agent
    argv: list[str]
    pointing: Pointing
    target: Target
    slots: int | None
    server: Server | None

    def shown_env(self) -> dict[str, str]:
        """The added variables, secret values masked."""
        return {k: _mask(v) if k in self.pointing.secret else v
                for k, v in self.pointing.env.items()}

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data, keys masked."""
        return {"agent": self.agent.name, "argv": self.argv, "env": self.shown_env(),
                "model": self.target.model, "url": self.target.url,
                "server": "started" if self.server else "reused",
                "ctx_size": self.target.ctx_size, "max_num_seqs": self.slots}


def _mask(value: str) -> str:
    return value if value == PLACEHOLDER_KEY else "****" + value[-4:] * (len(value) > 12)


def _local_target(model: str | None, ctx_size: int | None, slots: int,
                  api_key: str) -> tuple[Target, Server]:
    """The model resolved as `serve` resolves it, its context (the trained
    one, capped at AGENT_CTX) and the server not yet started. Raises what
    resolve_model and read_gguf_info raise."""
    from llmctl.bench.launcher import Server
    from llmctl.store.gguf_info import read_gguf_info
    from llmctl.store.resolve import default_model_name, resolve_model

    # A registry model in part packages is joined into the store on first use.
    with err.status(f"Finding {model or 'the default model'}…"):
        resolved = resolve_model(model)
        info = read_gguf_info(resolved.path)
        trained = info.context_length
    if info.parameters < AGENT_MIN_PARAMETERS:
        err.print(f"warning: {resolved.name} ({info.parameters / 1e9:.2f}B parameters) is too "
                  "small for agents: it calls tools but does not finish their tasks "
                  f"(docs/launch.md); the default model is {default_model_name()}",
                  markup=False, soft_wrap=True)
    if ctx_size is None:
        ctx_size = min(trained, AGENT_CTX) if trained else (resolved.context or 4096)
    args = [model or resolved.name, "--ctx-size", str(ctx_size), "--max-num-seqs", str(slots),
            "--loop-guard"]
    if api_key:
        args += ["--api-key", api_key]
    server = Server.llmctl_serve(*args, own_session=True)
    return Target(server.url, resolved.name, api_key or PLACEHOLDER_KEY, ctx_size), server


def _remote_target(url: str, model: str | None, api_key: str) -> Target:
    """The server at `url`, checked: it answers /v1/models and serves
    `model` (default: the first it lists). Raises ServerUnreachable,
    AuthError, ModelNotFound and UsageError for a malformed URL."""
    from llmctl.cli.remote import call

    served = call("GET", url, "/v1/models", api_key).get("data") or []
    ids = [str(m.get("id")) for m in served if isinstance(m, dict)]
    name = model.removesuffix(":latest") if model else (ids[0] if ids else None)
    if name is None:
        raise ModelNotFound(f"{url} serves no model yet; name one: llmctl launch AGENT MODEL")
    if name not in ids:
        raise ModelNotFound(f"{url} does not serve {name!r} (it serves: {', '.join(ids)})")
    ctx = next((m.get("context_length") for m in served if m.get("id") == name), None)
    base = url.strip().rstrip("/").removesuffix("/v1")
    return Target(base, name, api_key or PLACEHOLDER_KEY, ctx if isinstance(ctx, int) else None)


def _say(line: str) -> None:
    # Plain text, never wrapped: each line is one variable to copy.
    err.print(line, markup=False, soft_wrap=True)


def _show(plan: Plan) -> None:
    t = plan.target
    if plan.server:
        _say(f"llmctl serve {t.model} on {t.url} (context {t.ctx_size}, "
                  f"{plan.slots} slots)")
    else:
        _say(f"using {t.url} ({t.model}, context {t.ctx_size or '?'})")
    _say(f"{plan.agent.title}: {' '.join(plan.argv[:1])}")
    for name, value in plan.shown_env().items():
        _say(f"  {name}={value}")
    for flag, value in zip(plan.pointing.args[::2], plan.pointing.args[1::2], strict=True):
        _say(f"  {flag} {value}")


@contextmanager
def _signals(running: dict[str, subprocess.Popen]) -> Iterator[None]:
    """While launch runs: SIGTERM and SIGHUP (and Ctrl-C before the agent
    starts) end it through KeyboardInterrupt, so the server still stops.
    Once the agent runs, Ctrl-C is the agent's own (it reads the terminal;
    Claude Code cancels a turn on it) and the others are passed on to it:
    launch ends when the agent does."""

    def on_signal(signum: int, _frame: object) -> None:
        agent = running.get("agent")
        if agent is None:
            raise KeyboardInterrupt
        if signum != signal.SIGINT:
            agent.send_signal(signum)

    caught = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in caught}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run(plan: Plan) -> int:
    """Start the server (if launch owns one), run the agent, stop the
    server whatever happens; the agent's exit code (128 + N for a signal).
    Raises ServeFailed when the server does not come up, LlmctlError when
    the agent cannot be run."""
    running: dict[str, subprocess.Popen] = {}
    server = plan.server
    with _signals(running):
        try:
            if server is not None:
                with err.status(f"Loading {plan.target.model} in llmctl serve…"):
                    server.start().wait_ready()
            try:
                running["agent"] = subprocess.Popen(plan.argv,
                                                    env={**os.environ, **plan.pointing.env})
            except OSError as e:
                raise LlmctlError(f"cannot run {plan.argv[0]}: {e.strerror or e}") from e
            code = running["agent"].wait()
        finally:
            if server is not None:
                server.stop()
                _say(f"stopped llmctl serve on {plan.target.url}")
    return 128 - code if code < 0 else code


def _refuse_sizes(context: typer.Context) -> None:
    """Raise UsageError for a size given on the command line with --url,
    where the server is sized already (rather than ignore it)."""
    given = [f"--{name.replace('_', '-')}" for name in ("ctx_size", "max_num_seqs")
             if getattr(context.get_parameter_source(name), "name", "") == "COMMANDLINE"]
    if given:
        raise UsageError(f"{' and '.join(given)}: only for the server launch starts; "
                         "the one at --url is sized already")


Url = Annotated[str, typer.Option(
    "--url", help="Use the llmctl serve (or other server) at this address; "
                  "default: start one for the agent.", show_default=False)]
ApiKey = Annotated[str, typer.Option(
    "--api-key", envvar="LLMCTL_API_KEY", show_default=False,
    help="The server's key: given to the server launch starts, sent to one at --url.")]
Slots = Annotated[int, typer.Option(
    "--max-num-seqs", min=1, max=256, envvar="LLMCTL_MAX_NUM_SEQS",
    help="Sequences the started server decodes together (each with the full context).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan; start nothing.")]


@handle_errors
def launch(
    context: typer.Context,
    agent: Annotated[str, typer.Argument(
        help=f"One of: {', '.join(AGENTS)}.", metavar="AGENT", show_default=False)],
    model: Annotated[Optional[str], typer.Argument(
        help="The model to serve (as for serve; default: the registry's default), or the one "
             "to use at --url (default: the first it serves).", metavar="MODEL", show_default=False,
        autocompletion=model_names)] = None,
    *,
    url: Url = "",
    api_key: ApiKey = "",
    ctx_size: Annotated[Optional[int], typer.Option(
        "--ctx-size", min=64, envvar="LLMCTL_CTX_SIZE",
        help=f"Context tokens per sequence (default: the model's trained context, "
             f"at most {AGENT_CTX}).")] = None,
    max_num_seqs: Slots = AGENT_SLOTS,
    json: o.Json = False,
    dry_run: DryRun = False,
) -> None:
    """Run Claude Code, Codex or any OpenAI client on a local model.

    Starts llmctl serve with a context and slot count for agents (or uses
    --url), runs AGENT with its environment pointed at it, and stops the
    server when the agent exits, with the agent's exit code.
    """
    chosen = find_agent(agent)
    command = agent_command(chosen, context.meta.get(AGENT_ARGS, []))
    if url:
        _refuse_sizes(context)
        target, server, slots = _remote_target(url, model, api_key), None, None
    else:
        target, server = _local_target(model, ctx_size, max_num_seqs, api_key)
        slots = max_num_seqs
    pointing = chosen.point(target)
    plan = Plan(chosen, [command[0], *pointing.args, *command[1:]], pointing, target, slots,
                server)
    print_json(plan.as_dict()) if json else _show(plan)
    if not dry_run:
        raise typer.Exit(_run(plan))


def register(app: typer.Typer) -> None:
    app.command("launch", cls=AgentCommand, epilog=EPILOG)(launch)
