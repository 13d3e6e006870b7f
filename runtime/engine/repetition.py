"""The loop guard: notices an output that has fallen into repeating itself.

A small model asked for a long answer (an agent's 32k max_tokens) can
write the same block again and again until the cap, which on a CPU is
many minutes of nothing. The guard ends such an output once its tail is
one block of at most MAX_PERIOD tokens written REPEATS times over, and at
least MIN_SPAN tokens long: exact repetition, token for token, so a list
whose items differ, or a table whose cells do, never trips it. It is off
unless a request or the server turns it on (`serve --loop-guard`, the
`x-llmctl-loop-guard` header; `llmctl launch` sends the header); the
output then ends with the reason "loop" (docs/api.md says how each
protocol shows it)."""

from __future__ import annotations

import numpy as np

MAX_PERIOD = 256        # tokens in the longest block it looks for
REPEATS = 4             # times a block is written in a row before it fires
MIN_SPAN = 256          # tokens the repeating tail covers at least


class LoopDetector:
    """Fed an output's tokens one at a time; says when the tail has become
    a loop. Each token costs one vectorised compare per candidate period:
    `runs[p-1]` is how many tokens in a row have equalled the one p before."""

    def __init__(self, max_period: int = MAX_PERIOD, repeats: int = REPEATS,
                 min_span: int = MIN_SPAN):
        self._tail = np.full(max_period, -1, dtype=np.int64)   # newest first
        self._runs = np.zeros(max_period, dtype=np.int64)
        self._periods = np.arange(1, max_period + 1)
        self._need = np.maximum((repeats - 1) * self._periods, min_span - self._periods)
        self.period = 0         # the block's length once it fired

    def push(self, token: int) -> bool:
        """Add the next token; True when the output now ends in a loop."""
        same = self._tail == token
        self._runs = np.where(same, self._runs + 1, 0)
        self._tail[1:] = self._tail[:-1]
        self._tail[0] = token
        fired = np.flatnonzero(self._runs >= self._need)
        if fired.size:
            self.period = int(fired[0]) + 1
            return True
        return False
