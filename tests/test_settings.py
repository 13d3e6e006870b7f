"""The settings without a flag: one definition (llmctl/settings.py's VARS),
read and checked once, documented from that definition, and no other
module reads an `LLMCTL_*` variable itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from llmctl.errors import UsageError
from llmctl.settings import VARS, Settings, markdown_table

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "cli", "cluster", "hub", "llmctl", "quantize", "runtime", "server", "store",
            "tools")


def test_the_defaults_are_the_definitions():
    assert Settings.load({}) == Settings()
    assert Settings().engine_stall_s == 60.0 and Settings().workers_body == 2


@pytest.mark.parametrize("var", VARS, ids=lambda v: v.name)
def test_every_variable_is_read_and_a_bad_one_is_named(var):
    value = Settings.load({var.variable: "3"})
    assert getattr(value, var.attr) == 3
    assert Settings.load({var.variable: ""}) == Settings()         # empty is unset
    for bad in ("soon", "-1", "inf", "nan", "1e999"):
        with pytest.raises(UsageError, match=var.variable) as e:
            Settings.load({var.variable: bad})
        assert "\n" not in str(e.value)
    # Counts are whole numbers; only retries may be 0.
    if var.kind in ("count", "retries"):
        with pytest.raises(UsageError, match=var.variable):
            Settings.load({var.variable: "1.5"})
    zero = {var.variable: "0"}
    if var.kind == "retries":
        assert getattr(Settings.load(zero), var.attr) == 0
    else:
        with pytest.raises(UsageError, match=var.variable):
            Settings.load(zero)


def test_the_configuration_page_holds_the_table_of_the_definitions():
    page = (REPO / "docs/configuration.md").read_text()
    assert markdown_table() in page
    printed = subprocess.run([sys.executable, str(REPO / "scripts/settings_table.py")],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    assert printed == markdown_table()


def _environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Reads of the environment by an LLMCTL_ name (a constant or an
    f-string with it), and calls of the settings module's own reader."""
    found = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call):
            fn = ast.unparse(node.func)
            if fn in ("os.environ.get", "os.getenv", "environ.get", "getenv") and node.args:
                target = node.args[0]
            if fn.endswith("settings.env"):
                found.append((node.lineno, fn))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and ast.unparse(node.value) in ("os.environ", "environ"):
            target = node.slice
        if target is not None and "LLMCTL_" in ast.unparse(target):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_but_the_settings_reads_an_llmctl_variable():
    offenders = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == "llmctl/settings.py":
                continue
            for line, what in _environment_reads(ast.parse(path.read_text())):
                offenders.append(f"{rel}:{line}: {what}")
    assert offenders == []


def test_the_check_catches_what_it_looks_for():
    src = ('import os\nfrom llmctl import settings\na = os.environ.get("LLMCTL_X")\n'
           'b = os.environ[f"LLMCTL_{n}"]\nc = settings.env("X")\nd = os.environ.get("HOME")\n')
    assert [line for line, _ in _environment_reads(ast.parse(src))] == [3, 4, 5]
