"""`llmctl eval perplexity MODEL`: llama.cpp-compatible perplexity."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import handle_errors, out, print_json
from llmctl.cli.quantize import phase_progress

eval_app = typer.Typer(name="eval", no_args_is_help=True,
                       help="Measure model quality.\n\nExample: llmctl eval perplexity smollm2")


@eval_app.command("perplexity")
@handle_errors
def perplexity(
    model: o.ModelArg = None,
    file: Annotated[Optional[Path], typer.Option(
        "--file", "-f", help="UTF-8 text to score (default: the bundled text).")] = None,
    ctx: Annotated[int, typer.Option("--ctx", help="Window size in tokens.")] = 512,
    chunks: Annotated[Optional[int], typer.Option(
        "--chunks", min=1, help="Score only the first N windows.")] = None,
    threads: o.Threads = None,
    json: o.Json = False,
) -> None:
    """Measure MODEL's perplexity on a text as llama-perplexity does.

    The text is cut into windows of --ctx tokens, each scored on its second
    half, so figures compare directly with llama.cpp's.

    Example: llmctl eval perplexity smollm2 --file notes.txt
    """
    from llmctl.quantize.evaltext import load_text
    from llmctl.quantize.perplexity import perplexity as measure
    from llmctl.store import resolve_model

    text = load_text(file)
    resolved = resolve_model(model)
    with phase_progress(not json) as progress:
        result = measure(resolved.path, text, ctx=ctx, threads=threads, max_chunks=chunks,
                         progress=(lambda d, t: progress("perplexity", d, t)) if progress else None)
    data = {"name": resolved.name, **result.to_dict()}
    if json:
        print_json(data)
    else:
        out.print(f"{resolved.name}: perplexity {result.perplexity:.4f} ± {result.stderr:.4f} "
                  f"({result.chunks} windows of {result.ctx}, {result.tokens_scored} tokens "
                  f"scored, {result.seconds:.1f}s)", markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
