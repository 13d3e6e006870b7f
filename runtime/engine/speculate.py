"""The engine's side of speculation: fill in a step's guesses from the
proposer, cut them to what pays under `--spec auto` (speculation/adaptive.py),
and learn from the step's result: what each check kept, what the step
cost, and what the guesses saved.

The scheduler gives each decoding sequence `room` for guesses; this module
asks the proposer for them and, in auto mode, lets the controller decide
how many are worth a row of this step's decode. A plan is never changed
in place: filling it in makes a new one."""

from __future__ import annotations

from llmctl.runtime.engine.plan import StepPlan, StepResult, Work
from llmctl.runtime.engine.stats import StatsCollector
from llmctl.runtime.speculation.adaptive import Candidate, Check, Controller, SeqSpec
from llmctl.runtime.speculation.proposer import Guess, Proposer, Want


def propose_into(work: list[Work], proposer: Proposer,
                 records: Records) -> tuple[list[Work], list[Guess | None]]:
    """Ask the proposer for the sequences the scheduler gave room to guess:
    the step's work with each one's draft set to its whole guess (no guess
    is a plain step), and each work's guess (None where none). Raises what
    the proposer's `worth` raises (its `propose` never raises)."""
    asks: list[int] = []
    wants: list[Want] = []
    for i, w in enumerate(work):
        if w.room:
            tokens = records.of(w).sync(w.seq.prompt, w.seq.output)
            if proposer.worth(w.seq.slot, tokens, w.seq.max_new - len(w.seq.output)):
                asks.append(i)
                wants.append((w.seq.slot, tokens, w.room))
    guesses: list[Guess | None] = [None] * len(work)
    if not asks:
        return list(work), guesses
    filled = list(work)
    for i, guess in zip(asks, proposer.propose(wants), strict=False):
        if guess.tokens:
            filled[i] = work[i].with_draft(guess.tokens[:work[i].room])
            guesses[i] = guess
    return filled, guesses


class Speculation:
    """Speculation for one engine: its proposer, and in auto mode the
    controller that measures step costs and each sequence's evidence.
    Raises nothing of its own."""

    def __init__(self, proposer: Proposer, adaptive: bool, stats: StatsCollector):
        self.proposer = proposer
        self.controller = Controller() if adaptive else None
        self.records = Records()
        self._stats = stats
        # seq id -> evidence kind of its draft this step (auto mode's record)
        self._kinds: dict[int, int] = {}
        self._checks: list[Check] = []          # this step's checked guesses

    def fill(self, plan: StepPlan) -> StepPlan:
        """The plan with this step's drafts: the proposer's guesses, cut by
        the controller in auto mode."""
        self._kinds.clear()
        self._checks.clear()
        work, guesses = propose_into(list(plan.work), self.proposer, self.records)
        guessed = [(i, g) for i, g in enumerate(guesses) if g is not None]
        if self.controller is None or not guessed:
            return plan.with_work(work)
        candidates = [Candidate(self.records.of(work[i]), work[i].draft, g.match)
                      for i, g in guessed]
        rows = sum(len(w.tokens) - len(w.draft) for w in work)
        one_row_each = all(w.decode and len(w.tokens) - len(w.draft) == 1 for w in work)
        keep = self.controller.trim(rows, candidates, one_row_each)
        declined = 0
        for (i, _), c, k in zip(guessed, candidates, keep, strict=False):
            work[i] = work[i].with_draft(work[i].draft[:k])
            if k:
                self._kinds[work[i].seq.id] = c.kind
            else:
                declined += 1
        if declined:
            self._stats.record_spec_declined(declined)
        return plan.with_work(work)

    def learn(self, plan: StepPlan, result: StepResult, seconds: float) -> None:
        """Count each checked draft and what held of it, then learn from
        the step's time."""
        for w in plan.work:
            r = result.seqs.get(w.seq.id)
            if w.draft and r is not None and r.drafted and r.error is None:
                self.checked(w, r.kept)
        self.timed(list(plan.work), seconds)

    def checked(self, w: Work, kept: int) -> None:
        """Count a checked draft of which `kept` guesses held."""
        self._stats.record_spec(len(w.draft), kept)
        if self.controller is not None:
            record = self.records.of(w)
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
        # Unequal rows are several graph runs (StepCosts.runs_cost): their
        # time is no measure of one run of that many rows.
        if len({len(w.tokens) for w in plan}) == 1:
            self.controller.costs.record(rows, seconds)

    def forget(self, seq_id: int) -> None:
        """Drop an ended sequence's record."""
        self.records.pop(seq_id, None)

    def close(self) -> None:
        self.proposer.close()


class Records(dict[int, SeqSpec]):
    """Each running sequence's speculation record, by sequence id."""

    def of(self, w: Work) -> SeqSpec:
        record = self.get(w.seq.id)
        if record is None:
            record = self[w.seq.id] = SeqSpec()
        return record
