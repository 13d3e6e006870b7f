"""`llmctl chat`: an interactive REPL, or one answer per stdin line when
stdin is not a terminal. The REPL's slash commands live here; the
conversation itself is llmctl.runtime.chat_session."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import typer

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, note_base_model, out, write_out
from llmctl.cli.mcp import MaxStepsOpt, McpOpt, TerminalWatcher, YesOpt, servers_for, short
from llmctl.errors import UsageError

if TYPE_CHECKING:
    from llmctl.runtime.chat_session import ChatSession, TurnStats
    from llmctl.runtime.engine.stats import Stats
    from llmctl.tools.mcp_hub import McpHub

HELP = """Commands:
  /help          show this help
  /clear         forget the conversation (keeps the system prompt)
  /system TEXT   set the system prompt and start over
  /stats         speed of the last answer, and this session's totals
  /tools         the MCP tools the model may call (with --mcp)
  /bye           leave (Ctrl-D works too; Ctrl-C stops an answer)"""


@dataclass
class Tools:
    """The MCP tools of a chat (--mcp): the hub, and the loop's options."""

    hub: McpHub
    approve_all: bool
    max_steps: int

    def listing(self) -> str:
        from llmctl.tools.mcp_hub import McpError

        lines = []
        for label in self.hub.servers:
            try:
                for t in self.hub.tools(label):
                    lines.append(f"{label}.{t.name}{' (reads only)' if t.read_only else ''}: "
                                 f"{short(t.description)}")
            except McpError as e:
                lines.append(f"{label}: {e}")
        return "\n".join(lines) or "No MCP servers."


def describe_stats(stats: TurnStats) -> str:
    """The /stats line for one answer."""
    return (f"prompt {stats.prompt_tokens} tok ({stats.cached_tokens} cached), generated "
            f"{stats.completion_tokens} tok, TTFT {stats.ttft_s:.3f}s, "
            f"{stats.tokens_per_s:.1f} tok/s")


def describe_totals(stats: Stats) -> str:
    """The engine's counters, read from the same snapshot /metrics and
    /stats serve."""
    return (f"session: {sum(stats.requests.values())} answers, prompt {stats.prompt_tokens} tok "
            f"({stats.cached_tokens} cached), generated {stats.generation_tokens} tok")


def slash(session: ChatSession, line: str, tools: Tools | None = None) -> tuple[str, bool]:
    """Run a slash command on the session: (text to show, whether to leave)."""
    name, _, arg = line.strip().partition(" ")
    if name == "/tools":
        return (tools.listing() if tools else "No tools: start chat with --mcp FILE."), False
    if name in ("/bye", "/exit", "/quit"):
        return "", True
    if name == "/help":
        return HELP, False
    if name == "/clear":
        session.clear()
        return "Conversation cleared.", False
    if name == "/system":
        session.set_system(arg.strip() or None)
        return ("System prompt set." if session.system else "System prompt removed."), False
    if name == "/stats":
        last = describe_stats(session.last) if session.last else "No answer yet."
        return f"{last}\n{describe_totals(session.llm.stats())}", False
    return f"Unknown command {name}; try /help.", False


def _handle(session: ChatSession, line: str, tools: Tools | None = None) -> bool:
    """One line of input, a slash command or a prompt; True when it means leave."""
    if not line.strip():
        return False
    if line.startswith("/"):
        text, leave = slash(session, line, tools)
        if not leave:
            out.print(text, markup=False)
        return leave
    if tools is None:
        session.answer(line, write_out)
    else:
        _answer_with_tools(session, line, tools)
    write_out("\n")
    return False


def _answer_with_tools(session: ChatSession, line: str, tools: Tools) -> None:
    """One turn in which the model may call the MCP tools; the calls and
    their results join the conversation."""
    from llmctl.tools.agent import run_turn

    head = len(session.messages()) - len(session.history)
    messages = session.messages() + [{"role": "user", "content": line}]
    try:
        turn = run_turn(session.llm, messages, session.params, tools.hub,
                        TerminalWatcher(write_out), max_steps=tools.max_steps,
                        approve_all=tools.approve_all)
    finally:
        session.history = messages[head:]
    if turn.stopped:
        err.print(f"[yellow]the tools were withdrawn after {tools.max_steps} calls "
                  "(--max-steps)[/]")


def _interactive(session: ChatSession, tools: Tools | None) -> None:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    err.print(f"[bold]{session.llm.name}[/] ready. Type /help for commands, Ctrl-D to leave.")
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            write_out("\n")
            return
        except KeyboardInterrupt:
            write_out("\n")
            continue
        try:
            if _handle(session, line, tools):
                return
        except KeyboardInterrupt:
            write_out(" [stopped]\n")


def _batch(session: ChatSession, tools: Tools | None) -> None:
    """Piped input: one prompt per line, plain answers, nothing decorative."""
    for line in sys.stdin:
        if _handle(session, line.rstrip("\n"), tools):
            return


@handle_errors
@o.with_groups
def chat(gen: o.Generation, model: o.ModelArg = None, *, decoding: o.Decoding,
         mcp: McpOpt = None, yes: YesOpt = False, max_steps: MaxStepsOpt = 8) -> None:
    """Chat with a model in the terminal.

    With --mcp the model may call the servers' tools; /tools lists them
    (docs/mcp.md).

    Example: llmctl chat smollm2 --system "Answer briefly." --temperature 0.7
    """
    from llmctl.runtime.chat_session import ChatSession
    from llmctl.runtime.oneshot import load_for

    params = gen.sampling()
    note_base_model(model)
    servers = None if mcp is None else \
        servers_for(None if str(mcp) == "config" else mcp, required=True)
    with load_for(model, gen.load(**decoding.load_fields())) as llm, _hub(servers) as hub:
        refusal = getattr(llm.template, "refusal", None)
        if refusal:
            raise UsageError(refusal)
        session = ChatSession(llm, params, system=gen.system)
        tools = None if hub is None else Tools(hub, yes, max_steps)
        if sys.stdin.isatty():
            _interactive(session, tools)
        else:
            _batch(session, tools)


@contextmanager
def _hub(servers: dict | None) -> Iterator[McpHub | None]:
    """The MCP hub of `servers` for the chat's length (None without --mcp)."""
    if servers is None:
        yield None
        return
    from llmctl.tools.mcp_hub import McpHub

    hub = McpHub(servers)
    try:
        yield hub
    finally:
        hub.close()


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)
