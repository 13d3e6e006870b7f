"""The engine's side of speculation: fill in a step's guesses from the
proposer, cut them to what pays under `--spec auto` (speculation/adaptive.py),
time the step, and count what each check kept and saved.

The scheduler gives each decoding sequence `room` for guesses; this module
asks the proposer for them and, in auto mode, lets the controller decide
how many are worth a row of this step's decode."""

from __future__ import annotations

from llmctl.runtime.engine.scheduler import Work
from llmctl.runtime.engine.stats import StatsCollector
from llmctl.runtime.speculation.adaptive import Candidate, Check, Controller, SeqSpec, bucket
from llmctl.runtime.speculation.proposer import Guess, Proposer, Want


def propose_into(plan: list[Work], proposer: Proposer) -> list[tuple[Work, Guess]]:
    """Ask the proposer for the sequences the scheduler gave room to guess,
    and set each one's draft to its whole guess; no guess is a plain step.
    Returns the works that got guesses, with them. Raises what the
    proposer's `worth` raises (its `propose` never raises)."""
    asks: list[Work] = []
    wants: list[Want] = []
    for w in plan:
        if w.room:
            tokens = _record(w).sync(w.seq.prompt, w.seq.output)
            if proposer.worth(w.seq.slot, tokens, w.seq.max_new - len(w.seq.output)):
                asks.append(w)
                wants.append((w.seq.slot, tokens, w.room))
    if not asks:
        return []
    guessed = []
    for w, guess in zip(asks, proposer.propose(wants), strict=False):
        if guess.tokens:
            _set_draft(w, guess.tokens[:w.room])
            guessed.append((w, guess))
    return guessed


def _set_draft(w: Work, draft: list[int]) -> None:
    w.draft = draft
    w.tokens = [w.tokens[0], *draft]


class Speculation:
    """Speculation for one engine: its proposer, and in auto mode the
    controller that measures step costs and each sequence's evidence.
    Raises nothing of its own."""

    def __init__(self, proposer: Proposer, adaptive: bool, stats: StatsCollector):
        self.proposer = proposer
        self.controller = Controller() if adaptive else None
        self._stats = stats
        # seq id -> evidence kind of its draft this step (auto mode's record)
        self._kinds: dict[int, int] = {}
        self._checks: list[Check] = []          # this step's checked guesses

    def fill(self, plan: list[Work]) -> None:
        """Set this step's drafts: the proposer's guesses, cut by the
        controller in auto mode."""
        self._kinds.clear()
        self._checks.clear()
        guessed = propose_into(plan, self.proposer)
        if self.controller is None or not guessed:
            return
        candidates = [Candidate(_record(w), w.draft, bucket(g.match)) for w, g in guessed]
        rows = sum(len(w.tokens) - len(w.draft) for w in plan)
        keep = self.controller.trim(rows, candidates)
        declined = 0
        for (w, _), c, k in zip(guessed, candidates, keep, strict=False):
            _set_draft(w, w.draft[:k])
            if k:
                self._kinds[w.seq.id] = c.kind
            else:
                declined += 1
        if declined:
            self._stats.record_spec_declined(declined)

    def checked(self, w: Work, kept: int) -> None:
        """Count a checked draft of which `kept` guesses held."""
        self._stats.record_spec(len(w.draft), kept)
        if self.controller is not None:
            record = _record(w)
            self.controller.record(record, self._kinds.get(w.seq.id, 0), len(w.draft), kept)
            self._checks.append(Check(record, len(w.draft), kept))

    def timed(self, plan: list[Work], seconds: float) -> None:
        """Learn from a finished step that took `seconds`: decode-only
        steps teach the controller what a step of their many rows costs,
        and settle what their guesses saved."""
        if self.controller is None or not plan or not all(w.decode for w in plan):
            return
        rows = sum(len(w.tokens) for w in plan)
        if self._checks:
            self._stats.record_spec_saved(self.controller.settle(len(plan), seconds, self._checks))
        self.controller.costs.record(rows, seconds)

    def close(self) -> None:
        self.proposer.close()


def _record(w: Work) -> SeqSpec:
    if w.seq.spec is None:
        w.seq.spec = SeqSpec()
    return w.seq.spec
