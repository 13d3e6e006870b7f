"""Adaptive speculation (`--spec auto`): guess only where guessing pays, on
this machine, for this model, for this sequence.

A checked guess costs a row of the step's decode; a kept guess saves a
whole step. What a row costs is measured, not assumed: `StepCosts` keeps
the time of decode-only steps by their number of rows. What a guess is
worth is measured per sequence: each keeps, per kind of evidence (the
length of the n-gram match behind the guess), how many guesses it kept and
how many checks failed, with its checks of every kind, and the engine's
of that kind, as the prior. A run of kept guesses is modelled as geometric: each next guess
holds with probability `alpha`, so k guesses keep alpha + ... + alpha^k on
average.

`Controller.trim` then cuts each sequence's guesses to the count that
maximises the step's expected tokens per second, sequence by sequence,
best evidence first. A full batch makes rows dear (the step already has
many tokens to show for its time), so speculation yields to it by the
same measure rather than by a fixed count of sequences. A sequence whose
guesses do not pay stops guessing, and probes with a short guess now and
then, so a task that turns repetitive (an answer that starts quoting its
document) is noticed. Probes are paced by what they cost: together they
spend at most PROBE_BUDGET of the steps' time, so a lone sequence, whose
probe row costs most of a step, probes less often than one of a full
batch, whose probe is a small share of it, and neither loses more than
that share to them.

What guessing saved is measured too, and overrules the prediction: each
speculating step is settled against plain steps of its batch, and where
those savings fall short (a batch band's steps, or one sequence's own
checks), guessing stops but for the paced probes. Beside other sequences
a guess pays for a whole extra graph run, which the prediction prices
(StepCosts.runs_cost) and the settled returns measure."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from llmctl.runtime.speculation.spec_config import next_cap
from llmctl.runtime.speculation.step_costs import MAX_ROWS, StepCosts

# How many checks the engine's counts weigh in a sequence's estimate.
PRIOR_WEIGHT = 8.0
# Declined proposals are checked anyway (PROBE_GUESSES guesses) once their
# probes would spend at most this share of the steps' time, and never more
# often than every PROBE_MIN declines. A sequence learns from its declined
# guesses for free (Shadow), so paid probes are there to settle a batch
# band's returns: 1% is what they may cost a full batch.
PROBE_BUDGET = 0.01
PROBE_MIN = 16
PROBE_GUESSES = 2
# A gain under this share of the step's rate is noise, not a reason to guess.
MIN_GAIN = 0.05
# Settled returns: a batch band goes on guessing while its speculating steps
# saved at least MIN_RETURN of their time against plain steps, and a
# sequence while its own checks saved anything; both over a window that
# forgets a step's weight by RETURN_DECAY at each newer one, once it holds
# RETURN_STEPS steps' weight.
MIN_RETURN = 0.02
RETURN_DECAY = 0.9
RETURN_STEPS = 3.0
BUCKETS = 9          # match lengths 1, 2-3, 4-7, ... 128-255, 256 (ngram.MATCH_MAX)
# The kind from which a match's length alone earns a longer check (16+ tokens).
VERBATIM_KIND = 4
# Behind a verbatim match of L tokens a guess holds at least with L/(L + this):
# a copy that held that long rarely breaks at the next token.
VERBATIM_SLACK = 2.0
# The engine's counts of a kind are halved past this many checks, so that
# its prior follows the server's recent work rather than all of it.
ENGINE_HORIZON = 2000.0


def bucket(match_len: int) -> int:
    """The evidence kind of a guess backed by an n-gram match of
    `match_len` tokens (0: a draft model's, or no match length)."""
    return min(BUCKETS - 1, max(0, match_len.bit_length() - 1))


def verbatim_cap(kind: int) -> int:
    """The guesses a match of this kind earns by its length alone: half its
    shortest length from VERBATIM_KIND up (a match of 16+ tokens is text
    being copied, an edit's or a quoted document's), none below."""
    return 1 << (kind - 1) if kind >= VERBATIM_KIND else 0


def expected_kept(alpha: float, k: int) -> float:
    """Guesses kept on average out of `k`, each holding with `alpha` once
    the ones before it held."""
    if alpha >= 1.0:
        return float(k)
    return alpha * (1.0 - alpha ** k) / (1.0 - alpha)


@dataclass
class Evidence:
    """Kept guesses and failed checks, per evidence kind."""

    kept: list[float] = field(default_factory=lambda: [0.0] * BUCKETS)
    failed: list[float] = field(default_factory=lambda: [0.0] * BUCKETS)

    def add(self, kind: int, drafted: int, kept: int, horizon: float = 0.0) -> None:
        """Count a check of `drafted` guesses of which `kept` held; past
        `horizon` kept-plus-failed (0: never) this kind's counts halve."""
        self.kept[kind] += kept
        self.failed[kind] += kept < drafted
        if horizon and self.kept[kind] + self.failed[kind] > horizon:
            self.kept[kind] /= 2
            self.failed[kind] /= 2


@dataclass
class Returns:
    """What speculating steps saved, as settled: decayed sums of the
    seconds saved against plain steps of the same batch, the seconds the
    steps took, the seconds their guesses added, the guesses checked, and
    the steps' weight. Raises nothing."""

    saved: float = 0.0
    seconds: float = 0.0
    extra: float = 0.0
    guesses: float = 0.0
    steps: float = 0.0

    def add(self, saved: float, seconds: float, extra: float, guesses: int) -> None:
        d = RETURN_DECAY
        self.saved = self.saved * d + saved
        self.seconds = self.seconds * d + seconds
        self.extra = self.extra * d + extra
        self.guesses = self.guesses * d + guesses
        self.steps = self.steps * d + 1.0

    def short(self, min_return: float) -> bool:
        """Whether enough steps are settled and they saved less than
        `min_return` of their time."""
        return self.steps >= RETURN_STEPS and self.saved < min_return * self.seconds

    def extra_per_guess(self) -> float | None:
        """Seconds a checked guess added to its step, as settled (None
        before any)."""
        return self.extra / self.guesses if self.guesses > 0 else None


@dataclass
class Check:
    """One sequence's checked guesses in a step: its record, how many it
    checked and how many held."""

    record: "SeqSpec"
    drafted: int
    kept: int


@dataclass
class Shadow:
    """A declined proposal kept to be checked for free against the tokens
    the sequence goes on to generate: its guesses, their evidence kind,
    where in the history they would have gone, and the step's unguessed
    rows."""

    guesses: list[int]
    kind: int
    at: int
    base_rows: int

    def held(self, history: array) -> int | None:
        """How many of the guesses the history confirms, once it tells
        (a mismatch, or all of them there); None while it cannot yet."""
        n = 0
        for g in self.guesses:
            if self.at + n >= len(history):
                return None
            if history[self.at + n] != g:
                return n
            n += 1
        return n


@dataclass
class SeqSpec:
    """One sequence's speculation record, and its tokens as a growing
    array for the proposer to search."""

    evidence: Evidence = field(default_factory=Evidence)
    returns: Returns = field(default_factory=Returns)
    declined: int = 0           # proposals declined since its last check
    # Most guesses its next check may have: a sequence earns long drafts
    # with its own kept guesses (twice its last run, and 2 more), so one
    # whose guesses the engine's prior overrates loses a short check, not
    # a full draft, before its own evidence weighs in.
    cap: int = PROBE_GUESSES
    history: array = field(default_factory=lambda: array("i"))
    shadow: Shadow | None = None    # a declined proposal, checked against what came

    def sync(self, prompt: list[int], output: list[int]) -> array:
        """The history, extended by the tokens it lacks (prompt and output
        only ever grow)."""
        h, n = self.history, len(prompt)
        if len(h) < n:
            h.extend(prompt[len(h):])
        if len(h) < n + len(output):
            h.extend(output[len(h) - n:])
        return h


@dataclass
class Candidate:
    """A sequence's proposal for this step: its record, its guesses and
    the length of the n-gram match behind them (0: a draft model's)."""

    record: SeqSpec
    guesses: list[int]
    match: int = 0

    @property
    def kind(self) -> int:
        """The guesses' evidence kind: their match length's bucket."""
        return bucket(self.match)


class Controller:
    """Decides how many of each sequence's guesses a step checks, from the
    measured step costs and each sequence's measured evidence. Raises
    nothing."""

    def __init__(self) -> None:
        self.costs = StepCosts()
        self.engine = Evidence()
        # Settled returns per batch band: steps of 1, 2-3, 4-7, ... plain rows.
        self.bands = [Returns() for _ in range(BUCKETS)]

    def band(self, base_rows: int) -> Returns:
        """The settled returns of steps with `base_rows` unguessed rows."""
        return self.bands[bucket(base_rows)]

    def stopped(self, record: SeqSpec, base_rows: int) -> bool:
        """Whether settled returns stop this sequence guessing in a step of
        `base_rows` unguessed rows (it still probes): its band's steps saved
        less than MIN_RETURN of their time, or its own checks lost."""
        return self.band(base_rows).short(MIN_RETURN) or record.returns.short(0.0)

    def alpha(self, record: SeqSpec, kind: int) -> float:
        """How likely a guess of this kind holds for this sequence: its own
        checks of this kind, over a prior that is the sequence's checks of
        every kind over the engine's of this kind. A sequence that copies
        (an edit) keeps short matches' guesses too, where free text's short
        matches are chance; the engine alone cannot tell the two apart."""
        g_kept, g_failed = self.engine.kept[kind], self.engine.failed[kind]
        prior = (g_kept + 1.0) / (g_kept + g_failed + 2.0)
        ev = record.evidence
        all_kept, all_failed = sum(ev.kept), sum(ev.failed)
        prior = (all_kept + PRIOR_WEIGHT * prior) / (all_kept + all_failed + PRIOR_WEIGHT)
        kept, failed = ev.kept[kind], ev.failed[kind]
        return (kept + PRIOR_WEIGHT * prior) / (kept + failed + PRIOR_WEIGHT)

    def candidate_alpha(self, c: Candidate) -> float:
        """How likely each of the candidate's guesses holds once the ones
        before it held: its sequence's measured rate for its kind, or for a
        verbatim match, at least what the match's own length says."""
        alpha = self.alpha(c.record, c.kind)
        if c.kind >= VERBATIM_KIND:
            alpha = max(alpha, c.match / (c.match + VERBATIM_SLACK))
        return alpha

    def trim(self, n_rows: int, candidates: list[Candidate],
             one_row_each: bool = False) -> list[int]:
        """How many guesses to check for each candidate, in a step that has
        `n_rows` rows (one expected token each) without guesses; with
        `one_row_each`, those are as many sequences, one row each, and the
        step is priced by its graph runs (StepCosts.runs_cost)."""
        out = [0] * len(candidates)
        order = sorted(range(len(candidates)),
                       key=lambda i: -self.candidate_alpha(candidates[i]))
        rows, tokens = n_rows, float(n_rows)
        taken: list[int] = []
        for i in order:
            c = candidates[i]
            self._resolve_shadow(c.record)
            c.guesses = c.guesses[:max(c.record.cap, verbatim_cap(c.kind))]
            price = self._pricer(n_rows, rows, taken, one_row_each)
            k, gain = self._best(price, rows, tokens, c, n_rows)
            if k == 0:
                c.record.declined += 1
                if c.record.declined < self.probe_interval(rows, n_rows, price):
                    if c.record.shadow is None and len(c.guesses) >= PROBE_GUESSES:
                        c.record.shadow = Shadow(c.guesses[:PROBE_GUESSES], c.kind,
                                                 len(c.record.history), n_rows)
                    continue
                k = min(PROBE_GUESSES, len(c.guesses))
                gain = expected_kept(self.candidate_alpha(c), k)
            c.record.declined = 0
            out[i] = k
            rows += k
            tokens += gain
            taken.append(k)
        return out

    def _pricer(self, n_rows: int, rows: int, taken: list[int], levels: bool):
        """The step's cost by one more candidate's guess count."""
        if levels:
            return lambda k: self.costs.runs_cost(n_rows, taken + [k])
        return lambda k: self.costs.cost(rows + k, n_rows)

    def _resolve_shadow(self, record: SeqSpec) -> None:
        """Learn from the sequence's shadow once its tokens tell how much of
        it held: as a probe's check would have taught (its evidence and next
        cap), and what the check would have saved at the measured cost of
        its rows. So a sequence whose guesses had stopped paying resumes as
        soon as it starts copying again, without paying for probes to find
        out. Only a lone sequence's band learns from it: beside other
        sequences a check costs more than its rows (another graph run), which
        only a real check's settled time shows."""
        sh = record.shadow
        if sh is None:
            return
        kept = sh.held(record.history)
        if kept is None:
            return
        record.shadow = None
        k = len(sh.guesses)
        plain = self.costs.cost(sh.base_rows)
        checked = self.costs.runs_cost(sh.base_rows, [k])
        self.record(record, sh.kind, k, kept)
        if plain is None or checked is None:
            return
        band = self.band(sh.base_rows)
        extra = max(checked - plain, k * (band.extra_per_guess() or 0.0))
        saved = kept * plain / sh.base_rows - extra
        record.returns.add(saved, plain + extra, extra, k)
        if sh.base_rows == 1:
            band.add(saved, plain + extra, extra, k)

    def probe_interval(self, rows: int, base_rows: int, price=None) -> float:
        """Declined proposals a sequence lets pass before it probes, in a
        step of `rows` rows of which `base_rows` are unguessed (`price`: the
        step's cost by the sequence's guess count, trim's pricer; by rows if
        none): enough that its probe's extra cost is at most PROBE_BUDGET
        of its share of the steps in between (at least PROBE_MIN; never,
        before any step). While no step has had more rows than this, the
        first proposal probes at once: its step measures what a guess
        costs."""
        if price is None:
            price = self._pricer(base_rows, rows, [], False)
        base = price(0)
        if base is None:
            return float("inf")
        probe = price(PROBE_GUESSES)
        if probe is None:
            return 1.0
        share = base / max(1, base_rows)
        # What a guess added to its steps, as settled, where the rows alone
        # say less (an extra graph run beside other sequences).
        settled = self.band(base_rows).extra_per_guess() or 0.0
        extra = max(probe - base, PROBE_GUESSES * settled)
        return max(float(PROBE_MIN), extra / (PROBE_BUDGET * share))

    def _best(self, price, rows: int, tokens: float, c: Candidate,
              base_rows: int) -> tuple[int, float]:
        """The guess count with the best expected step rate (`price`: the
        step's cost by the count), and its expected kept guesses; (0, 0)
        when no count beats not guessing."""
        base = price(0)
        if base is None or self.stopped(c.record, base_rows):
            return 0, 0.0
        alpha = self.candidate_alpha(c)
        best_k, best_gain, best_rate = 0, 0.0, tokens / base * (1.0 + MIN_GAIN)
        for k in range(1, min(len(c.guesses), MAX_ROWS - rows) + 1):
            cost = price(k)
            gain = expected_kept(alpha, k)
            if cost and (tokens + gain) / cost > best_rate:
                best_k, best_gain, best_rate = k, gain, (tokens + gain) / cost
        return best_k, best_gain

    def record(self, record: SeqSpec, kind: int, drafted: int, kept: int) -> None:
        """Count a checked proposal for the sequence and the engine, and
        set the sequence's next cap from the run it kept."""
        record.cap = next_cap(kept, PROBE_GUESSES)
        record.evidence.add(kind, drafted, kept)
        self.engine.add(kind, drafted, kept, ENGINE_HORIZON)

    def settle(self, base_rows: int, seconds: float, checks: list[Check]) -> float:
        """Settle a decode-only step of `base_rows` unguessed rows that
        checked `checks` and took `seconds`: what it saved against plain
        steps of that batch as measured (its kept guesses at their cost in
        plain steps, less what its guesses added), for its band and, split
        by the guesses each checked, for each sequence. Returns the seconds
        saved (negative if it cost; 0 while no plain step of that batch is
        measured)."""
        plain = self.costs.cost(base_rows)
        drafted = sum(c.drafted for c in checks)
        if plain is None or base_rows <= 0 or drafted == 0:
            return 0.0
        per_token, extra = plain / base_rows, seconds - plain
        total = 0.0
        for c in checks:
            share = c.drafted / drafted
            saved = c.kept * per_token - share * extra
            c.record.returns.add(saved, share * seconds, share * extra, c.drafted)
            total += saved
        self.band(base_rows).add(total, seconds, extra, drafted)
        return total
