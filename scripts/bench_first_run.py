#!/usr/bin/env python3
"""Time a new user's first run: a fresh clone, an empty HOME, one answer.

    python scripts/bench_first_run.py                      # HEAD of this repo
    python scripts/bench_first_run.py --rev 5e0f3a2 --json # an older commit

It clones the repository into a temporary folder, points HOME (and so pip's
cache, the wheel cache and the model store) at an empty folder, and runs
`./scripts/llmctl run PROMPT` there as a user would. Every line the set-up
prints on stderr is stamped with the seconds since the start, so the gaps
between lines are the stages' wall times; the children's CPU time is summed
from their resource usage. Run it alone: a build beside it halves its CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _reader(stream, sink: list, start: float, echo: bool) -> None:
    for raw in iter(stream.readline, ""):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        t = time.monotonic() - start
        sink.append((round(t, 1), line))
        if echo:
            print(f"{t:7.1f}s  {line}", file=sys.stderr, flush=True)


# scripts/setup_progress.py's last line for a stage, and the CLI's first
# line of a model install (store/install.py).
STAGE_DONE = re.compile(r"^\[setup (\d+)/(\d+)\] (.+): (done|failed) in (\S+)$")
MODEL_START = re.compile(r"^installing (\S+) from PyPI ")


def stages(lines: list) -> list[dict]:
    """Each set-up stage's label and wall seconds, from the stamped stderr
    lines: a stage ends at its `done` line and starts where the one before
    ended. The model install, when the first command does one, runs from
    its first line to the next line after the set-up."""
    out, last = [], 0.0
    for t, line in lines:
        if m := STAGE_DONE.match(line):
            out.append({"stage": f"{m[1]}/{m[2]}", "label": m[3], "status": m[4],
                        "wall_s": round(t - last, 1)})
            last = t
        elif m := MODEL_START.match(line):
            out.append({"stage": "model", "label": f"installing {m[1]}", "started_s": t})
    return out


def run_once(rev: str, prompt: str, model: str | None, echo: bool) -> dict:
    """Clone REV, run the first `llmctl run`, return stamped lines and totals.

    Raises subprocess.CalledProcessError when the clone fails.
    """
    root = Path(tempfile.mkdtemp(prefix="llmctl-first-run-"))
    try:
        clone = root / "llmctl"
        home = root / "home"
        home.mkdir()
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("LLMCTL_", "HF_", "XDG_", "VIRTUAL_ENV"))}
        env.update(HOME=str(home), NO_COLOR="1", LLMCTL_CONFIG=os.devnull)
        argv = [str(clone / "scripts" / "llmctl"), "run"]
        argv += [model, prompt] if model else [prompt]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=clone, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        lines: list = []
        out: list = []
        threads = [threading.Thread(target=_reader, args=(proc.stderr, lines, start, echo)),
                   threading.Thread(target=_reader, args=(proc.stdout, out, start, False))]
        for t in threads:
            t.start()
        rc = proc.wait()
        for t in threads:
            t.join()
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return {"rev": rev, "rc": rc, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                "cores": os.cpu_count(), "stages": stages(lines), "stderr": lines,
                "answer": " ".join(text for _, text in out)[:300]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD", help="commit to clone (default HEAD)")
    ap.add_argument("--prompt", default="What is the capital of France?")
    ap.add_argument("--model", default=None, help="model name (default: none, "
                    "so the default model answers)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    result = run_once(args.rev, args.prompt, args.model, echo=not args.json)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"rev {args.rev}: rc {result['rc']}, {result['wall_s']:.0f} s wall, "
              f"{result['cpu_s']:.0f} s CPU on {result['cores']} cores")
        for st in result["stages"]:
            took = f"{st['wall_s']:7.1f} s" if "wall_s" in st else f"from {st['started_s']:.0f} s"
            print(f"  {st['stage']:>5}  {took}  {st['label']}")
        print(f"answer: {result['answer']}")
    return 0 if result["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
