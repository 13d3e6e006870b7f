"""Shell completion: `--show-completion` writes a script for bash, zsh and
fish, and a model argument completes to the store's and models.toml's names.
Driven as each shell drives it: bash really sources the script and calls its
function; zsh and fish are asked through the environment their scripts set."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from conftest import REPO
from llmctl.cli.app import app
from llmctl.store.index import ModelEntry, StoreIndex

SCRIPT_NEEDS = {"bash": "complete_bash", "zsh": "compdef _llmctl_completion llmctl",
                "fish": "complete --command llmctl"}


@pytest.fixture
def store_model(empty_home) -> str:
    name = "my-local-model"
    StoreIndex().add(ModelEntry(name=name, path="/nonexistent.gguf", size=0, sha256="0" * 64,
                                architecture="llama", parameters=0, quant="Q4_0",
                                context_length=0))
    return name


def _script(shell: str, monkeypatch) -> str:
    # Typer reads this when it builds the options: with it, --show-completion
    # takes the shell by name instead of detecting the one it runs under.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = CliRunner().invoke(app, ["--show-completion", shell], prog_name="llmctl")
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("shell", list(SCRIPT_NEEDS))
def test_each_shell_gets_a_completion_script(shell, monkeypatch):
    script = _script(shell, monkeypatch)
    assert SCRIPT_NEEDS[shell] in script and "_LLMCTL_COMPLETE" in script


def _complete(env: dict[str, str]) -> list[str]:
    result = CliRunner().invoke(app, [], prog_name="llmctl", env=env)
    assert result.exit_code == 0, result.output
    return result.output.split()


def test_zsh_and_fish_complete_model_names(store_model):
    zsh = _complete({"_LLMCTL_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "llmctl chat "})
    assert store_model in " ".join(zsh) and "smollm2" in " ".join(zsh)
    fish = _complete({"_LLMCTL_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
                      "_TYPER_COMPLETE_ARGS": "llmctl serve qwen2.5-coder"})
    assert fish and all(name.startswith("qwen2.5-coder") for name in fish)
    # An option that names a model completes the same way.
    draft = _complete({"_LLMCTL_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
                       "_TYPER_COMPLETE_ARGS": "llmctl run --draft my-"})
    assert draft == [store_model]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_sources_the_script_and_completes_a_model(store_model, monkeypatch, tmp_path):
    script = tmp_path / "llmctl.bash"
    script.write_text(_script("bash", monkeypatch))
    command = tmp_path / "bin" / "llmctl"
    command.parent.mkdir()
    command.write_text(f"#!/bin/sh\nexec {sys.executable} -c "
                       "'from llmctl.cli.app import app; app(prog_name=\"llmctl\")' \"$@\"\n")
    command.chmod(0o755)
    shell = (f'export PATH="{command.parent}:$PATH"; source {script}; '
             'COMP_WORDS=(llmctl run ""); COMP_CWORD=2; _llmctl_completion llmctl; '
             'printf "%s\\n" "${COMPREPLY[@]}"')
    proc = subprocess.run(["bash", "-c", shell], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    names = proc.stdout.split()
    assert proc.returncode == 0, proc.stderr
    # The store's names first, then the registry's.
    assert names[0] == store_model and "smollm2" in names and "gemma3-270m" in names
