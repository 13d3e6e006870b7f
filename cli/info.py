"""`llmctl info`: what this install can do."""

from __future__ import annotations

import typer
from rich.table import Table

from llmctl.cli import options as o
from llmctl.cli.common import handle_errors, out, print_json
from llmctl.runtime.system import system_info


@handle_errors
def info(json: o.Json = False) -> None:
    """Show the backend build, threads, memory and GPUs.

    Example: llmctl info --json
    """
    s = system_info()
    if json:
        print_json(s.to_dict())
        return
    table = Table(show_header=False, box=None)
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
    out.print(table)


def _lcp_version() -> str:
    from importlib.metadata import version

    return version("llama_cpp_python")


def register(app: typer.Typer) -> None:
    app.command("info")(info)
