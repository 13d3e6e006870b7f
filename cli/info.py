"""`llmctl info`: what this install can do."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import handle_errors, out, print_json
from llmctl.runtime.system import system_info

NoExactness = Annotated[bool, typer.Option(
    "--no-exactness", help="Skip measuring whether batching changes greedy answers on this "
                           "machine (it loads the default model for about a second).")]

# The two settings whose guarantee may differ (JSON key, label, flash
# attention, repacked weights): serve's default, whose kernels compute a row
# alone and in a batch alike (docs/exactness.md), and --repack.
_SETTINGS = (("default", "serve's default", True, False),
             ("repack", "--repack", True, True))


@handle_errors
def info(json: o.Json = False, no_exactness: NoExactness = False) -> None:
    """Show the backend build, threads, memory and GPUs.

    Also whether greedy answers are bit-exact across batch shapes on this
    machine, measured on the default model (docs/exactness.md).

    Example: llmctl info --json
    """
    s = system_info()
    exactness = None if no_exactness else _exactness()
    if json:
        print_json({**s.to_dict(), **({"exactness": exactness} if exactness else {})})
        return
    table = Table(show_header=False, box=None)
    table.add_column(no_wrap=True)          # names whole, values wrapped: never cut
    table.add_column(overflow="fold")
    table.add_row("[bold]backend[/]", "llama.cpp via llama-cpp-python " + _lcp_version())
    table.add_row("[bold]GPU offload[/]", "supported" if s.gpu_offload else "not in this build (CPU only)")
    table.add_row("[bold]CPU features[/]", " ".join(s.cpu_features) or "-")
    table.add_row("[bold]threads[/]", f"{s.default_threads} (physical cores: {s.physical_cores}, "
                  f"logical CPUs: {s.logical_cpus})")
    table.add_row("[bold]RAM[/]", f"{s.ram_total_gib} GiB total, {s.ram_available_gib} GiB available")
    gpus = ", ".join(f"#{g.index} {g.name}: {g.free_mib} MiB free of {g.total_mib}" for g in s.gpus)
    table.add_row("[bold]GPUs[/]", gpus or "none found")
    if s.build_flags:
        table.add_row("[bold]build flags[/]", s.build_flags)
    if exactness:
        _exactness_rows(table, exactness)
    out.print(table)


def _exactness() -> dict[str, Any]:
    """The row-exactness measurement on the default model for each setting,
    or the reason it could not be made. Raises nothing: info must still
    answer on a machine with no model."""
    from llmctl.errors import LlmctlError
    from llmctl.runtime.llama.exactness import measure_rows
    from llmctl.store.resolve import resolve_model

    try:
        resolved = resolve_model(None)
        results = {}
        for key, _, flash, repack in _SETTINGS:
            r = measure_rows(resolved.path, flash_attn=flash, repack=repack)
            results[key] = {**r.to_dict(), "cache_hits_exact": r.exact and _hits_exact(repack)}
    except LlmctlError as e:
        return {"measured": False, "reason": str(e)}
    return {"measured": True, "model": resolved.name, **results}


def _hits_exact(repack: bool) -> bool:
    """Whether a prefix-cache hit computes the rows a cold prefill would,
    given rows that are exact: where a chunk of any size takes the per-row
    kernel, or where the tile rule holds prompts apart (prefix_cache/rule.py)."""
    from llmctl.runtime.llama.library import has_fa_rows_kernel
    from llmctl.runtime.load_options import LoadOptions

    return has_fa_rows_kernel() or LoadOptions(repack=repack).prompt_tile > 1


def _exactness_rows(table: Table, exactness: dict[str, Any]) -> None:
    if not exactness["measured"]:
        table.add_row("[bold]exactness[/]", f"not measured: {exactness['reason']}")
        return
    from llmctl.runtime.llama.exactness import RowExactness

    for key, label, _, _ in _SETTINGS:
        fields = dict(exactness[key])
        hits_exact = fields.pop("cache_hits_exact")
        r = RowExactness(**fields)
        caveat = "" if hits_exact or not r.exact else (
            "; but a prefix-cache hit may round differently (this build lacks llmctl's "
            "flash-attention kernel)")
        table.add_row(f"[bold]exactness[/], {label}", r.summary() + caveat)
    table.add_row("", f"(measured just now on {exactness['model']}, {r.threads} threads: "
                      "see docs/exactness.md; --no-exactness skips it)")


def _lcp_version() -> str:
    from importlib.metadata import version

    return version("llama_cpp_python")


def register(app: typer.Typer) -> None:
    app.command("info")(info)
