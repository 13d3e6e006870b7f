"""Help that reads well in an 80-column terminal: `llmctl --help` and every
command's and subcommand's `--help` fit 80 columns, list each command on one
line with a whole sentence, show an example, and put no `<bool>` beside a
flag (a flag takes no value)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from conftest import REPO
from llmctl.cli.app import COMMANDS, app

WIDTH = 80


def _all_commands() -> list[list[str]]:
    group = typer.main.get_group(app)
    for module in {module for module, _ in COMMANDS.values()}:
        group.load(module)

    def walk(cmd, path: list[str]):
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(group, []))[1:]


COMMAND_PATHS = _all_commands()


def _listed(help_text: str) -> list[str]:
    """The lines of a help's Commands panel, borders stripped."""
    lines = help_text.splitlines()
    start = next((i for i, line in enumerate(lines) if "─ Commands ─" in line), None)
    if start is None:
        return []
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("╰"):
            break
        rows.append(line.strip("│ ").rstrip())
    return rows


def _check(help_text: str, where: str) -> None:
    wide = [line for line in help_text.splitlines() if len(line) > WIDTH]
    assert not wide, f"{where}: lines wider than {WIDTH} columns: {wide}"
    assert "<bool>" not in help_text, where
    assert "Example" in help_text, f"{where} shows no example"
    for row in _listed(help_text):
        name, _, summary = row.partition(" ")
        # A continuation line starts with spaces, so its "name" is empty.
        assert name and summary.strip().endswith("."), \
            f"{where}: a summary is not one whole sentence on one line: {row!r}"


def test_root_help_fits_and_lists_whole_sentences():
    env = {**os.environ, "COLUMNS": str(WIDTH), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "llmctl", "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _check(proc.stdout, "llmctl --help")
    assert [row.split(" ")[0] for row in _listed(proc.stdout)] == list(COMMANDS)


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=" ".join)
def test_command_help_fits_and_shows_an_example(path):
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="llmctl",
                                env={"COLUMNS": str(WIDTH), "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    _check(result.output, f"llmctl {' '.join(path)} --help")
