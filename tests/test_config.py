"""The config file (issue 26): defaults for any flag by its long name, under
a flag and an LLMCTL_* variable and over the built-in default, each layer
checked by what a command really does and by `llmctl config show`; found
through LLMCTL_CONFIG, XDG_CONFIG_HOME or ~/.config; a mistake is one line
naming the file, the line and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.app import app

runner = CliRunner()
# smollm2 answers "Hi" with far more than three tokens at temperature 0, so
# the completion's length says which max-tokens won.
RUN = ["run", "smollm2", "Hi", "--temperature", "0", "--ctx-size", "256", "--json"]


@pytest.fixture(autouse=True)
def _no_model_variable(monkeypatch):
    # conftest names SmolLM2 through LLMCTL_MODEL; `config show` would list it.
    monkeypatch.delenv("LLMCTL_MODEL", raising=False)


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "config.toml"
    monkeypatch.setenv("LLMCTL_CONFIG", str(path))
    monkeypatch.delenv("LLMCTL_MAX_TOKENS", raising=False)
    monkeypatch.delenv("LLMCTL_TEMPERATURE", raising=False)
    return path


def _tokens(*args: str, env: dict[str, str] | None = None) -> int:
    result = runner.invoke(app, [*RUN, *args], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["completion_tokens"]


def _shown(command: str) -> dict:
    result = runner.invoke(app, ["config", "show", *command.split(), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_each_layer_wins_over_the_one_below(config):
    assert _shown("run")["commands"]["run"]["max-tokens"] == {"value": None, "source": "default"}
    config.write_text("# defaults\n[run]\nmax-tokens = 3\n")
    assert _tokens() == 3
    assert _shown("run")["commands"]["run"]["max-tokens"] == {"value": 3,
                                                               "source": f"{config}:3"}
    env = {"LLMCTL_MAX_TOKENS": "2"}
    assert _tokens(env=env) == 2
    assert _tokens("--max-tokens", "1", env=env) == 1
    shown = runner.invoke(app, ["config", "show", "run", "--json"], env=env)
    assert json.loads(shown.stdout)["commands"]["run"]["max-tokens"] == {
        "value": "2", "source": "env LLMCTL_MAX_TOKENS"}


def test_top_level_keys_tables_and_subcommands(config):
    config.write_text('temperature = 0.25\n[serve]\nkv_type = "q8_0"\n'
                      "no-prefix-cache = true\n[cache.ls]\njson = true\n")
    every = _shown("")["commands"]
    assert every["run"]["temperature"]["value"] == 0.25 == every["chat"]["temperature"]["value"]
    assert every["serve"]["kv-type"] == {"value": "q8_0", "source": f"{config}:3"}
    assert every["serve"]["no-prefix-cache"]["value"] is True
    assert every["cache ls"]["json"]["source"] == f"{config}:6"
    # Only settings off their built-in default are listed without a command.
    assert "temperature" not in every.get("serve", {})
    listed = runner.invoke(app, ["cache", "ls"])
    assert listed.exit_code == 0 and "caches" in json.loads(listed.stdout)


def test_the_file_is_found_where_xdg_says(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCTL_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert _shown("")["file"] == str(tmp_path / "llmctl" / "config.toml")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _shown("")["file"] == str(tmp_path / "home" / ".config" / "llmctl" / "config.toml")
    monkeypatch.setenv("LLMCTL_CONFIG", str(tmp_path / "mine.toml"))
    assert _shown("") == {"file": str(tmp_path / "mine.toml"), "exists": False, "commands": {}}


@pytest.mark.parametrize("body, line, says", [
    ("temperature = 0.2\n[run]\nmax-tokenz = 3\n", 3, "run.max-tokenz: `llmctl run` has no"),
    ('[run]\n\nmax-tokens = "many"\n', 3, "run.max-tokens: bad value 'many'"),
    ('[serve]\nkv-type = "q9"\n', 2, "serve.kv-type: bad value 'q9'"),
    ("[runn]\nseed = 1\n", 2, "runn.seed: [runn] names no command"),
    ("[run]\nseed = = 1\n", 2, "not valid TOML"),
    ("[cache]\nbogus = 1\n", 2, "cache.bogus: no `cache` command has --bogus"),
])
def test_a_bad_config_is_one_line_naming_file_line_and_key(config, body, line, says):
    config.write_text(body)
    # A command checks its own table; `config show` checks every table.
    own = {"[cache]": ["cache", "ls"], "[serve]": ["serve", "smollm2", "--port", "1"]}
    for command in (["config", "show"], own.get(body.split("\n")[0], RUN)):
        _refused(config, command, line, says)


def _refused(config: Path, command: list[str], line: int, says: str) -> None:
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {config}:{line}: "), lines
    assert says in lines[0]
