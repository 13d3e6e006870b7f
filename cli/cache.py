"""`llmctl cache ls` and `llmctl cache clear`: the on-disk prefix KV cache."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from typing_extensions import Annotated

from llmctl import settings
from llmctl.cli import options as o
from llmctl.cli.common import handle_errors, human_bytes, out, print_json
from llmctl.cli.tables import fitted
from llmctl.runtime.prefix_cache import disk as kv_disk


def _root():
    return settings.cache_dir() / "prefix"


@handle_errors
def ls(json: o.Json = False) -> None:
    """List saved prompt-prefix KV states by model and setting.

    For each: its entries, tokens and bytes.

    Example: llmctl cache ls --json
    """
    rows = kv_disk.list_entries(_root())
    if json:
        print_json({"path": str(_root()), "caches": rows,
                    "total_bytes": sum(r["bytes"] for r in rows)})
        return
    cells = [[escape(r["model"]), str(r["n_ctx_seq"]), str(r["n_seq_max"]), str(r["entries"]),
              f"{r['tokens']:,}", human_bytes(r["bytes"]), r["sha256"][:12]] for r in rows]
    out.print(fitted(("MODEL", "CTX/SEQ", "SEQS", "ENTRIES", "TOKENS", "SIZE", "SHA256"), cells,
                     out, whole=("MODEL",), drops=("SHA256", "CTX/SEQ", "SEQS", "ENTRIES"),
                     title=escape(f"Prefix cache ({_root()})"), title_justify="left"))
    if not rows:
        out.print("(empty)")


@handle_errors
def clear(
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Only this model's entries (its name, or a sha256 prefix).")] = None,
    json: o.Json = False,
) -> None:
    """Delete saved prompt-prefix KV states (all, or one model's).

    Example: llmctl cache clear --model smollm2
    """
    removed = kv_disk.clear(_root(), model)
    if json:
        print_json({"removed": removed, "freed_bytes": sum(r["bytes"] for r in removed)})
        return
    freed = sum(r["bytes"] for r in removed)
    out.print(f"Removed {sum(r['entries'] for r in removed)} entries "
              f"({human_bytes(freed)}) from {len(removed)} cache(s)", markup=False)


def register(app: typer.Typer) -> None:
    cache_app = typer.Typer(help="Show or clear the on-disk prompt-prefix KV cache.\n\n"
                                 "Example: llmctl cache ls",
                            no_args_is_help=True)
    cache_app.command("ls")(ls)
    cache_app.command("clear")(clear)
    app.add_typer(cache_app, name="cache")
