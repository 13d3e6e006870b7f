#!/usr/bin/env python3
"""One progress line for one stage of scripts/_setup.sh, instead of pip's chatter.

    setup_progress.py --stage 2/4 --label "building llama.cpp" --log LOG -- pip wheel -v ...

It runs the command, appends everything the command prints to LOG, and
draws `[setup 2/4] building llama.cpp: 41% · 2m10s elapsed · about 3m left`
on stderr: updated in place on a terminal, a few plain lines otherwise (the
start, each quarter of a stage that reports a percentage, and the end).
What is left comes from the command's own measures: ninja's `[N/M]` or
make's `[ NN%]` build steps, pip's `Progress X of Y` download bytes with
`Collecting` lines counted against --units packages. On failure it shows
the stage's last lines and where the full log is, and exits with the
command's status. Standard library only: it runs before the venv has
anything in it.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import IO, Iterable

NINJA = re.compile(r"^\s*\[(\d+)/(\d+)\]\s")
MAKE = re.compile(r"^\s*\[\s*(\d{1,3})%\]\s")
PIP_BYTES = re.compile(r"^\s*Progress (\d+) of (\d+)\s*$")
PIP_COLLECT = re.compile(r"^\s*(Collecting|Processing) ")
PIP_INSTALL = re.compile(r"^\s*Installing collected packages: (.*)$")
FAIL_LINES = 40


class Measure:
    """What a stage's output says of its progress: a fraction when known,
    else a count of packages collected."""

    def __init__(self, units: int = 0):
        self.units = units          # packages the stage installs; 0 = unknown
        self.collected = 0
        self.file_fraction = 0.0
        self.steps: float | None = None   # fraction from a build tool's steps
        self.installing = False

    def feed(self, line: str) -> None:
        """Update from one line of output. Raises nothing."""
        if m := NINJA.match(line):
            done, total = int(m[1]), int(m[2])
            self.steps = done / total if total else None
        elif m := MAKE.match(line):
            self.steps = int(m[1]) / 100
        elif m := PIP_BYTES.match(line):
            done, total = int(m[1]), int(m[2])
            self.file_fraction = done / total if total else 0.0
        elif PIP_COLLECT.match(line):
            self.collected += 1
            self.file_fraction = 0.0
        elif PIP_INSTALL.match(line):
            self.installing = True

    def fraction(self) -> float | None:
        """Done so far, 0..1, or None when the output gives no measure."""
        if self.steps is not None:
            return min(self.steps, 1.0)
        if self.units and self.collected:
            if self.installing:
                return 1.0
            return min((self.collected - 1 + self.file_fraction) / self.units, 1.0)
        return None

    def describe(self) -> str:
        """The measure as words: `41%`, `12 packages`, or ``."""
        frac = self.fraction()
        if frac is not None:
            return f"{frac * 100:.0f}%"
        if self.installing:
            return "installing"
        return f"{self.collected} package{'s' * (self.collected != 1)}" if self.collected else ""


def clock(seconds: float) -> str:
    """`2m10s`, `45s`, `1h02m`: short, for a progress line."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def left(frac: float | None, elapsed: float) -> str:
    """`about 3m left`, from the pace so far; `` until there is a pace."""
    if frac is None or frac < 0.03 or frac >= 1 or elapsed < 5:
        return ""
    rest = elapsed * (1 - frac) / frac
    # A pace is a guess: whole minutes, or five seconds under a minute.
    return f"about {f'{round(rest / 60)}m' if rest >= 90 else f'{max(5, round(rest / 5) * 5)}s'} left"


def status_line(head: str, measure: Measure, elapsed: float) -> str:
    """`[setup 2/4] building llama.cpp: 41% · 2m10s elapsed · about 3m left`."""
    parts = [p for p in (measure.describe(), f"{clock(elapsed)} elapsed",
                         left(measure.fraction(), elapsed)) if p]
    return f"{head}: {' · '.join(parts)}"


class Display:
    """Where the line goes: redrawn in place on a terminal, or plain lines."""

    def __init__(self, head: str, stream: IO[str], live: bool, quiet: bool):
        self.head, self.stream, self.live, self.quiet = head, stream, live, quiet
        self.quarter = 0

    def start(self) -> None:
        if not self.quiet and not self.live:
            self._write(f"{self.head}…\n")

    def update(self, measure: Measure, elapsed: float) -> None:
        if self.quiet:
            return
        if self.live:
            width = shutil.get_terminal_size((80, 24)).columns - 1
            self._write("\r\x1b[K" + status_line(self.head, measure, elapsed)[:width])
            return
        frac = measure.fraction()
        # Plain output (a log, CI): one line per quarter of a measured stage.
        if frac is not None and elapsed > 20 and int(frac * 4) > self.quarter and frac < 1:
            self.quarter = int(frac * 4)
            self._write(status_line(self.head, measure, elapsed) + "\n")

    def finish(self, ok: bool, elapsed: float) -> None:
        if self.quiet and ok:
            return
        word = "done" if ok else "failed"
        self._write(f"{chr(13) + chr(27) + '[K' if self.live else ''}"
                    f"{self.head}: {word} in {clock(elapsed)}\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def pump(lines: Iterable[str], log: IO[str], measure: Measure, tail: collections.deque,
         lock: threading.Lock) -> None:
    """Copy the command's output to the log, feeding the measure."""
    for line in lines:
        log.write(line)
        with lock:
            measure.feed(line)
            tail.append(line)
    log.flush()


def run_stage(argv: list[str], log_path: str, display: Display, units: int = 0) -> int:
    """Run `argv` under one progress line; return its exit status (127 when
    it cannot start). Raises nothing."""
    measure, tail, lock = Measure(units), collections.deque(maxlen=FAIL_LINES), threading.Lock()
    start = time.monotonic()
    display.start()
    with open(log_path, "a", encoding="utf-8", errors="replace") as log:
        log.write(f"\n=== {display.head}: {' '.join(argv)}\n")
        log.flush()
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace")
        except OSError as e:
            log.write(f"cannot run {argv[0]}: {e}\n")
            tail.append(f"cannot run {argv[0]}: {e}\n")
            rc = 127
        else:
            reader = threading.Thread(target=pump, args=(proc.stdout, log, measure, tail, lock),
                                      daemon=True)
            reader.start()
            while reader.is_alive():
                reader.join(0.5)
                with lock:
                    display.update(measure, time.monotonic() - start)
            rc = proc.wait()
    display.finish(rc == 0, time.monotonic() - start)
    if rc != 0:
        sys.stderr.write("".join(tail))
        sys.stderr.write(f"[setup] failed: {' '.join(argv)}\n[setup] full log: {log_path}\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", required=True, help="N/M, this stage's place")
    ap.add_argument("--label", required=True)
    ap.add_argument("--log", required=True, help="file the command's output is appended to")
    ap.add_argument("--units", type=int, default=0, help="packages the command installs")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given")
    live = (sys.stderr.isatty() and "NO_COLOR" not in os.environ
            and os.environ.get("TERM") != "dumb")
    display = Display(f"[setup {args.stage}] {args.label}", sys.stderr, live,
                      quiet=bool(os.environ.get("LLMCTL_SETUP_QUIET")))
    return run_stage(command, args.log, display, args.units)


if __name__ == "__main__":
    sys.exit(main())
