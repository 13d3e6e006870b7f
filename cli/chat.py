"""`llmctl chat`: an interactive REPL, or one answer per stdin line when
stdin is not a terminal. The REPL's slash commands live here; the
conversation itself is llmctl.runtime.chat_session."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, note_base_model, out, write_out
from llmctl.errors import UsageError

if TYPE_CHECKING:
    from llmctl.runtime.chat_session import ChatSession, TurnStats
    from llmctl.runtime.engine.stats import Stats

HELP = """Commands:
  /help          show this help
  /clear         forget the conversation (keeps the system prompt)
  /system TEXT   set the system prompt and start over
  /stats         speed of the last answer, and this session's totals
  /bye           leave (Ctrl-D works too; Ctrl-C stops an answer)"""


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


def slash(session: ChatSession, line: str) -> tuple[str, bool]:
    """Run a slash command on the session: (text to show, whether to leave)."""
    name, _, arg = line.strip().partition(" ")
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


def _handle(session: ChatSession, line: str) -> bool:
    """One line of input, a slash command or a prompt; True when it means leave."""
    if not line.strip():
        return False
    if line.startswith("/"):
        text, leave = slash(session, line)
        if not leave:
            out.print(text, markup=False)
        return leave
    session.answer(line, write_out)
    write_out("\n")
    return False


def _interactive(session: ChatSession) -> None:
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
            if _handle(session, line):
                return
        except KeyboardInterrupt:
            write_out(" [stopped]\n")


def _batch(session: ChatSession) -> None:
    """Piped input: one prompt per line, plain answers, nothing decorative."""
    for line in sys.stdin:
        if _handle(session, line.rstrip("\n")):
            return


@handle_errors
@o.with_groups
def chat(gen: o.Generation, model: o.ModelArg = None, *, decoding: o.Decoding) -> None:
    """Chat with a model in the terminal.

    Example: llmctl chat smollm2 --system "Answer briefly." --temperature 0.7
    """
    from llmctl.runtime.chat_session import ChatSession
    from llmctl.runtime.oneshot import load_for

    params = gen.sampling()
    note_base_model(model)
    with load_for(model, gen.load(**decoding.load_fields())) as llm:
        refusal = getattr(llm.template, "refusal", None)
        if refusal:
            raise UsageError(refusal)
        session = ChatSession(llm, params, system=gen.system)
        if sys.stdin.isatty():
            _interactive(session)
        else:
            _batch(session)


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)
