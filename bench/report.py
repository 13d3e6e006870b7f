"""Reporting: the rich table, the JSON file, and side-by-side comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from rich import box
from rich.table import Table

from llmctl.errors import UsageError

FORMAT_VERSION = 1


# Compact numbers: the table has twelve columns to fit in 80.
def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}" if x < 0.01 else f"{x * 1000:.0f}"


def sec(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 \
        else f"{x:.0f}"


def latency_unit(values: list[float | None]) -> tuple[str, Callable]:
    """Milliseconds, unless the slowest value needs more than four digits."""
    known = [v for v in values if v is not None]
    return ("s", sec) if known and max(known) >= 10 else ("ms", ms)


def describe(run: dict) -> str:
    wl, target = run["workload"], run["target"]
    shared = f", shared prefix {wl['shared_prefix']}" if wl["shared_prefix"] else ""
    return (f"{target['model']} at {target['url']} · {wl['name']}: {wl['input_tokens']} in, "
            f"{wl['output_tokens']} out{shared} · tokenizer {run['tokenizer']}"
            f"{'' if target['ignore_eos'] else ' · ignore_eos not accepted'}")


def run_table(run: dict) -> Table:
    levels = run["levels"]
    t_unit, t_fmt = latency_unit([lv["ttft"][q] for lv in levels for q in ("p50", "p95", "p99")])
    i_unit, i_fmt = latency_unit([lv["itl"][q] for lv in levels for q in ("p50", "p95")])
    # Borderless and terse, so twelve columns fit an 80-column terminal.
    table = Table(title=describe(run), title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, padding=(0, 0, 0, 1),
                  caption=f"TTFT in {t_unit}, ITL in {i_unit}, E2E in s",
                  caption_justify="left")
    for name in ("conc", "reqs", "err", "req/s", "tok/s", "TTFT p50", "p95", "p99",
                 "ITL p50", "p95", "E2E p50", "p95"):
        table.add_column(name, justify="right")
    for lv in levels:
        t, i, e = lv["ttft"], lv["itl"], lv["e2e"]
        table.add_row(str(lv["concurrency"]), str(lv["requests"]),
                      f"[red]{lv['errors']}[/]" if lv["errors"] else "0",
                      rate(lv["requests_per_s"]), rate(lv["output_tokens_per_s"]),
                      t_fmt(t["p50"]), t_fmt(t["p95"]), t_fmt(t["p99"]),
                      i_fmt(i["p50"]), i_fmt(i["p95"]), sec(e["p50"]), sec(e["p95"]))
    return table


def slo_line(run: dict) -> str | None:
    if run.get("slo_ttft") is None:
        return None
    best = run.get("best_under_slo")
    if best is None:
        return f"No level meets TTFT p95 <= {run['slo_ttft']:g} s without errors."
    return (f"Best under TTFT p95 <= {run['slo_ttft']:g} s: concurrency {best['concurrency']}, "
            f"{rate(best['requests_per_s'])} req/s, {rate(best['output_tokens_per_s'])} tok/s "
            f"(TTFT p95 {ms(best['ttft_p95'])} ms)")


def error_counts(run: dict) -> dict[str, int]:
    """Each distinct error message with its count over all levels, commonest first."""
    counts: dict[str, int] = {}
    for lv in run["levels"]:
        for msg, n in lv["error_messages"].items():
            counts[msg] = counts.get(msg, 0) + n
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def error_lines(run: dict, limit: int = 3) -> list[str]:
    return [f"{n} x {msg}" for msg, n in list(error_counts(run).items())[:limit]]


def write_json(run: dict, path: Path) -> None:
    path.write_text(json.dumps(run, indent=1) + "\n")


def load_json(path: Path) -> dict:
    try:
        run = json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"{path} is not JSON: {e}") from None
    if not isinstance(run, dict) or "llmctl_bench" not in run or "levels" not in run:
        raise UsageError(f"{path} is not an `llmctl bench --json` file")
    return run


# (label, getter, higher is better, formatter)
METRICS: list[tuple[str, Callable[[dict], Any], bool, Callable[[Any], str]]] = [
    ("req/s", lambda lv: lv["requests_per_s"], True, rate),
    ("tok/s", lambda lv: lv["output_tokens_per_s"], True, rate),
    ("TTFT p50 ms", lambda lv: lv["ttft"]["p50"], False, ms),
    ("TTFT p95 ms", lambda lv: lv["ttft"]["p95"], False, ms),
    ("TTFT p99 ms", lambda lv: lv["ttft"]["p99"], False, ms),
    ("ITL p50 ms", lambda lv: lv["itl"]["p50"], False, ms),
    ("ITL p95 ms", lambda lv: lv["itl"]["p95"], False, ms),
    ("E2E p50 s", lambda lv: lv["e2e"]["p50"], False, sec),
    ("E2E p95 s", lambda lv: lv["e2e"]["p95"], False, sec),
    ("errors", lambda lv: lv["errors"], False, str),
]


def ratio(a: float | None, b: float | None, higher_better: bool) -> str:
    if a is None or b is None or a == 0:
        return "-"
    r = b / a
    better = r > 1 if higher_better else r < 1
    colour = "green" if better and abs(r - 1) > 0.05 else "red" if abs(r - 1) > 0.05 else ""
    return f"[{colour}]{r:.2f}x[/]" if colour else f"{r:.2f}x"


def compare_table(a: dict, b: dict, name_a: str, name_b: str) -> Table:
    """Levels present in both runs, metric by metric, with B/A ratios."""
    table = Table(title=f"A = {name_a}   B = {name_b}", title_justify="left",
                  caption=f"A: {describe(a)}\nB: {describe(b)}")
    for col in ("conc", "metric", "A", "B", "B/A"):
        table.add_column(col, justify="right")
    by_conc = {lv["concurrency"]: lv for lv in b["levels"]}
    common = [lv for lv in a["levels"] if lv["concurrency"] in by_conc]
    if not common:
        raise UsageError(f"{name_a} and {name_b} share no concurrency level to compare")
    for lv_a in common:
        lv_b = by_conc[lv_a["concurrency"]]
        for n, (label, get, higher, fmt) in enumerate(METRICS):
            table.add_row(str(lv_a["concurrency"]) if n == 0 else "", label,
                          fmt(get(lv_a)), fmt(get(lv_b)), ratio(get(lv_a), get(lv_b), higher),
                          end_section=n == len(METRICS) - 1)
    return table
