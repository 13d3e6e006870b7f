"""The root Typer app. Each command lives in its own module, which exposes
`register(app)`; this file only wires them together.

A module is imported only when one of its commands runs or shows its own
help: `llmctl --version`, `llmctl --help` and every other command must not
pay for fastapi, llama.cpp or the runtime that some commands import at
module level. The root help lists each command from COMMANDS below, whose
summaries are checked against the real commands by tests/test_cli_startup.py."""

from __future__ import annotations

import importlib
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from llmctl import __version__

if TYPE_CHECKING:
    from typer._click import Command

# name: (module under llmctl.cli, first paragraph of the command's help), in
# the order the root help lists them.
COMMANDS = {
    "chat": ("chat", "Chat with a model in the terminal."),
    "run": ("run", "Answer one prompt and exit."),
    "list": ("models", "List models in the store, and registry names you can pull."),
    "show": ("models", "Show a model's metadata and the memory it needs at a context size."),
    "rm": ("models", "Remove a model from the store, and the file it downloaded."),
    "info": ("info", "Show the backend build, threads, memory and GPUs."),
    "pull": ("pull", "Download a model from the Hugging Face Hub into the local store."),
    "quantize": ("quantize", "Quantize a model to a GGUF file and register it."),
    "serve": ("serve", "Serve models over OpenAI's, Anthropic's and Ollama's APIs."),
    "cluster": ("cluster", "Serve a model from replicas on a Ray cluster."),
    "launch": ("launch", "Run Claude Code, Codex or any OpenAI client on a local model."),
    "ps": ("remote", "Show the models a running server has loaded."),
    "stop": ("remote", "Unload a model from a running server."),
    "bench": ("bench", "Measure throughput and latency the way the LLM Almanac does."),
    "eval": ("evaluate", "Measure model quality."),
    "cache": ("cache", "Show or clear the on-disk prompt-prefix KV cache."),
    "mcp": ("mcp", "List MCP servers and the tools they give the model."),
    "config": ("config_cmd", "Show the settings in effect and where each comes from."),
}


# Typer's rich help puts `<bool>` beside every flag, as if it took a value;
# a flag shows no type, like click's plain help. A Typer without this hook
# is left as it is (tests/test_help.py would then name the placeholder).
_display_type_rich = getattr(TyperOption, "display_type_rich", None)


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    assert _display_type_rich is not None
    return None if self.is_flag else _display_type_rich(self, ctx)


if _display_type_rich is not None:
    TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]


class _Pending(TyperCommand):
    """Stands in for a command whose module is not imported yet: enough to
    be listed in the root help, never run."""

    def __init__(self, name: str, module: str, summary: str):
        super().__init__(name, help=summary)
        self.module = module


class LazyGroup(TyperGroup):
    """The root group: commands are _Pending until resolved to be run."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        for name, (module, summary) in COMMANDS.items():
            self.commands.setdefault(name, _Pending(name, module, summary))

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[Any, Any, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        if isinstance(cmd, _Pending):
            assert name is not None     # the name click found `cmd` under
            cmd = self.load(cmd.module)[name]
        return name, cmd, rest

    def load(self, module: str) -> MutableMapping[str, Command]:
        """Import one command module and put its real commands in place of
        their stand-ins; returns them by name. Raises ImportError as the
        import does (e.g. a dependency missing)."""
        scratch = typer.Typer()
        importlib.import_module(f"llmctl.cli.{module}").register(scratch)
        real = typer.main.get_group(scratch).commands
        self.commands.update(real)
        return real


app = typer.Typer(
    name="llmctl",
    cls=LazyGroup,
    help="Run open-weight LLMs on your own machine: pull, quantize, chat and serve.\n\n"
         "Example: llmctl run smollm2 \"Name three primary colours.\"",
    no_args_is_help=True,
    # --install-completion and --show-completion, for bash, zsh and fish.
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"llmctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", envvar="LLMCTL_DEBUG",
                               help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    # Imported here, where a command is about to run: common imports rich,
    # which `--version` and `--help` (eager, they exit before this) skip.
    from llmctl.cli.common import State, fail
    from llmctl.cli.config_cmd import apply_config
    from llmctl.config_file import ConfigError

    State.debug = debug
    try:
        apply_config(ctx)
    except ConfigError as e:
        fail(e.message, e.exit_code)


def main() -> None:
    app()
