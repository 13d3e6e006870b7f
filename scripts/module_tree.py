#!/usr/bin/env python3
"""The package tree, one line per module: its path and the first sentence
of its docstring. docs/architecture.md's tree is this script's output.

    .venv/bin/python scripts/module_tree.py [--markdown]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["llmctl", "cli", "runtime", "server", "store", "hub", "quantize", "bench", "cluster", "tools"]


def summary(path: Path) -> str:
    """The first sentence of the module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split())
    end = text.find(". ")
    return text[: end + 1] if end >= 0 else text


def modules() -> list[Path]:
    """Every real module below the package folders (llmctl/'s links skipped)."""
    out = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_symlink() or any(p.is_symlink() for p in path.relative_to(ROOT).parents
                                        if (ROOT / p) != ROOT and (ROOT / p).is_symlink()):
                continue
            if path.name == "__init__.py" and not summary(path):
                continue
            out.append(path)
    return out


def main() -> None:
    markdown = "--markdown" in sys.argv
    for path in modules():
        name = str(path.relative_to(ROOT))
        print(f"- `{name}`: {summary(path)}" if markdown else f"{name:44} {summary(path)}")


if __name__ == "__main__":
    main()
