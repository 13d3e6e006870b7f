#!/usr/bin/env python3
"""Start-up time of the CLI: `llmctl --version`, `llmctl --help` and
`llmctl list` beside a bare `python -c pass`, in one run. Commands take
turns within each round, so a noisy machine slows all of them alike.

    .venv/bin/python scripts/bench_startup.py [--rounds 9] [--json]

Target: --version and --help under 300 ms once set up."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_MS = 300.0


def _llmctl() -> list[str]:
    # The console script users run; `python -m llmctl` where there is none.
    script = Path(sys.executable).parent / "llmctl"
    if script.exists():
        return [str(script)]
    found = shutil.which("llmctl")
    return [found] if found else [sys.executable, "-m", "llmctl"]


def cases() -> dict[str, list[str]]:
    cli = _llmctl()
    return {"python -c pass": [sys.executable, "-c", "pass"],
            "llmctl --version": [*cli, "--version"],
            "llmctl --help": [*cli, "--help"],
            "llmctl list": [*cli, "list"]}


def time_once(argv: list[str]) -> float:
    """Seconds for one run. Raises CalledProcessError if it fails."""
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    return time.perf_counter() - t0


def measure(rounds: int) -> dict[str, list[float]]:
    runs = cases()
    for argv in runs.values():      # warm the page cache and .pyc files
        time_once(argv)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, argv in runs.items():
            samples[name].append(time_once(argv))
    return samples


def summarize(samples: dict[str, list[float]]) -> list[dict]:
    base = statistics.median(samples["python -c pass"])
    rows = []
    for name, s in samples.items():
        med = statistics.median(s)
        rows.append({"command": name, "median_ms": round(med * 1e3, 1),
                     "min_ms": round(min(s) * 1e3, 1),
                     "over_python_ms": round((med - base) * 1e3, 1),
                     "x_python": round(med / base, 2), "rounds": len(s)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9, help="timed runs of each command")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    try:
        rows = summarize(measure(max(args.rounds, 1)))
    except subprocess.CalledProcessError as e:
        sys.exit(f"{' '.join(e.cmd)} failed ({e.returncode}): {e.stderr.decode().strip()}")
    if args.json:
        print(json.dumps({"rows": rows, "target_ms": TARGET_MS}, indent=2))
        return
    print(f"{'command':<18}{'median ms':>10}{'min ms':>9}{'- python':>10}{'x python':>10}")
    for r in rows:
        print(f"{r['command']:<18}{r['median_ms']:>10.1f}{r['min_ms']:>9.1f}"
              f"{r['over_python_ms']:>10.1f}{r['x_python']:>10.2f}")
    fast = [r for r in rows if r["command"] in ("llmctl --version", "llmctl --help")]
    verdict = "met" if all(r["median_ms"] < TARGET_MS for r in fast) else "NOT met"
    print(f"target: --version and --help under {TARGET_MS:.0f} ms (median): {verdict}")


if __name__ == "__main__":
    main()
