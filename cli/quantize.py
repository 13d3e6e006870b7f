"""`llmctl quantize MODEL --bits 4|8`: a GGUF that runs well on a CPU."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Optional

import typer
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, human_bytes, out, print_json
from llmctl.cli.complete import model_names

_PHASES = {"convert": "converting to GGUF", "quantize": "quantizing",
           "check source": "perplexity (source)", "check result": "perplexity (result)"}


@contextlib.contextmanager
def phase_progress(enabled: bool) -> Iterator:
    """A rich bar per phase on stderr; a no-op callback when disabled."""
    if not enabled:
        yield None
        return
    bar = Progress(TextColumn("{task.description:<22}"), BarColumn(), TaskProgressColumn(),
                   TimeElapsedColumn(), console=err, transient=False)
    tasks: dict[str, TaskID] = {}

    def update(phase: str, done: int, total: int) -> None:
        # Started on first use, so an early error prints no empty bar.
        if not tasks:
            bar.start()
        if phase not in tasks:
            tasks[phase] = bar.add_task(_PHASES.get(phase, phase), total=total)
        bar.update(tasks[phase], completed=done, total=total)

    try:
        yield update
    finally:
        if tasks:
            bar.stop()


def print_summary(r: dict) -> None:
    ratio = r["size_after"] / r["size_before"] if r["size_before"] else 0
    for w in r["warnings"]:
        err.print(f"warning: {w}", markup=False)
    out.print(f"{r['name']}  {r['type']}  {r['path']}", markup=False)
    out.print(f"size: {human_bytes(r['size_before'])} -> {human_bytes(r['size_after'])} "
              f"({ratio:.0%} of the source) in {r['seconds']:.1f}s", markup=False)
    if r.get("intermediate"):
        out.print(f"kept: {r['intermediate']}", markup=False)
    check = r.get("check")
    if check:
        out.print(f"{'':8}{'perplexity':>12}{'size':>14}", markup=False)
        for label in ("source", "result"):
            row = check[label]
            size = human_bytes(row["size"])
            out.print(f"{label:8}{row['perplexity']:12.3f}{size:>14}", markup=False)
        out.print(f"change: {check['delta_pct']:+.2f}% perplexity", markup=False)


@handle_errors
def quantize(
    model: Annotated[str, typer.Argument(
        help="Store name, GGUF path, Hugging Face safetensors directory, or pulled repo id.",
        autocompletion=model_names)],
    bits: Annotated[Optional[int], typer.Option("--bits", "-b",
                                                help="4 → Q4_K_M, 8 → Q8_0.")] = None,
    type: Annotated[Optional[str], typer.Option(
        "--type", "-t", help="Any llama.cpp type: Q4_0, Q4_K_S, Q5_K_M, Q6_K, Q8_0, ...")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Where to write the GGUF (default: the store).")] = None,
    threads: o.Threads = None,
    allow_requantize: Annotated[bool, typer.Option(
        "--allow-requantize", help="Quantize an already quantized model (quality drops).")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Measure perplexity of source and result side by side.")] = False,
    check_file: Annotated[Optional[Path], typer.Option(
        "--check-file", help="Text for --check (default: the bundled text).")] = None,
    check_chunks: Annotated[Optional[int], typer.Option(
        "--check-chunks", min=1, help="Score only the first N 512-token windows.")] = None,
    keep_f16: Annotated[bool, typer.Option(
        "--keep-f16", help="Keep the intermediate F16/BF16 GGUF of a safetensors model.")] = False,
    force: Annotated[bool, typer.Option("--force", "-f",
                                        help="Overwrite an existing output file.")] = False,
    json: o.Json = False,
) -> None:
    """Quantize a model to a GGUF file and register it.

    Q4_K_M, Q8_0 or any type this llama.cpp build writes.

    Example: llmctl quantize ./SmolLM2-135M-Instruct --bits 4 --check
    """
    with phase_progress(not json) as progress:
        from llmctl.quantize import quantize_model

        result = quantize_model(model, bits=bits, type=type, output=output, threads=threads,
                                allow_requantize=allow_requantize, check=check,
                                keep_f16=keep_f16, force=force, check_file=check_file,
                                check_chunks=check_chunks, progress=progress)
    if json:
        print_json(result.to_dict())
    else:
        print_summary(result.to_dict())


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize)
