"""`llmctl pull`: a thin wrapper over llmctl.hub.pull."""

from __future__ import annotations

import contextlib
from typing import List, Optional

import typer

from llmctl.cli.common import err, handle_errors, human_bytes, print_json
from llmctl.cli.complete import model_names

HELP = """Download a model from the Hugging Face Hub into the local store.

MODEL is a models.toml name or ORG/REPO[:QUANT]. Without a quant tag, Q4_K_M
is preferred, then Q8_0. Files go to the standard Hugging Face cache, are
fetched over several parallel range requests, resume when interrupted, and
are checked against the Hub's sha256 before they are registered.

\b
Examples:
  llmctl pull smollm2
  llmctl pull bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M
  llmctl pull bartowski/Qwen2.5-0.5B-Instruct-GGUF --dry-run
  llmctl pull Qwen/Qwen2.5-0.5B-Instruct        # safetensors, for `llmctl quantize`
"""


def register(app: typer.Typer) -> None:
    @app.command("pull", help=HELP)
    @handle_errors
    def pull_cmd(
        model: str = typer.Argument(..., help="models.toml name or ORG/REPO[:QUANT].",
                                    autocompletion=model_names),
        revision: Optional[str] = typer.Option(None, "--revision", help="Branch, tag or commit."),
        include: Optional[List[str]] = typer.Option(
            None, "--include", help="Glob of files to fetch instead of the automatic choice "
            "(repeatable)."),
        exclude: Optional[List[str]] = typer.Option(
            None, "--exclude", help="Glob of files to skip (repeatable)."),
        connections: int = typer.Option(
            16, "--connections", "-c", min=1, max=256, envvar="LLMCTL_PULL_CONNECTIONS",
            help="Parallel range requests per file."),
        dry_run: bool = typer.Option(False, "--dry-run", help="List the files and sizes; "
                                     "download nothing."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    ) -> None:
        from llmctl.cli.pull_progress import PullProgressBar
        from llmctl.hub import pull

        silent = quiet or json_out or dry_run
        with (contextlib.nullcontext() if silent else PullProgressBar()) as bar:
            result = pull(model, revision=revision, include=include or None,
                          exclude=exclude or None, connections=connections, dry_run=dry_run,
                          events=bar)
        if json_out:
            print_json(result.to_dict())
            return
        if dry_run:
            for f in result.files:
                state = "  (have it)" if f.cached else ""
                print(f"{human_bytes(f.size):>10}  {f.path}{state}")
            total = sum(f.size for f in result.files if not f.cached)
            print(f"{human_bytes(total):>10}  to download from {result.repo_id}@{result.commit[:12]}")
            return
        if quiet:
            return
        for name in result.registered:
            print(f"pulled {name}")
        if not result.registered:
            print(f"pulled {result.repo_id} into {result.snapshot}")
            if result.kind == "safetensors":
                err.print(f"no GGUF in this repo: run `llmctl quantize {result.repo_id}` "
                          "to make one", markup=False)
