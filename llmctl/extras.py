"""Optional extras (Ray for `cluster`, matplotlib for `--plot`, the MCP
SDK for `--mcp`): a command that needs one that is missing fails before
it starts, with one line naming the extra and the exact command that
installs it into the environment in use."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

from llmctl.errors import UsageError

# extra -> (the module it provides, what needs it)
EXTRAS = {"cluster": ("ray", "llmctl cluster"), "plot": ("matplotlib", "--plot"),
          "mcp": ("mcp", "MCP tools")}
_REPO = Path(__file__).resolve().parent.parent


def install_command(extra: str) -> str:
    """How to install `extra` where this llmctl runs: through the
    repository's ./scripts/llmctl when this is its virtual environment,
    else with this interpreter's pip."""
    if Path(sys.prefix).resolve() == (_REPO / ".venv").resolve() and \
            (_REPO / "scripts" / "llmctl").is_file():
        return f"LLMCTL_EXTRAS={extra} ./scripts/llmctl {shlex.join(sys.argv[1:])}".rstrip()
    return f"{shlex.quote(sys.executable)} -m pip install 'llmctl[{extra}]'"


def require(extra: str) -> None:
    """Raise UsageError (one line) when `extra`'s module is not installed."""
    module, what = EXTRAS[extra]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):       # a broken or half-removed install
        found = False
    if not found:
        raise UsageError(f"{what} needs the `{extra}` extra, which is not installed: run "
                         f"{install_command(extra)}")
