"""The library entry points behind `llmctl bench`: `bench` and `compare`."""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
from pathlib import Path
from typing import Iterator

from rich.console import Console
from rich.table import Table

from llmctl import __version__
from llmctl.bench import plot as plotting
from llmctl.bench import report
from llmctl.bench.client import auth_headers, discover_model, normalize_url, probe_features
from llmctl.bench.launcher import Server
from llmctl.bench.stats import best_under_slo
from llmctl.bench.sweep import run_sweep
from llmctl.bench.tokenizers import ApproxTokenizer, GgufTokenizer, ServerTokenizer, Tokenizer
from llmctl.bench.workloads import burst_levels, make_workload, parse_concurrency
from llmctl.errors import LlmctlError, UsageError

DEFAULT_REQUESTS = 64   # the Almanac's N for a CPU: enough to fill every slot
DEFAULT_TIMEOUT_S = 600.0


def _check_outputs(json_file: Path | None, plot: Path | None) -> None:
    for path, what in ((json_file, "--json"), (plot, "--plot")):
        if path is not None and not Path(path).expanduser().resolve().parent.is_dir():
            raise UsageError(f"{what} {path}: directory does not exist")
    if plot is not None:
        if Path(plot).suffix.lower() != ".png":
            raise UsageError(f"--plot writes a PNG; name it *.png, not {plot}")
        plotting.require_matplotlib()


@contextlib.contextmanager
def _endpoint(model: str | None, url: str | None, api_key: str | None,
              console: Console | None) -> Iterator[tuple[str, str | None, Tokenizer, bool]]:
    """Yield (base URL, model name to request, tokenizer, launched)."""
    if url is not None:
        base = normalize_url(url)
        name = discover_model(base, model, api_key)
        probed = ServerTokenizer.probe(base[:-len("/v1")], name, auth_headers(api_key))
        yield base, name, probed or ApproxTokenizer(), False
        return
    from llmctl.store.resolve import default_model_name, resolve_model

    model = model or default_model_name()
    tok = GgufTokenizer(resolve_model(model).path)   # fails fast on a bad MODEL
    if console:
        console.print(f"starting `llmctl serve {model}` ...", markup=False)
    with Server.llmctl_serve(model) as server:
        yield server.url + "/v1", None, tok, True


def bench(model: str | None = None, url: str | None = None, workload: str | None = None,
          input_tokens: int | None = None, output_tokens: int | None = None,
          scale: float = 1.0, shared_prefix: int = 0, requests: int = DEFAULT_REQUESTS,
          concurrency: str | None = None, slo_ttft: float | None = None,
          json_file: Path | None = None, plot: Path | None = None,
          timeout: float = DEFAULT_TIMEOUT_S, api_key: str | None = None,
          burst: int | None = None, chat: bool = False,
          console: Console | None = None) -> dict:
    """Benchmark MODEL (served here by `llmctl serve`) or the server at URL.
    `burst`: end with that many requests sent at once (workloads.burst_levels);
    `chat`: send each prompt as a chat message instead of raw text.
    Returns the run as the JSON file has it; writes --json and --plot."""
    wl = make_workload(workload, input_tokens, output_tokens, scale, shared_prefix)
    levels = parse_concurrency(concurrency, requests) if burst is None else \
        burst_levels(burst, concurrency, requests, slo_ttft is not None)
    if slo_ttft is not None and slo_ttft <= 0:
        raise UsageError(f"--slo-ttft must be a positive number of seconds, got {slo_ttft:g}")
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout:g}")
    _check_outputs(json_file, plot)
    seed = secrets.randbits(32)   # fresh prompts every run: no cache carries over
    with _endpoint(model, url, api_key, console) as (base, name, tok, launched):
        name = name or discover_model(base, None, api_key)
        target = probe_features(base, name, timeout, api_key, chat)
        results = run_sweep(target, tok, wl, levels, requests, timeout, seed, console, burst)
    run = {
        "llmctl_bench": report.FORMAT_VERSION,
        "llmctl_version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "target": {"url": base, "model": name, "launched": launched,
                   "ignore_eos": target.ignore_eos, "usage": target.usage},
        "workload": wl.to_dict(),
        "tokenizer": tok.kind,
        "seed": seed,
        "requests": requests,
        "burst": burst,
        "chat": chat,
        "timeout_s": timeout,
        "slo_ttft": slo_ttft,
        "levels": results,
    }
    run["best_under_slo"] = _slo_summary(results, slo_ttft)
    if json_file is not None:
        report.write_json(run, Path(json_file))
    if plot is not None:
        plotting.write_plot(run, Path(plot))
    return run


def _slo_summary(levels: list[dict], slo_ttft: float | None) -> dict | None:
    best = best_under_slo(levels, slo_ttft) if slo_ttft is not None else None
    if best is None:
        return None
    return {"concurrency": best["concurrency"], "requests_per_s": best["requests_per_s"],
            "output_tokens_per_s": best["output_tokens_per_s"], "ttft_p95": best["ttft"]["p95"]}


def check_run(run: dict) -> None:
    """A run where nothing succeeded has no numbers to offer: say why."""
    if any(lv["ok"] for lv in run["levels"]):
        return
    total = sum(lv["requests"] for lv in run["levels"])
    top = next(iter(report.error_counts(run)), "unknown error")
    raise LlmctlError(f"all {total} requests failed: {top}")


def compare(a: Path, b: Path) -> Table:
    """Two --json runs side by side, with B/A ratios for every metric."""
    run_a, run_b = report.load_json(a), report.load_json(b)
    return report.compare_table(run_a, run_b, str(a), str(b))
