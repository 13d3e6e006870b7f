"""The layout rules the code keeps: each is a grep or an AST walk over the
source tree, so a change that breaks one fails here by name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["llmctl", "cli", "runtime", "store", "hub", "server", "quantize", "bench", "cluster", "tools"]
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def sources(*folders: str) -> list[Path]:
    """The real .py files below the folders (llmctl/'s folder links are skipped)."""
    out = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if not any(p.is_symlink() for p in [path, *path.parents] if ROOT in p.parents):
                out.append(path)
    return out


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def imports(path: Path) -> set[str]:
    """Every module the file imports, at any depth in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_only_runtime_llama_imports_llama_cpp():
    pattern = re.compile(r"^\s*(import llama_cpp|from llama_cpp)", re.M)
    importers = [rel(p) for p in sources(*PACKAGES) if pattern.search(p.read_text())]
    assert importers, "the llama.cpp boundary imports llama_cpp somewhere"
    assert [f for f in importers if not f.startswith("runtime/llama/")] == []


def test_only_tools_imports_the_mcp_sdk():
    """MCP is an optional extra: one package speaks to it."""
    pattern = re.compile(r"^\s*(import mcp\b|from mcp[ .])", re.M)
    importers = [rel(p) for p in sources(*PACKAGES) if pattern.search(p.read_text())]
    assert importers, "the MCP boundary imports mcp somewhere"
    assert [f for f in importers if not f.startswith("tools/")] == []


def test_no_file_over_the_line_limit():
    files = sources(*PACKAGES, "scripts")
    long = {rel(p): n for p in files if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert long == {}


def test_no_function_over_the_line_limit():
    long = {}
    for path in sources(*PACKAGES, "scripts"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = node.end_lineno - start + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{rel(path)}:{node.lineno} {node.name}"] = length
    assert long == {}


def test_runtime_top_level_stays_small():
    modules = sorted(p.name for p in (ROOT / "runtime").glob("*.py"))
    assert len(modules) <= 12, modules


def test_one_place_in_the_server_opens_generation_streams():
    calls = [f"{rel(p)}:{i}" for p in sources("server")
             for i, line in enumerate(p.read_text().splitlines(), 1) if "open_feed(" in line
             and not line.lstrip().startswith(("def ", "#"))]
    assert len(calls) == 1, calls


def test_chat_formats_are_pure_python():
    banned = ("llama_cpp", "llmctl.runtime.llama", "llmctl.runtime.engine")
    leaks = {rel(p): sorted(m for m in imports(p) if m.startswith(banned))
             for p in sources("runtime/formats")}
    assert {f: m for f, m in leaks.items() if m} == {}


def test_layers_point_down():
    """The store never imports the hub, and the runtime never imports a protocol."""
    leaks = {rel(p): sorted(m for m in imports(p) if m.startswith("llmctl.hub"))
             for p in sources("store")}
    leaks |= {rel(p): sorted(m for m in imports(p) if m.startswith(("llmctl.server", "llmctl.cli")))
              for p in sources("runtime")}
    assert {f: m for f, m in leaks.items() if m} == {}


def test_the_prefix_cache_decides_and_the_kv_manager_acts():
    """prefix_cache/ imports no engine (the engine imports it), and the
    engine's KV changes only in runtime/engine/kv.py (a draft model's own
    context aside)."""
    leaks = {rel(p): sorted(m for m in imports(p) if m.startswith("llmctl.runtime.engine"))
             for p in sources("runtime/prefix_cache")}
    assert {f: m for f, m in leaks.items() if m} == {}
    kv_call = re.compile(r"\.(seq_rm|seq_cp|seq_add|state_set|state_get)\(")
    callers = {rel(p) for p in sources("runtime", "server", "cli") if kv_call.search(p.read_text())}
    assert {f for f in callers if not f.startswith("runtime/llama/")} == \
        {"runtime/engine/kv.py", "runtime/speculation/draft.py"}


def test_the_package_links_name_every_folder():
    """llmctl/<folder> is how editors and mypy see each subpackage."""
    for folder in PACKAGES[1:]:
        link = ROOT / "llmctl" / folder
        assert link.is_symlink() and link.resolve() == ROOT / folder, folder


def test_the_wheel_lists_every_subpackage():
    """An editable install finds every folder; a built wheel ships only the
    packages pyproject.toml names, so a folder missing there is missing for
    every user who installs the wheel."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    for folder in PACKAGES[1:]:
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel_dir = init.parent.relative_to(ROOT)
            name = "llmctl." + ".".join(rel_dir.parts)
            assert name in listed, f"{name} is not in pyproject.toml's packages"
            assert tool["package-dir"][name] == str(rel_dir), name


def test_the_architecture_page_lists_the_tree_as_it_is():
    import subprocess
    import sys

    tree = subprocess.run([sys.executable, str(ROOT / "scripts/module_tree.py"), "--markdown"],
                          capture_output=True, text=True, check=True, timeout=60).stdout
    assert tree in (ROOT / "docs/architecture.md").read_text()
