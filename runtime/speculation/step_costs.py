"""Measured seconds of decode-only steps by their number of rows: what
`--spec auto` (adaptive.py) reads a checked guess's cost off. Only steps
that are one graph run teach it (every sequence the same rows); a step
with unequal rows is priced as the runs llama.cpp makes of it."""

from __future__ import annotations

# Rows per step whose cost is tracked: guesses beyond it are not checked.
MAX_ROWS = 128
# Weight of a new step time in its row count's moving average, and how
# many steps make a row count's average trusted over the fitted line.
EWMA = 0.2
TRUSTED = 8


class StepCosts:
    """Measured seconds of decode-only steps by their number of rows.

    Each row count keeps a moving average of its steps. A count measured
    often enough (TRUSTED steps) is taken as measured; any other is read
    off a line fitted through all the measured counts, weighted by how
    often each was measured, so one slow step (this machine is shared)
    cannot make a count look dear for good. With a single count measured
    there is no line: more rows than it are unknown (None), and the
    controller's first check is a short probe that measures them, rather
    than a full draft taken on an optimistic guess of its cost. Raises
    nothing."""

    def __init__(self, max_rows: int = MAX_ROWS):
        self._t = [0.0] * (max_rows + 1)
        self._n = [0] * (max_rows + 1)
        # Fitted lazily, by the fewest rows a fit may use (see cost).
        self._lines: dict[int, tuple[float, float, float, int] | None] = {}

    def record(self, rows: int, seconds: float) -> None:
        if not 0 < rows < len(self._t) or seconds <= 0:
            return
        n = self._n[rows]
        self._t[rows] = seconds if n == 0 else self._t[rows] + EWMA * (seconds - self._t[rows])
        self._n[rows] = n + 1
        self._lines.clear()

    def cost(self, rows: int, base: int = 1) -> float | None:
        """Estimated seconds of a step of `rows` rows, for a step that has
        `base` rows without guesses; None before any step, and past the
        one count measured while there is only one. The line is fitted
        through the counts from `base` up where two or more are measured:
        a row costs more in a full batch, where the CPU is already busy,
        than beside a lone sequence."""
        rows = max(1, min(rows, len(self._t) - 1))
        if self._n[rows] >= TRUSTED:
            return self._t[rows]
        line = self._fit(base)
        if line is None:
            line = self._fit(1)
        if line is None:
            return None
        a, b, floor, reach = line
        if rows > reach:
            return None                 # one count measured: no slope to go by yet
        return max(a + b * rows, floor)

    def runs_cost(self, n_seqs: int, guesses: list[int]) -> float | None:
        """Seconds of a decode step of `n_seqs` one-row sequences, some
        checking `guesses` more rows. With a KV stream per sequence
        llama.cpp runs such a step as one graph per level of rows (each
        run takes the same rows from every sequence that has that many
        left), so beside other sequences one sequence's guesses pay for a
        whole extra run, and guesses of equal length share one. None where
        a run's rows are not measured yet."""
        guessing = [1 + k for k in guesses if k > 0]
        rows = guessing + [1] * max(0, n_seqs - len(guessing))
        total, done = 0.0, 0
        for level in sorted(set(rows)):
            left = sum(1 for r in rows if r >= level)
            cost = self.cost(left * (level - done), n_seqs if done == 0 else 1)
            if cost is None:
                return None
            total += cost
            done = level
        return total

    def _fit(self, lo: int) -> tuple[float, float, float, int] | None:
        """(intercept, slope, the cheapest step, the most rows the line
        speaks for: all of them, or through a single count only that
        count) through the counts from `lo` rows up, fitted once per new
        measurement; None with fewer than two counts there (with `lo` 1:
        none at all)."""
        if lo not in self._lines:
            pts = [(r, t, min(n, TRUSTED * 4))
                   for r, (t, n) in enumerate(zip(self._t, self._n, strict=True)) if n and r >= lo]
            if not pts or (lo > 1 and len(pts) < 2):
                self._lines[lo] = None
                return None
            w = sum(p[2] for p in pts)
            mr = sum(r * n for r, _, n in pts) / w
            mt = sum(t * n for _, t, n in pts) / w
            var = sum(n * (r - mr) ** 2 for r, _, n in pts)
            slope = sum(n * (r - mr) * (t - mt) for r, t, n in pts) / var if var else 0.0
            slope = max(0.0, slope)     # more rows never cost less
            reach = pts[0][0] if len(pts) == 1 else len(self._t)
            self._lines[lo] = (mt - slope * mr, slope, min(t for _, t, _ in pts), reach)
        return self._lines[lo]
