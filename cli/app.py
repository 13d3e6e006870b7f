"""The root Typer app. Each command lives in its own module, which exposes
`register(app)`; this file only wires them together."""

from __future__ import annotations

import importlib

import typer

from llmctl import __version__
from llmctl.cli.common import State

app = typer.Typer(
    name="llmctl",
    help="Run open-weight LLMs on your own machine: pull, quantize, chat and serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

COMMAND_MODULES = ["chat", "run", "models", "info", "pull", "quantize", "evaluate",
                   "serve", "bench", "cache"]


def _version(value: bool) -> None:
    if value:
        print(f"llmctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    debug: bool = typer.Option(False, "--debug", envvar="LLMCTL_DEBUG",
                               help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    State.debug = debug


for _name in COMMAND_MODULES:
    importlib.import_module(f"llmctl.cli.{_name}").register(app)


def main() -> None:
    app()
