"""A bound on the work llama.cpp's grammar sampler does for one request.

llama.cpp keeps one parse stack per live alternative of the grammar, and a
grammar whose alternatives share their prefixes (an `anyOf` of eight arrays
of itself) multiplies them at every token: eight times as many stacks after
each "[", and accepting a token compares every new stack against the others,
so its cost grows by more each token, from well under a millisecond to
minutes within a few tokens (docs/measurements.md has the figures). That work runs
on the engine's one thread, inside a C call nothing can interrupt, so a
request that reaches it would hold every other request on the model forever.

So each request's grammar work is timed (CPU time of the engine thread, which
a loaded machine does not inflate) and the request fails with a 400 when:
  - one token's grammar work passed the per-token budget;
  - the cost of accepting tokens grows so fast that the next accept is
    predicted to pass it: the call that would explode is never made;
  - filtering every candidate (after the sampled token was rejected) would
    pass it, extrapolated from the share already filtered;
  - the request's grammar work in all passed the total budget.

A normal grammar costs microseconds a token, so neither budget is near."""

from __future__ import annotations

import time
from dataclasses import dataclass

from llmctl.errors import InvalidParams
from llmctl.settings import Settings

# Accept costs under this are noise, not a growth to extrapolate from.
_FLOOR_S = 1e-3


@dataclass(frozen=True)
class GrammarBudget:
    """Milliseconds of grammar work allowed per token and per request."""

    token_ms: float = 2000.0
    total_ms: float = 30000.0

    @classmethod
    def of(cls, settings: Settings) -> "GrammarBudget":
        """The budget the settings give (grammar_budget_ms, grammar_total_ms)."""
        return cls(settings.grammar_budget_ms, settings.grammar_total_ms)


def _too_ambiguous(detail: str) -> InvalidParams:
    return InvalidParams(f"the response grammar is too ambiguous: {detail}; simplify the schema",
                         param="response_format")


class GrammarClock:
    """One request's grammar time. `charge` and `accepted` raise
    InvalidParams (param "response_format") when the request must stop."""

    def __init__(self, budget: GrammarBudget):
        self.token_s = budget.token_ms / 1000
        self.total_s = budget.total_ms / 1000
        self.spent_s = 0.0          # the whole request's grammar time
        self.this_token_s = 0.0
        self._last_accept_s = 0.0

    @staticmethod
    def now() -> float:
        return time.thread_time()

    def start_token(self) -> None:
        self.this_token_s = 0.0

    def charge(self, seconds: float) -> None:
        """Count `seconds` of grammar work against this token and the request."""
        self.this_token_s += seconds
        self.spent_s += seconds
        if self.this_token_s > self.token_s:
            raise _too_ambiguous(f"one token took {self.this_token_s * 1000:.0f} ms to "
                                 f"constrain (limit {self.token_s * 1000:.0f} ms)")
        if self.spent_s > self.total_s:
            raise _too_ambiguous(f"constraining this response took {self.spent_s * 1000:.0f} ms "
                                 f"(limit {self.total_s * 1000:.0f} ms a request)")

    def accepted(self, seconds: float) -> None:
        """Count an accept that took `seconds`, and stop the request when the
        next one is predicted to pass the per-token budget. The cost is
        quadratic in the stacks, and their count grows too, so the next
        growth is taken as this one's square."""
        self.charge(seconds)
        growth = seconds / max(self._last_accept_s, _FLOOR_S)
        self._last_accept_s = seconds
        if growth > 1 and seconds * growth * growth > self.token_s:
            raise _too_ambiguous(
                f"accepting one token took {seconds * 1000:.0f} ms, {growth:.0f}x the one "
                f"before, so the next would pass the limit of {self.token_s * 1000:.0f} ms")

    def check_share(self, filter_s: float, done: int, total: int) -> None:
        """Filtering `total` candidates took `filter_s` for the first `done`:
        stop before the rest when they would pass the per-token budget."""
        if done and done < total:
            projected = self.this_token_s + filter_s * (total - done) / done
            if projected > self.token_s:
                raise _too_ambiguous(
                    f"filtering the vocabulary would take about {projected * 1000:.0f} ms for "
                    f"one token (limit {self.token_s * 1000:.0f} ms)")
