"""`llmctl chat`: an interactive REPL, or one answer per stdin line when
stdin is not a terminal."""

from __future__ import annotations

import sys

import typer

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, out
from llmctl.runtime.chat_session import ChatSession
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams


def _write(chunk: str) -> None:
    sys.stdout.write(chunk)
    sys.stdout.flush()


def _slash(session: ChatSession, line: str) -> bool:
    """Run a slash command; True when it means leave."""
    text, leave = session.command(line)
    if not leave:
        out.print(text, markup=False)
    return leave


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
            print()
            return
        except KeyboardInterrupt:
            print()
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            if _slash(session, line):
                return
            continue
        try:
            session.answer(line, _write)
        except KeyboardInterrupt:
            _write(" [stopped]")
        _write("\n")


def _batch(session: ChatSession) -> None:
    """Piped input: one prompt per line, plain answers, nothing decorative."""
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.startswith("/"):
            if _slash(session, line):
                return
            continue
        session.answer(line, _write)
        _write("\n")


@handle_errors
def chat(
    model: o.ModelArg = None,
    system: o.System = None,
    temperature: o.Temperature = 0.8,
    top_p: o.TopP = 0.95,
    top_k: o.TopK = 40,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = None,
    ctx_size: o.CtxSize = None,
    threads: o.Threads = None,
    n_gpu_layers: o.GpuLayers = "auto",
) -> None:
    """Chat with a model in the terminal.

    Example: llmctl chat smollm2 --system "Answer briefly." --temperature 0.7
    """
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                            max_tokens=max_tokens)
    load = LoadOptions(ctx_size=ctx_size, threads=threads,
                       n_gpu_layers=n_gpu_layers)
    with LLM.load(model, load) as llm:
        session = ChatSession(llm, params, system=system)
        if sys.stdin.isatty():
            _interactive(session)
        else:
            _batch(session)


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)
