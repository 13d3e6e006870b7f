"""A missing optional extra is a one-line usage error naming the extra and
the command that installs it, never an internal error. Each command runs
in a subprocess whose interpreter cannot import the extra's module (a
sitecustomize hides it, as a venv without the extra would lack it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HIDE = """
import importlib.abc, sys
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""


def without(module: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    site = tmp_path / "hide"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE.format(module=module))
    env = {**os.environ, "PYTHONPATH": str(site), "NO_COLOR": "1",
           "LLMCTL_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "llmctl", *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)


@pytest.mark.parametrize("module, extra, args", [
    ("ray", "cluster", ("cluster", "serve", "smollm2")),
    ("matplotlib", "plot", ("bench", "smollm2", "--plot", "out.png")),
    ("mcp", "mcp", ("mcp", "ls", "--mcp", "servers.json")),
])
def test_a_missing_extra_names_itself_and_its_install(tmp_path, module, extra, args):
    (tmp_path / "servers.json").write_text('{"mcpServers": {"x": {"command": "true"}}}')
    r = without(module, tmp_path, *args)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "internal error" not in line and "Traceback" not in line
    assert f"`{extra}` extra" in line
    assert f"-m pip install 'llmctl[{extra}]'" in line or \
        f"LLMCTL_EXTRAS={extra} ./scripts/llmctl {' '.join(args)}" in line
