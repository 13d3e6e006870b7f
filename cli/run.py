"""`llmctl run MODEL PROMPT`: a one-shot answer on stdout."""

from __future__ import annotations

import sys

import typer
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, print_json
from llmctl.errors import UsageError
from llmctl.runtime.llm import LoadOptions
from llmctl.runtime.oneshot import read_prompt, run_prompt
from llmctl.runtime.sampling import SamplingParams


@handle_errors
def run(
    model: o.ModelArg = None,
    prompt: Annotated[str, typer.Argument(help="The prompt, or - to read it from stdin.")] = "-",
    system: o.System = None,
    temperature: o.Temperature = 0.8,
    top_p: o.TopP = 0.95,
    top_k: o.TopK = 40,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = None,
    ctx_size: o.CtxSize = None,
    threads: o.Threads = None,
    n_gpu_layers: o.GpuLayers = "auto",
    stats: Annotated[bool, typer.Option("--stats", help="Print speed to stderr.")] = False,
    json: o.Json = False,
) -> None:
    """Answer one prompt and exit.

    Example: llmctl run smollm2 "Why is the sky blue?" --max-tokens 64
    """
    text = read_prompt(prompt)
    if not text.strip():
        raise UsageError("the prompt is empty")
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                            max_tokens=max_tokens)
    # One prompt, one answer: a prefix cache would only cost us flash
    # attention (the engine turns it off for exact cache hits) for no reuse.
    load = LoadOptions(ctx_size=ctx_size, threads=threads, prefix_cache=False,
                       n_gpu_layers=n_gpu_layers)

    def write(chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()

    result = run_prompt(model, text, params, load, system=system,
                        on_text=None if json else write)
    if json:
        print_json({"text": result.text, "prompt_tokens": result.usage.prompt_tokens,
                    "completion_tokens": result.usage.completion_tokens,
                    "ttft_s": round(result.ttft_s, 4),
                    "tokens_per_s": round(result.tokens_per_s, 2),
                    "finish_reason": result.finish_reason})
    else:
        write("\n")
    if stats:
        err.print(f"prompt {result.usage.prompt_tokens} tok, generated "
                  f"{result.usage.completion_tokens} tok, TTFT {result.ttft_s:.3f}s, "
                  f"{result.tokens_per_s:.1f} tok/s")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
