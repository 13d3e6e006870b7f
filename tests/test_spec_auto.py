"""Adaptive speculation (`--spec auto`): the measured step costs, the
controller's choices from them and from each sequence's evidence, the
scheduler's budget under auto, and through the real engine: answers equal
plain decoding's where this machine's kernels are exact, guesses that pay
are checked, and guesses that don't are declined."""

import math

import pytest

from llmctl.errors import UsageError
from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.adaptive import (
    MAX_ROWS,
    MIN_RETURN,
    PROBE_BUDGET,
    PROBE_GUESSES,
    PROBE_MIN,
    VERBATIM_SLACK,
    Candidate,
    Check,
    Controller,
    SeqSpec,
    bucket,
    expected_kept,
    verbatim_cap,
)
from llmctl.runtime.speculation.spec_config import SpecConfig
from llmctl.runtime.speculation.step_costs import TRUSTED, StepCosts
from llmctl.store.resolve import ResolvedModel
from tests.conftest import smollm2_file


def costs(base: float, per_row: float, rows=range(1, 40)) -> StepCosts:
    c = StepCosts()
    for r in rows:
        c.record(r, base + per_row * r)
    return c


def controller(base: float, per_row: float) -> Controller:
    ctl = Controller()
    ctl.costs = costs(base, per_row)
    return ctl


def evidence(kind: int, kept: int, failed: int) -> SeqSpec:
    """A sequence with these checks behind it, whose last kept a long run."""
    rec = SeqSpec()
    rec.evidence.kept[kind], rec.evidence.failed[kind] = kept, failed
    rec.cap = MAX_ROWS
    return rec


# ---- step costs ---------------------------------------------------------------------

def test_step_costs_fit_a_line_through_what_was_measured():
    c = StepCosts()
    assert c.cost(4) is None
    c.record(1, 10.0)
    assert c.cost(1) == 10.0 and c.cost(9) is None  # one measurement: no slope yet
    c.record(5, 14.0)
    assert c.cost(3) == pytest.approx(12.0)         # between two measured counts
    assert c.cost(9) == pytest.approx(18.0)         # past them, along their slope
    c.record(0, 1.0)
    c.record(3, -1.0)                               # nonsense is ignored
    assert c.cost(3) == pytest.approx(12.0)


def test_a_row_count_measured_often_is_taken_as_measured():
    c = costs(10.0, 1.0, rows=range(1, 9))
    for _ in range(TRUSTED):
        c.record(4, 30.0)                           # a kernel that is slow at 4 rows
    assert c.cost(4) > 25.0 > c.cost(5)


def test_one_slow_step_does_not_make_a_row_count_dear():
    c = StepCosts()
    for _ in range(3):
        for r in range(1, 9):
            c.record(r, 10.0 + r)
    c.record(7, 100.0)                              # the machine was busy once
    assert c.cost(7) < 25.0 < 17.0 + 0.2 * (100.0 - 17.0)


