"""What scripts/_setup.sh installs: ./scripts/llmctl must bring every
documented flag's dependency (`bench --plot` needs matplotlib), and
./scripts/test's extras must cover the CLI's, so a venv set up by one
satisfies the other without reinstalling. Running the set-up itself takes
minutes, so this checks the two declarations it rests on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[1]


def optional_deps() -> dict[str, list[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


def cli_extras() -> list[str]:
    found = re.search(r'^CLI_EXTRAS="([^"]*)"$', (REPO / "scripts/_setup.sh").read_text(),
                      re.MULTILINE)
    assert found, "scripts/_setup.sh no longer names the CLI's extras in CLI_EXTRAS"
    return [e for e in found.group(1).split(",") if e]


def requirements(extras: list[str]) -> set[str]:
    """Every requirement the extras bring, with `llmctl[...]` expanded."""
    deps = optional_deps()
    out: set[str] = set()
    for extra in extras:
        for line in deps[extra]:
            req = Requirement(line)
            if req.name == "llmctl":
                out |= requirements(sorted(req.extras))
            else:
                out.add(str(req))
    return out


def test_the_cli_setup_installs_matplotlib_for_bench_plot():
    names = {Requirement(r).name for r in requirements(cli_extras())}
    assert "matplotlib" in names


def test_the_test_extras_cover_the_cli_extras():
    assert requirements(cli_extras()) <= requirements(["test"])
