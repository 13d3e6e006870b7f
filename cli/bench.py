"""`llmctl bench`: throughput and latency of a model or an OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import typer

from llmctl.cli.common import err, handle_errors, out

EPILOG = """Examples:

  llmctl bench smollm2 --workload decode-heavy --scale 0.25 --concurrency 1,4,16

  llmctl bench --url http://localhost:8080/v1 --requests 32 --slo-ttft 1.0 --json a.json --plot a.png

  llmctl bench --compare a.json b.json
"""


def register(app: typer.Typer) -> None:
    app.command("bench", epilog=EPILOG)(bench)


@handle_errors
def bench(
    model: Optional[str] = typer.Argument(
        None, help="Model to serve with `llmctl serve` for the run (default: the default "
                   "model). With --url: the model name to request.", show_default=False),
    url: Optional[str] = typer.Option(
        None, "--url", help="Benchmark a running OpenAI-compatible server instead "
                            "(llmctl serve, llama-server, vLLM, Ollama's /v1)."),
    workload: Optional[str] = typer.Option(
        None, "--workload", help="prefill-heavy (1024 in, 128 out; default), "
                                 "decode-heavy (128 in, 1024 out) or custom."),
    input_tokens: Optional[int] = typer.Option(None, "--input-tokens",
                                               help="Prompt tokens (custom workload)."),
    output_tokens: Optional[int] = typer.Option(None, "--output-tokens",
                                                help="Generated tokens (custom workload)."),
    scale: float = typer.Option(1.0, "--scale",
                                help="Shrink both sizes by this factor, e.g. 0.25 on small CPUs."),
    shared_prefix: int = typer.Option(
        0, "--shared-prefix", help="Tokens all prompts share, to measure prefix caching. "
                                   "Default 0: every prompt is unique."),
    requests: int = typer.Option(64, "--requests", "-n",
                                 help="Requests per level; the maximum-throughput level "
                                      "sends them all at once."),
    concurrency: Optional[str] = typer.Option(
        None, "--concurrency", "-c", help="Comma-separated levels, e.g. 1,4,16. "
                                          "Default: 1, 2, 4, ... up to --requests."),
    slo_ttft: Optional[float] = typer.Option(
        None, "--slo-ttft", help="Report the best throughput whose TTFT p95 is within "
                                 "this many seconds."),
    json_file: Optional[Path] = typer.Option(None, "--json",
                                             help="Write every request's timings here."),
    plot: Optional[Path] = typer.Option(None, "--plot",
                                        help="Write a PNG of throughput against TTFT p95 "
                                             "(needs llmctl\\[plot])."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds allowed per request."),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="LLMCTL_API_KEY", show_default=False,
        help="Bearer token for servers that require one (`llmctl serve --api-key`)."),
    compare: Optional[Tuple[str, str]] = typer.Option(
        None, "--compare", show_default=False, metavar="A.json B.json",
        help="Print two --json runs side by side with B/A ratios; runs nothing."),
) -> None:
    """Measure throughput and latency the way the LLM Almanac does: serial,
    all-at-once, and a concurrency sweep between."""
    from llmctl.bench import api

    if compare and compare[0] is not None:
        out.print(api.compare(Path(compare[0]), Path(compare[1])))
        return
    run = api.bench(model=model, url=url, workload=workload, input_tokens=input_tokens,
                    output_tokens=output_tokens, scale=scale, shared_prefix=shared_prefix,
                    requests=requests, concurrency=concurrency, slo_ttft=slo_ttft,
                    json_file=json_file, plot=plot, timeout=timeout, api_key=api_key,
                    console=err)
    out.print(api.report.run_table(run))
    line = api.report.slo_line(run)
    if line:
        out.print(line)
    for msg in api.report.error_lines(run):
        err.print(f"errors: {msg}", markup=False)
    api.check_run(run)
