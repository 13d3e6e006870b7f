"""The Almanac's method: serial (concurrency 1) for unloaded latency, all N
at once for maximum throughput, and the levels between."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llmctl.bench.client import RequestResult, Target, run_level
from llmctl.bench.prompts import build_prompts
from llmctl.bench.stats import level_stats
from llmctl.bench.tokenizers import Tokenizer
from llmctl.bench.workloads import Workload


def requests_for(concurrency: int, requests: int) -> int:
    """At least one request per slot, so a level sees all its concurrency."""
    return max(requests, concurrency)


def _progress(console: Console | None) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn(),
                    console=console, transient=True,
                    disable=console is None or not console.is_terminal)


def run_sweep(target: Target, tok: Tokenizer, workload: Workload, levels: list[int],
              requests: int, timeout: float, seed: int,
              console: Console | None = None, burst: int | None = None) -> list[dict]:
    """Run each level in turn; return one stats dict per level. The
    `burst` level sends exactly that many requests, all at once."""
    out = []
    with _progress(console) as progress:
        for n_level, concurrency in enumerate(levels):
            n = burst if concurrency == burst else requests_for(concurrency, requests)
            # Fresh prompts per level: a level must not hit the cache the
            # previous one warmed. Built before the clock starts.
            prompts = build_prompts(tok, n, workload.input_tokens, workload.shared_prefix,
                                    seed=seed + n_level)
            task = progress.add_task(f"concurrency {concurrency:>4}", total=n, errors=0)
            errors = 0

            def done(res: RequestResult, task=task) -> None:
                nonlocal errors
                errors += not res.ok
                progress.update(task, advance=1, errors=errors)

            results, duration = asyncio.run(run_level(
                target, [p.text for p in prompts], concurrency, workload.output_tokens,
                timeout, on_done=done))
            for res, prompt in zip(results, prompts, strict=False):
                _fill_prompt_tokens(res, prompt.tokens)
            stats = asdict(level_stats(concurrency, results, duration))
            out.append(stats)
            if console is not None and not console.is_terminal:
                # No live bar off a terminal (logs, CI): one line per level instead.
                console.print(f"concurrency {concurrency}: {stats['ok']}/{n} ok, "
                              f"{stats['errors']} errors, {duration:.1f} s", markup=False)
    return out


def _fill_prompt_tokens(res: RequestResult, built_tokens: int) -> None:
    """Servers that omit usage get the builder's count: the best we know."""
    if res.prompt_tokens is None and res.ok:
        res.prompt_tokens = built_tokens
