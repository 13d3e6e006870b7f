"""The agents `llmctl launch` knows, as data: each one's executable, where
to get it, and the environment variables and arguments that point it at a
server. Adding an agent is one entry in AGENTS.

Nothing here writes a config file: every setting travels in the agent's
environment or on its command line, so the user's own configuration of
Claude Code or Codex is untouched and applies again on its next plain run."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Callable

from llmctl.errors import LlmctlError, UsageError

# The key an agent sends when the server has no --api-key: Claude Code and
# Codex refuse to start without some key, and the server ignores it.
PLACEHOLDER_KEY = "llmctl"
# The variable Codex reads the key from (its provider's env_key): llmctl's
# own, so `llmctl ps` run from inside the agent reaches the same server.
CODEX_KEY_VAR = "LLMCTL_API_KEY"

# How long an agent waits for an answer, or (Codex) for the stream to move.
# Their defaults (10 and 5 minutes) are for a remote API; on loopback a
# silence is a long prefill on a CPU, not a lost network, and the server's
# own watchdog ends a stalled engine. Retrying would prefill again.
AGENT_TIMEOUT_MS = 30 * 60 * 1000

# The most an agent asks for in one answer. Claude Code asks for 32,000 on
# every turn; at the 8-12 tokens/s a 1.5B model decodes on 2 CPU cores, a
# model that does not stop would hold a turn for most of an hour (one first
# request ran 3,062 decode steps in 20 minutes). 4,096 is several whole
# files, and about 6 minutes there. Codex 0.171.0 has no such setting (it
# ignores model_max_output_tokens, saying so).
AGENT_MAX_OUTPUT = 4096

# The header that turns the server's loop guard on for the agent's requests
# (server/fields.py owns the name; a test checks they agree): a model that
# loops stops there instead of at AGENT_MAX_OUTPUT.
LOOP_GUARD_HEADER = "x-llmctl-loop-guard"
LOOP_GUARD_ON = f"{LOOP_GUARD_HEADER}: on"

# Claude Code picks a model per task: the main loop (ANTHROPIC_MODEL), the
# aliases a user or a setting can select (opus, sonnet, haiku), the small
# model of background chores (ANTHROPIC_SMALL_FAST_MODEL, the name before
# 2.x), and subagents. All of them are the one model the server holds.
CLAUDE_MODEL_VARS = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
                     "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                     "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")


@dataclass(frozen=True)
class Target:
    """The server an agent is pointed at: its root URL (no /v1), the model
    to ask for, the key to send (never empty) and the context per sequence
    (None when the server does not say)."""

    url: str
    model: str
    api_key: str
    ctx_size: int | None


@dataclass(frozen=True)
class Pointing:
    """What points an agent at a Target: variables added to its
    environment, arguments put before the user's, and the variables whose
    values are secret (masked when printed)."""

    env: dict[str, str]
    args: list[str] = field(default_factory=list)
    secret: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Agent:
    """One agent: its name on the command line, a title, the executable
    (None: the command after `--`, else the user's shell), how to install
    it, and the function that points it at a Target."""

    name: str
    title: str
    executable: str | None
    install: str
    point: Callable[[Target], Pointing]


def _claude(t: Target) -> Pointing:
    env = {
        # The SDK appends /v1/messages itself.
        "ANTHROPIC_BASE_URL": t.url,
        # Sent as `Authorization: Bearer`; the server accepts it there.
        "ANTHROPIC_AUTH_TOKEN": t.api_key,
        # Blank, so a real Anthropic key in the user's environment is never
        # sent to this server, and Claude Code does not ask to approve it.
        "ANTHROPIC_API_KEY": "",
        **{name: t.model for name in CLAUDE_MODEL_VARS},
        # No telemetry, error reports, update checks or feedback prompts:
        # a local model needs nothing from Anthropic's servers.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "API_TIMEOUT_MS": str(AGENT_TIMEOUT_MS),
        # Your own value, when you set one, is kept.
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": os.environ.get("CLAUDE_CODE_MAX_OUTPUT_TOKENS")
        or str(AGENT_MAX_OUTPUT),
        # An answer that loops ends, on a server launch did not start too;
        # headers of your own are kept.
        "ANTHROPIC_CUSTOM_HEADERS": "\n".join(
            h for h in (os.environ.get("ANTHROPIC_CUSTOM_HEADERS", ""), LOOP_GUARD_ON) if h),
    }
    return Pointing(env, secret=frozenset({"ANTHROPIC_AUTH_TOKEN"}))


def _toml(value: str | int) -> str:
    # Codex reads each -c value as TOML; a JSON string is a TOML basic string.
    return json.dumps(value)


def _codex(t: Target) -> Pointing:
    provider = "model_providers.llmctl"
    overrides: dict[str, str | int] = {
        "model_provider": "llmctl",
        f"{provider}.name": "llmctl",
        f"{provider}.base_url": f"{t.url}/v1",      # Codex appends /responses
        f"{provider}.wire_api": "responses",
        f"{provider}.env_key": CODEX_KEY_VAR,
        f"{provider}.stream_idle_timeout_ms": AGENT_TIMEOUT_MS,
        f"{provider}.http_headers.{LOOP_GUARD_HEADER}": "on",
        "model": t.model,
    }
    if t.ctx_size:
        # Codex knows no window for a model it has never heard of: tell it,
        # and compact the history before the server would refuse a turn.
        overrides["model_context_window"] = t.ctx_size
        overrides["model_auto_compact_token_limit"] = t.ctx_size * 4 // 5
    args = [arg for key, value in overrides.items() for arg in ("-c", f"{key}={_toml(value)}")]
    return Pointing({CODEX_KEY_VAR: t.api_key}, args, frozenset({CODEX_KEY_VAR}))


def _openai(t: Target) -> Pointing:
    base = f"{t.url}/v1"
    env = {"OPENAI_BASE_URL": base,
           "OPENAI_API_BASE": base,         # the older name some tools still read
           "OPENAI_API_KEY": t.api_key, "OPENAI_MODEL": t.model}
    return Pointing(env, secret=frozenset({"OPENAI_API_KEY"}))


AGENTS = {agent.name: agent for agent in (
    Agent("claude", "Claude Code", "claude",
          "install it with: npm install -g @anthropic-ai/claude-code", _claude),
    Agent("codex", "Codex", "codex", "install it with: npm install -g @openai/codex", _codex),
    Agent("openai", "an OpenAI-compatible tool", None,
          "give the command after --, e.g. llmctl launch openai -- aider", _openai),
)}


def find_agent(name: str) -> Agent:
    """The agent called `name`. Raises UsageError listing the known ones."""
    agent = AGENTS.get(name.lower())
    if agent is None:
        raise UsageError(f"unknown agent {name!r}; known agents: {', '.join(AGENTS)} "
                         "(openai runs any OpenAI-compatible tool given after --)")
    return agent


def agent_command(agent: Agent, args: list[str], path: str | None = None) -> list[str]:
    """The command line that runs `agent` with the user's `args`, its
    executable found on `path` (default: PATH). The openai agent runs
    `args` itself, or the user's shell when there are none. Raises
    LlmctlError when the executable is not found, saying how to get it."""
    if agent.executable is None:
        command = args or [os.environ.get("SHELL") or "/bin/sh"]
        executable, args = command[0], command[1:]
    else:
        executable = agent.executable
    found = shutil.which(executable, path=path)
    if found is None:
        raise LlmctlError(f"{executable!r} is not on PATH; {agent.install}")
    return [found, *args]
