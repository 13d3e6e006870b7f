#!/usr/bin/env python3
"""Coding agents through `llmctl launch`, on small real tasks: does the
agent finish each, in how many requests (turns), how long, and how much of
its prompt came from the prefix cache.

Per agent, one `llmctl serve` sized as launch sizes it (the model's
context up to 32k, 2 slots) runs the tasks in order, each in a fresh
folder, through `llmctl launch AGENT --url` with the agent in its
non-interactive mode and permissions granted (it runs in a scratch
folder). A task is finished when its check passes:

- hello: create hello.txt containing exactly "hi";
- rename: rename compute_total to sum_items across util.py and main.py,
  main.py still running;
- test: add test_calc.py with a pytest test of calc.add, and it passes.

Usage: .venv/bin/python scripts/bench_launch.py [--agent claude --agent codex]
           [--model qwen2.5-coder-1.5b] [--task hello] [--timeout 1800]
           [--bin-dir /opt/agents/node_modules/.bin] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import httpx

from llmctl.bench.launcher import Server

REPO = Path(__file__).resolve().parent.parent


def _hello(_: Path) -> None:
    pass


def _hello_done(d: Path) -> bool:
    f = d / "hello.txt"
    return f.is_file() and f.read_text().strip() == "hi"


def _rename(d: Path) -> None:
    (d / "util.py").write_text("def compute_total(items):\n    return sum(items)\n")
    (d / "main.py").write_text("from util import compute_total\n\n"
                               "print(compute_total([1, 2, 3]))\n")


def _rename_done(d: Path) -> bool:
    texts = [(d / f).read_text() for f in ("util.py", "main.py") if (d / f).is_file()]
    if len(texts) < 2 or any("compute_total" in t or "sum_items" not in t for t in texts):
        return False
    run = subprocess.run([sys.executable, "main.py"], cwd=d, capture_output=True, text=True,
                         timeout=60)
    return run.returncode == 0 and run.stdout.strip() == "6"


def _test(d: Path) -> None:
    (d / "calc.py").write_text("def add(a, b):\n    return a + b\n")


def _test_done(d: Path) -> bool:
    if not (d / "test_calc.py").is_file():
        return False
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "test_calc.py"], cwd=d,
                         capture_output=True, text=True, timeout=120)
    return run.returncode == 0 and " passed" in run.stdout


TASKS: dict[str, tuple[str, Callable[[Path], None], Callable[[Path], bool]]] = {
    "hello": ("Create a file named hello.txt that contains exactly the text: hi",
              _hello, _hello_done),
    "rename": ("Rename the function compute_total to sum_items in util.py and in main.py.",
               _rename, _rename_done),
    "test": ("Add a file test_calc.py with a pytest test for the add function in calc.py. "
             "The test must pass.", _test, _test_done),
}
# Each agent's non-interactive run of one prompt, permissions granted.
AGENT_ARGS = {
    "claude": lambda task: ["-p", task, "--dangerously-skip-permissions"],
    "codex": lambda task: ["exec", "--skip-git-repo-check",
                           "--dangerously-bypass-approvals-and-sandbox", task],
}


def _stats(url: str, model: str) -> dict:
    row = httpx.get(f"{url}/stats", timeout=30).json()["models"].get(model, {})
    return {"requests": sum(row.get("requests", {}).values()),
            "prompt": row.get("prompt_tokens", 0), "cached": row.get("prefix_cache_hit_tokens", 0),
            "generated": row.get("generation_tokens", 0)}


def run_task(agent: str, task: str, url: str, model: str, timeout: float,
             bin_dir: Path) -> dict:
    prompt, setup, done = TASKS[task]
    work = Path(tempfile.mkdtemp(prefix=f"llmctl-{agent}-{task}-"))
    setup(work)
    before = _stats(url, model)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IS_SANDBOX": "1",
           "NO_COLOR": "1", "HOME": str(work / ".home")}
    argv = [sys.executable, "-m", "llmctl", "launch", agent, model, "--url", url, "--",
            *AGENT_ARGS[agent](prompt)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                              timeout=timeout)
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code, out = None, f"{e.stdout or ''}{e.stderr or ''}"
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
    wall = time.monotonic() - t0
    after = _stats(url, model)
    prompt_tokens = after["prompt"] - before["prompt"]
    return {"agent": agent, "task": task, "finished": done(work), "exit": code,
            "timed_out": code is None, "turns": after["requests"] - before["requests"],
            "wall_s": round(wall, 1), "prompt_tokens": prompt_tokens,
            "cached_share": round((after["cached"] - before["cached"]) / prompt_tokens, 3)
            if prompt_tokens else None,
            "generated_tokens": after["generated"] - before["generated"],
            "folder": str(work), "tail": out[-1500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agent", action="append", choices=sorted(AGENT_ARGS))
    ap.add_argument("--task", action="append", choices=sorted(TASKS))
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per task")
    ap.add_argument("--bin-dir", type=Path, default=Path("/opt/agents/node_modules/.bin"))
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    rows = []
    for agent in args.agent or ["claude", "codex"]:
        with Server.llmctl_serve(args.model, "--ctx-size", "32768", "--max-num-seqs", "2") as srv:
            srv.wait_ready(900)
            for task in args.task or list(TASKS):
                row = run_task(agent, task, srv.url, args.model, args.timeout, args.bin_dir)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "tail"}), flush=True)
    print("\n| agent | task | finished | turns | wall s | cached share |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        share = "–" if r["cached_share"] is None else f"{r['cached_share']:.0%}"
        end = "yes" if r["finished"] else ("no (timed out)" if r["timed_out"] else "no")
        print(f"| {r['agent']} | {r['task']} | {end} | {r['turns']} | {r['wall_s']} | {share} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
