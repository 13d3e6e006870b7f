"""The CLI starts without the heavy half of llmctl: `--version`, `--help` and
`list` import no web server, no llama.cpp and no engine. Checked through
sys.modules in a fresh interpreter, not with a clock."""

import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from llmctl.cli.app import COMMANDS, app
from llmctl.cli.common import handle_errors
from llmctl.cli.options import Generation

HEAVY = ("fastapi", "uvicorn", "llama_cpp", "llmctl.runtime.engine.loop", "llmctl.server", "mcp")

# Runs one command in-process, then reports its exit code and which heavy
# modules it left loaded on the last line of stdout.
PROBE = """
import json, sys
from llmctl.cli.app import app
heavy = {heavy!r}
try:
    app(sys.argv[1:], prog_name="llmctl")
    code = 0
except SystemExit as e:
    code = e.code or 0
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
print("\\n" + json.dumps({{"code": code, "heavy": loaded}}))
"""


def _probe(*args: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
                          capture_output=True, text=True, timeout=120)
    *output, report = proc.stdout.rstrip("\n").splitlines()
    return json.loads(report), "\n".join(output)


@pytest.mark.parametrize("args, shows", [(["--version"], "llmctl 0.1.0"),
                                         (["--help"], "Commands"),
                                         (["list"], "Local models")])
def test_light_commands_import_nothing_heavy(args, shows):
    report, output = _probe(*args)
    assert report["code"] == 0 and shows in output
    assert report["heavy"] == []


def test_the_probe_sees_heavy_imports():
    # The same check on a command that loads a model, so that the empty
    # lists above mean something.
    report, output = _probe("run", "smollm2", "Hi", "--max-tokens", "1", "--ctx-size", "128")
    assert report["code"] == 0, output
    assert {"llama_cpp", "llmctl.runtime.engine.loop"} <= set(report["heavy"])


def _root_help(group: typer.core.TyperGroup, capsys) -> str:
    with typer.Context(group, info_name="llmctl") as ctx:
        printed = group.get_help(ctx)
    return printed + capsys.readouterr().out


def test_root_help_lists_the_real_commands(capsys):
    """The stand-ins' summaries and order match the modules' own commands,
    and no command is missing from COMMANDS."""
    group = typer.main.get_group(app)
    lazy = _root_help(group, capsys)
    for module in {module for module, _ in COMMANDS.values()}:
        group.load(module)
    assert list(group.commands) == list(COMMANDS)
    assert "Chat with a model" in lazy and _root_help(group, capsys) == lazy


def test_chat_and_run_declare_the_shared_options_identically():
    group = typer.main.get_group(app)
    shared = [f.name for f in Generation.__dataclass_fields__.values()]

    def declared(name: str) -> list[tuple]:
        cmd = group.load(name)[name]
        return [(p.name, p.opts, p.envvar, p.default, p.help) for p in cmd.params
                if p.name in shared]

    assert len(shared) == 11 and len(declared("chat")) == 11
    assert declared("chat") == declared("run")


def test_typer_usage_errors_raised_in_a_command_exit_2_not_as_internal_errors():
    scratch = typer.Typer()

    @scratch.command()
    @handle_errors
    def cmd(n: int = 1) -> None:
        raise typer.BadParameter("must exceed --other", param_hint="--n")

    r = CliRunner().invoke(scratch, [])
    assert r.exit_code == 2, r.output
    assert "must exceed --other" in r.output and "internal error" not in r.output