def test_expected_kept_is_geometric():
    assert expected_kept(0.5, 1) == 0.5
    assert expected_kept(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_kept(1.0, 4) == 4.0
    assert [bucket(n) for n in (0, 2, 3, 4, 8, 17, 64, 200, 1000)] == [0, 1, 1, 2, 3, 4, 6, 7, 8]


def test_a_sequence_history_grows_with_its_tokens():
    rec = SeqSpec()
    prompt, output = [5, 6, 7], []
    assert list(rec.sync(prompt, output)) == [5, 6, 7]
    output += [8, 9]
    assert list(rec.sync(prompt, output)) == [5, 6, 7, 8, 9]
    assert rec.sync(prompt, output) is rec.history


# ---- the controller -----------------------------------------------------------------

def test_guesses_that_hold_are_checked_and_guesses_that_fail_are_not():
    ctl = controller(base=10.0, per_row=2.0)        # a row costs a fifth of a step
    sure, unsure = evidence(4, kept=90, failed=2), evidence(1, kept=1, failed=30)
    keep = ctl.trim(1, [Candidate(sure, list(range(8)), 16), Candidate(unsure, [1, 2, 3], 2)])
    assert keep[0] >= 6 and keep[1] == 0
    assert unsure.declined == 1 and sure.declined == 0


def test_a_sequence_earns_long_drafts_with_its_own_kept_guesses():
    # The engine's checks say matches of 8-15 tokens hold, but a new
    # sequence's first check is short; each check's kept run sets the next
    # one's cap.
    ctl = controller(base=10.0, per_row=1.0)
    for _ in range(50):
        ctl.record(SeqSpec(), 3, 8, 8)
    rec = SeqSpec()
    assert ctl.trim(1, [Candidate(rec, list(range(8)), 8)]) == [PROBE_GUESSES]
    ctl.record(rec, 3, PROBE_GUESSES, PROBE_GUESSES)
    assert ctl.trim(1, [Candidate(rec, list(range(8)), 8)]) == [2 * PROBE_GUESSES + PROBE_GUESSES]
    ctl.record(rec, 3, 6, 0)
    assert ctl.trim(1, [Candidate(rec, list(range(8)), 8)])[0] <= PROBE_GUESSES


def test_a_verbatim_match_earns_its_draft_by_its_length():
    # A match of 16+ tokens is text being copied: its first check may take
    # half the match's shortest length, where the guesses are worth it.
    ctl = controller(base=10.0, per_row=1.0)
    for _ in range(50):
        for kind in (3, 4, 5):
            ctl.record(SeqSpec(), kind, 16, 16)
    assert [verbatim_cap(k) for k in (3, 4, 5)] == [0, 8, 16]
    for kind, first in ((3, PROBE_GUESSES), (4, 8), (5, 16)):
        assert ctl.trim(1, [Candidate(SeqSpec(), list(range(16)), 2 ** kind)]) == [first], kind
    # Still cut by the expected rate: a sequence whose copies fail is not
    # handed the long check.
    failing = SeqSpec()
    for _ in range(20):
        ctl.record(failing, 5, 16, 0)
    assert ctl.trim(1, [Candidate(failing, list(range(16)), 32)])[0] < 16


def test_a_declining_sequence_probes_now_and_then():
    ctl = controller(base=10.0, per_row=10.0)
    rec = evidence(1, kept=0, failed=50)
    # A probe's 2 rows cost 20, a lone sequence's step 20: at 1% of the
    # steps' time that is one probe per 100 declines.
    every = ctl.probe_interval(1, 1)
    assert every == pytest.approx(20.0 / (PROBE_BUDGET * 20.0))
    assert every > PROBE_MIN
    n = math.ceil(every)
    got = [ctl.trim(1, [Candidate(rec, [1, 2, 3, 4], 2)])[0] for _ in range(2 * n)]
    assert got.count(PROBE_GUESSES) == 2 and got.count(0) == 2 * n - 2
    assert got[n - 1] == PROBE_GUESSES


def test_probes_spend_a_bounded_share_of_a_full_batch():
    # 16 sequences share a step; each one's probe costs 2 rows of 1 each.
    ctl = controller(base=2.0, per_row=1.0)
    every = ctl.probe_interval(16, 16)
    share = ctl.costs.cost(16) / 16
    assert every * PROBE_BUDGET * share == pytest.approx(ctl.costs.cost(18) - ctl.costs.cost(16))
    assert every >= PROBE_MIN
    # With nothing measured yet there is no probing at all.
    assert Controller().probe_interval(1, 1) == math.inf


def test_a_fresh_engine_measures_a_guess_with_a_probe_first():
    # Only plain steps measured: what a guess costs is unknown, so the first
    # proposal is checked as a short probe, not as its whole draft, and the
    # next sequence in the same step does not probe on top of it.
    ctl = Controller()
    for _ in range(3):
        ctl.costs.record(1, 10.0)
    first, second = SeqSpec(), SeqSpec()
    keep = ctl.trim(1, [Candidate(first, list(range(8)), 16), Candidate(second, list(range(8)), 16)])
    assert keep == [PROBE_GUESSES, 0]
    # Once that probe's step is measured, the line decides: cheap rows pay.
    ctl.costs.record(1 + PROBE_GUESSES, 10.5)
    assert ctl.trim(1, [Candidate(evidence(4, kept=30, failed=1), list(range(8)), 16)])[0] > PROBE_GUESSES


def test_speculation_yields_to_a_full_batch_by_measure():
    # Rows that cost little next to a step's fixed part pay even in a batch...
    cheap = controller(base=20.0, per_row=0.25)
    rec = evidence(3, kept=40, failed=5)
    assert cheap.trim(16, [Candidate(rec, [1, 2, 3, 4], 8)])[0] > 0
    # ...but where each row costs as much as a sequence's share of the step,
    # the same evidence is declined with 16 sequences and taken with one.
    dear = controller(base=2.0, per_row=2.0)
    assert dear.trim(16, [Candidate(evidence(3, 40, 5), [1, 2, 3, 4], 8)])[0] == 0
    assert dear.trim(1, [Candidate(evidence(3, 40, 5), [1, 2, 3, 4], 8)])[0] > 0


def test_a_step_of_unequal_rows_is_priced_by_its_graph_runs():
    # llama.cpp runs a step whose sequences decode unequal rows as one
    # graph per level of rows: 4 one-row sequences and 2 guesses on one
    # are a run of 4 rows and a run of 2; equal guesses share a run.
    c = costs(10.0, 1.0)
    assert c.runs_cost(4, []) == pytest.approx(14.0)
    assert c.runs_cost(4, [2]) == pytest.approx(14.0 + 12.0)
    assert c.runs_cost(4, [2, 2]) == pytest.approx(14.0 + 14.0)
    assert c.runs_cost(4, [2, 2, 2, 2]) == pytest.approx(22.0)
    assert c.runs_cost(4, [2, 0, 5]) == pytest.approx(14.0 + 14.0 + 13.0)
    assert c.runs_cost(1, [3]) == pytest.approx(14.0)
    assert StepCosts().runs_cost(4, [2]) is None


def test_beside_other_sequences_a_guess_pays_for_a_whole_run():
    # Rows are cheap next to a graph run's fixed part: priced by rows, a
    # good guess pays beside three other sequences; priced by runs (the
    # engine's one-row decode steps), the extra run costs more than the
    # guesses are worth. A lone sequence has no other run to add.
    rec = evidence(3, kept=40, failed=5)
    assert controller(10.0, 0.5).trim(4, [Candidate(rec, [1, 2, 3, 4], 8)])[0] > 0
    ctl = controller(10.0, 0.5)
    assert ctl.trim(4, [Candidate(evidence(3, 40, 5), [1, 2, 3, 4], 8)], one_row_each=True) == [0]
    assert ctl.trim(1, [Candidate(evidence(3, 40, 5), [1, 2, 3, 4], 8)], one_row_each=True)[0] > 0
    # A long verbatim copy is worth a run of its own.
    long = Candidate(evidence(6, kept=400, failed=2), list(range(16)), 100)
    assert ctl.trim(4, [long], one_row_each=True)[0] > 8


def test_rows_past_a_full_batch_are_costed_from_full_batches():
    # Beside a lone sequence a row is nearly free; past 16 rows each costs
    # as much as a sequence's share. Guesses pay alone, not in the batch.
    ctl = Controller()
    for r in range(1, 10):
        ctl.costs.record(r, 10.0 + 0.1 * r)
    for r in (16, 18, 20):
        ctl.costs.record(r, 2.0 * r)
    rec = evidence(3, kept=40, failed=5)
    assert ctl.trim(1, [Candidate(rec, [1, 2, 3, 4], 8)])[0] > 0
    assert ctl.trim(16, [Candidate(rec, [1, 2, 3, 4], 8)])[0] == 0


def test_a_sequence_learns_from_its_own_checks_and_the_engine_from_all():
    ctl = controller(base=10.0, per_row=3.0)
    rec = SeqSpec()
    prior = ctl.alpha(rec, 2)
    for _ in range(10):
        ctl.record(rec, 2, drafted=4, kept=4)
    assert ctl.alpha(rec, 2) > prior and ctl.alpha(SeqSpec(), 2) > prior
    other = SeqSpec()
    for _ in range(10):
        ctl.record(other, 2, drafted=4, kept=0)
    assert ctl.alpha(other, 2) < ctl.alpha(rec, 2)


def test_a_copying_sequence_trusts_its_short_matches_too():
    ctl = controller(base=10.0, per_row=3.0)
    for _ in range(20):                             # the engine: short matches are chance
        ctl.record(SeqSpec(), 1, drafted=3, kept=0)
    copying = evidence(4, kept=60, failed=2)        # this one's long matches held
    assert ctl.alpha(copying, 1) > 2 * ctl.alpha(SeqSpec(), 1)
    keep = ctl.trim(1, [Candidate(copying, [1, 2, 3, 4], 2), Candidate(SeqSpec(), [5, 6], 2)])
    assert keep[0] > 0 and keep[1] == 0


def test_saved_time_counts_what_plain_steps_would_have_cost():
    ctl = controller(base=10.0, per_row=2.0)
    # One row and 4 kept guesses in 20 s, against plain steps of 12 s each.
    assert ctl.settle(1, 20.0, [Check(SeqSpec(), 4, 4)]) == pytest.approx(5 * 12.0 - 20.0)
    assert ctl.settle(2, 14.0, []) == 0.0           # no guesses, nothing saved


def test_a_step_is_settled_per_sequence_by_the_guesses_each_checked():
    ctl = controller(base=10.0, per_row=2.0)
    a, b = SeqSpec(), SeqSpec()
    # Plain steps of 2 rows cost 14 (7 a token); this one took 30, so its
    # 8 guesses added 16, 8 for each sequence's 4; a kept all 4, b none.
    total = ctl.settle(2, 30.0, [Check(a, 4, 4), Check(b, 4, 0)])
    assert a.returns.saved == pytest.approx(4 * 7.0 - 8.0)
    assert b.returns.saved == pytest.approx(-8.0)
    assert total == pytest.approx(12.0) == ctl.band(2).saved
    assert ctl.band(2).extra_per_guess() == pytest.approx(2.0)


def test_a_batch_band_whose_guesses_save_nothing_stops_guessing():
    # The rows say guesses are cheap beside 16 sequences (as they are
    # within one graph run)...
    ctl = controller(base=20.0, per_row=0.25)
    sure = evidence(3, kept=40, failed=5)
    assert ctl.trim(16, [Candidate(sure, [1, 2, 3, 4], 8)])[0] > 0
    # ...but the steps that checked them took a whole extra pass each: 4
    # guesses kept, each worth 1.5 s of a plain step, at a cost of 8 s.
    plain = ctl.costs.cost(16)
    assert plain / 16 == 1.5
    for _ in range(4):
        ctl.settle(16, plain + 8.0, [Check(SeqSpec(), 4, 4)])
    assert ctl.band(16).short(MIN_RETURN)
    assert ctl.trim(16, [Candidate(evidence(3, 40, 5), [1, 2, 3, 4], 8)])[0] == 0
    # A lone sequence's band has its own account.
    assert ctl.trim(1, [Candidate(evidence(3, 40, 5), [1, 2, 3, 4], 8)])[0] > 0
    # Probes go on, paced by what a guess was settled to cost, not the rows.
    assert ctl.probe_interval(16, 16) == pytest.approx(
        PROBE_GUESSES * 8.0 / 4 / (PROBE_BUDGET * plain / 16))


def test_a_sequence_whose_own_checks_lose_stops_guessing():
    ctl = controller(base=10.0, per_row=2.0)
    loser, fresh = evidence(3, kept=40, failed=5), evidence(3, kept=40, failed=5)
    # Its checks keep a guess in four (worth a 12 s step) and add 16 s.
    for _ in range(4):
        ctl.settle(1, 12.0 + 16.0, [Check(loser, 4, 1)])
    assert loser.returns.short(0.0)
    assert ctl.trim(1, [Candidate(loser, [1, 2, 3, 4], 8)])[0] == 0
    # Its band lost too; once steps that pay are settled there, a sequence
    # with no losses of its own guesses again.
    for _ in range(12):
        ctl.settle(1, 12.0 + 16.0, [Check(SeqSpec(), 4, 4)])
    assert not ctl.band(1).short(MIN_RETURN)
    assert ctl.trim(1, [Candidate(fresh, [1, 2, 3, 4], 8)])[0] > 0
    assert ctl.trim(1, [Candidate(loser, [1, 2, 3, 4], 8)])[0] == 0


def _stopped(ctl: Controller) -> SeqSpec:
    """A sequence (and its band) stopped by checks that lost: each kept a
    guess in four (worth a 12 s step) and added 16 s."""
    rec = evidence(3, kept=40, failed=5)
    for _ in range(4):
        ctl.settle(1, 12.0 + 16.0, [Check(rec, 4, 1)])
    assert ctl.stopped(rec, 1)
    return rec


@pytest.mark.parametrize("copying", [True, False])
def test_a_stopped_sequence_resumes_once_its_declined_guesses_would_have_held(copying):
    # Declined guesses are checked for free against the tokens that came
    # next: a sequence that starts copying (an edit's code after a new
    # docstring) guesses again within a few tokens, not at its next paid
    # probe; one whose guesses would have failed stays stopped.
    ctl = controller(base=10.0, per_row=2.0)
    rec = _stopped(ctl)
    source = list(range(100, 200))
    rec.history.extend([1, 2, 3])
    got = []
    for j in range(8):
        guesses = source[j + 1:j + 17]
        got.append(ctl.trim(1, [Candidate(rec, guesses, 12)])[0])
        rec.history.append(source[j + 1] if copying else -j)     # one plain step's token
    assert ctl.probe_interval(1, 1) > 8     # no paid probe in this window
    if copying:
        assert got[:2] == [0, 0] and max(got[2:5]) > 0, got
        assert not ctl.stopped(rec, 1)
    else:
        assert got == [0] * 8 and ctl.stopped(rec, 1)


def test_a_shadow_beside_other_sequences_leaves_the_band_to_real_checks():
    # Beside other sequences a check costs another graph run, which the row
    # curve does not show: a batch band that stopped stays stopped until
    # its real probes pay, whatever the shadows say; the sequence itself
    # learns from its shadow.
    ctl = controller(base=10.0, per_row=2.0)
    rec = evidence(3, kept=40, failed=5)
    for _ in range(4):
        ctl.settle(4, 18.0 + 16.0, [Check(rec, 4, 0)])
    assert ctl.band(4).short(MIN_RETURN)
    before = (ctl.band(4).saved, ctl.band(4).steps)
    rec.history.extend([1, 2, 3])
    for j in range(6):
        assert ctl.trim(4, [Candidate(rec, list(range(100 + j, 116 + j)), 12)])[0] == 0
        rec.history.append(100 + j)
    assert (ctl.band(4).saved, ctl.band(4).steps) == before
    assert rec.evidence.kept[3] > 40 and rec.cap > PROBE_GUESSES


def test_a_long_verbatim_match_is_trusted_by_its_length():
    # A copy rarely breaks once it has held for dozens of tokens: behind a
    # match of 16+ tokens each guess holds at least with the match's
    # length over that length and VERBATIM_SLACK, whatever short matches
    # taught the sequence.
    ctl = controller(base=10.0, per_row=1.0)
    rec = evidence(4, kept=5, failed=5)
    weak = ctl.alpha(rec, 4)
    assert weak < 0.7
    assert ctl.candidate_alpha(Candidate(rec, [1] * 16, 60)) == pytest.approx(
        60 / (60 + VERBATIM_SLACK))
    assert ctl.candidate_alpha(Candidate(rec, [1] * 16, 12)) == pytest.approx(ctl.alpha(rec, 3))
    long_k = ctl.trim(1, [Candidate(evidence(4, 5, 5), list(range(16)), 60)])[0]
    short_k = ctl.trim(1, [Candidate(evidence(4, 5, 5), list(range(16)), 16)])[0]
    assert long_k > short_k


# ---- the scheduler under auto ---------------------------------------------------------

def test_auto_is_the_default_and_off_turns_it_off():
    from llmctl.cli.options import Decoding, Spec

    assert LoadOptions().spec_config.mode == "auto"
    assert Decoding().load_fields()["spec"] == "auto"
    assert Decoding(spec=Spec.off).load_fields()["spec"] is None
    assert LoadOptions(**Decoding(spec=Spec.off).load_fields()).spec_config.mode is None
    # Naming a draft model under the default speculates with it.
    assert LoadOptions(draft="smollm2").spec_config.mode == "draft"


def test_auto_earns_longer_drafts_than_the_forced_modes_and_a_set_cap_holds():
    from llmctl.cli.options import Decoding, Spec

    assert LoadOptions().spec_config.draft_max == 16
    assert LoadOptions(spec="ngram").spec_config.draft_max == 8
    assert LoadOptions(draft="smollm2").spec_config.draft_max == 8
    assert LoadOptions(**Decoding(draft_max=5).load_fields()).spec_config.draft_max == 5
    assert LoadOptions(**Decoding(spec=Spec.ngram).load_fields()).spec_config.draft_max == 8
    with pytest.raises(UsageError, match="draft_min <= draft_max"):
        LoadOptions(spec="ngram", draft_min=10)


def test_auto_gives_every_decoding_sequence_room():
    s = Scheduler(SchedulerConfig(32, 512, spec=SpecConfig("auto", 8, 1), tile=1))
    for _ in range(16):
        s.add(Sequence(prompt=[1, 2, 3], params=SamplingParams(), max_new=100))
    for seq in s.admit():
        seq.n_computed, seq.status = 3, Status.DECODING
        seq.output.append(4)
    plan = s.schedule()
    assert len(plan) == 16 and {w.room for w in plan} == {8} and all(w.decode for w in plan)
    # The forced mode's fixed rule stops guessing past two sequences.
    forced = Scheduler(SchedulerConfig(32, 512, spec=SpecConfig("ngram", 8, 1), tile=1))
    forced.running, forced.slots = s.running, s.slots
    assert {w.room for w in forced.schedule()} == {0}


# ---- through the engine ------------------------------------------------------------

REPEAT = ("Repeat this list exactly, twice: apple, banana, cherry, date, elderberry, fig, "
          "grape, honeydew, kiwi, lemon, mango.")
FREE = "Write a short poem about the sea."


def load(spec):
    return LLM(ResolvedModel("smollm2", smollm2_file(), context=1024),
               LoadOptions(max_num_seqs=2, threads=2, spec=spec, flash_attn=True,
                           prefix_cache=False))


@pytest.mark.slow
def test_auto_answers_as_plain_decoding_and_checks_where_it_pays(exactness):
    params = SamplingParams(temperature=0, max_tokens=96)
    out = {}
    for spec in (None, "auto"):
        with load(spec) as llm:
            out[spec] = [llm.complete(llm.chat_tokens([{"role": "user", "content": p}]), params)
                         for p in (REPEAT, FREE)]
            stats = llm.stats()
    plain, auto = out[None], out["auto"]
    if exactness(flash_attn=True).exact:
        assert [c.text for c in auto] == [c.text for c in plain]
    assert all(c.text and c.finish_reason in ("stop", "length") for c in auto)
    assert stats.spec_steps > 0 and stats.spec_accepted > 0
    # It measured: some proposals were declined or some checks kept guesses.
    assert stats.spec_declined + stats.spec_accepted > 0
    assert stats.as_dict()["spec_saved_s"] == round(stats.spec_saved_s, 3)
