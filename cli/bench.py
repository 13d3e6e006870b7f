"""`llmctl bench`: throughput and latency of a model or an OpenAI-compatible server."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Tuple

import typer
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, out
from llmctl.cli.complete import model_names

EPILOG = """Examples:

  llmctl bench smollm2 --workload decode-heavy --scale 0.25 --concurrency 1,4,16

  llmctl bench --url http://localhost:8080/v1 --slo-ttft 1.0 --json a.json

  llmctl bench --url http://localhost:8000/v1 --burst 1000 --scale 0.125

  llmctl bench --compare a.json b.json
"""


def register(app: typer.Typer) -> None:
    app.command("bench", epilog=EPILOG)(bench)


@o.option_group
@dataclasses.dataclass(frozen=True)
class Sweep:
    """What `llmctl bench` sends and where: the arguments of bench.api.bench."""

    url: Annotated[Optional[str], typer.Option(
        "--url", help="Benchmark a running OpenAI-compatible server instead "
                      "(llmctl serve, llama-server, vLLM, Ollama's /v1).")] = None
    workload: Annotated[Optional[str], typer.Option(
        "--workload", help="prefill-heavy (1024 in, 128 out; default), "
                           "decode-heavy (128 in, 1024 out) or custom.")] = None
    input_tokens: Annotated[Optional[int], typer.Option(
        "--input-tokens", help="Prompt tokens (custom workload).")] = None
    output_tokens: Annotated[Optional[int], typer.Option(
        "--output-tokens", help="Generated tokens (custom workload).")] = None
    scale: Annotated[float, typer.Option(
        "--scale", help="Shrink both sizes by this factor, e.g. 0.25 on small CPUs.")] = 1.0
    shared_prefix: Annotated[int, typer.Option(
        "--shared-prefix", help="Tokens all prompts share, to measure prefix caching. "
                                "Default 0: every prompt is unique.")] = 0
    requests: Annotated[int, typer.Option(
        "--requests", "-n", help="Requests per level; the maximum-throughput level "
                                 "sends them all at once.")] = 64
    concurrency: Annotated[Optional[str], typer.Option(
        "--concurrency", "-c", help="Comma-separated levels, e.g. 1,4,16. "
                                    "Default: 1, 2, 4, ... up to --requests.")] = None
    burst: Annotated[Optional[int], typer.Option(
        "--burst", show_default=False,
        help="End with N requests sent at once (the Almanac's throughput arm); "
             "with --slo-ttft, sweep 1, 2, 4, ... up to N first.")] = None
    chat: Annotated[bool, typer.Option(
        "--chat", help="Send each prompt as a chat message (/v1/chat/completions) "
                       "instead of raw text (/v1/completions).")] = False
    slo_ttft: Annotated[Optional[float], typer.Option(
        "--slo-ttft", help="Report the best throughput whose TTFT p95 is within "
                           "this many seconds.")] = None
    json_file: Annotated[Optional[Path], typer.Option(
        "--json", help="Write every request's timings here.")] = None
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="Write a PNG of throughput against TTFT p95 (needs llmctl\\[plot]).")] = None
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds allowed per request.")] = 600.0
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="LLMCTL_API_KEY", show_default=False,
        help="Bearer token for servers that require one (`llmctl serve --api-key`).")] = None


@handle_errors
@o.with_groups
def bench(
    model: Annotated[Optional[str], typer.Argument(
        help="Model to serve with `llmctl serve` for the run (default: the default "
             "model). With --url: the model name to request.", show_default=False,
        autocompletion=model_names)] = None,
    *,
    sweep: Sweep,
    compare: Annotated[Optional[Tuple[str, str]], typer.Option(
        "--compare", show_default=False, metavar="A.json B.json",
        help="Print two --json runs side by side with B/A ratios; runs nothing.")] = None,
) -> None:
    """Measure throughput and latency the way the LLM Almanac does.

    Three phases: serial requests, all at once, and a concurrency sweep
    between them.
    """
    from llmctl.bench import api

    if compare and compare[0] is not None:
        out.print(api.compare(Path(compare[0]), Path(compare[1])))
        return
    run = api.bench(model=model, **dataclasses.asdict(sweep), console=err)
    out.print(api.report.run_table(run))
    line = api.report.slo_line(run)
    if line:
        out.print(line)
    for msg in api.report.error_lines(run):
        err.print(f"errors: {msg}", markup=False)
    api.check_run(run)
