"""The scheduler's decisions, without a model: plans it makes and the results
of runs it is fed."""

from pathlib import Path

import pytest
from plans import run_plan

from llmctl.errors import QueueFull
from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, TokenEvent
from llmctl.runtime.engine.plan import Attached, Sampled, StepResult
from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.prefix_cache.cache import AttachPlan
from llmctl.runtime.prefix_cache.disk import Hit
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.spec_config import SpecConfig


def seq(n_prompt: int, max_new: int = 8, **params) -> Sequence:
    return Sequence(prompt=list(range(1, n_prompt + 1)), params=SamplingParams(**params),
                    max_new=max_new)





def test_admission_is_fifo_and_bounded_by_slots():
    s = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64))
    a, b, c = seq(4), seq(4), seq(4)
    for x in (a, b, c):
        s.add(x)
    admitted = s.admit()
    assert admitted == [a, b]
    assert {a.slot, b.slot} == {0, 1}
    assert c.status is Status.WAITING and s.counts() == (2, 1, 0, 0)


def test_queue_full_raises_beyond_the_slots_that_can_take_requests():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8, max_queue=2))
    for _ in range(3):          # one for the free slot, two queued behind it
        s.add(seq(2))
    with pytest.raises(QueueFull):
        s.add(seq(2))


def test_a_cancelled_request_still_queued_leaves_room_for_a_live_one():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8, max_queue=2))
    queued = [seq(2) for _ in range(3)]
    for x in queued:
        s.add(x)
    Scheduler.cancel(queued[-1])        # its client left; the next step drops it
    s.add(seq(2))
    with pytest.raises(QueueFull):
        s.add(seq(2))


def test_parked_slots_count_as_room_in_the_queue_limit():
    s = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, max_queue=1,
                                  prefix_sharing=True, min_share=4, tile=1))
    a = seq(8)
    b = Sequence(prompt=list(range(100, 108)), params=SamplingParams(), max_new=8)
    s.add(a)
    s.add(b)
    s.admit()
    run_plan(s, s.schedule())
    for x in (a, b):
        s.finish(x, "stop", park=x.tokens[:x.n_computed])
    assert s.counts() == (0, 0, 2, 0)
    for _ in range(3):          # two parked slots take two, one may queue
        s.add(seq(8))
    with pytest.raises(QueueFull):
        s.add(seq(8))
    assert len(s.admit()) == 2


def test_a_sequence_moves_through_its_states():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=4))
    a = seq(6)
    s.add(a)
    assert a.status is Status.WAITING
    s.admit()
    assert a.status is Status.PREFILLING
    run_plan(s, s.schedule())
    assert a.status is Status.PREFILLING and a.n_computed == 4
    run_plan(s, s.schedule())
    assert a.status is Status.DECODING and a.output == [7]
    s.finish(a, "length")
    assert a.status is Status.FINISHED and s.counts() == (0, 0, 0, 1)
    stats = s.make_stats()
    assert stats.requests["ok"] == 1 and stats.prompt_tokens == 6 and stats.generation_tokens == 1


def test_chunked_prefill_respects_budget_and_finishes_oldest_first():
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=10))
    long1, long2 = seq(15), seq(6)
    s.add(long1)
    s.add(long2)
    s.admit()
    plan = s.schedule()
    # The whole budget goes to the oldest prompt first.
    assert [(w.seq, len(w.tokens), w.sample) for w in plan] == [(long1, 10, False)]
    run_plan(s, plan)
    plan = s.schedule()
    assert [(w.seq, len(w.tokens), w.sample) for w in plan] == [(long1, 5, True), (long2, 5, False)]
    assert plan[1].pos == 0
    run_plan(s, plan)
    plan = s.schedule()
    # long1 now decodes one token; long2 finishes its prompt in the same step.
    assert [(w.seq, len(w.tokens), w.sample) for w in plan] == [(long1, 1, True), (long2, 1, True)]
    assert plan[0].pos == 15 and plan[1].pos == 5


def test_decode_tokens_come_before_prefill_in_budget():
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=6))
    running = [seq(2), seq(2), seq(2)]
    for r in running:
        s.add(r)
    s.admit()
    run_plan(s, s.schedule())          # all three prompts fit: 6 tokens
    newcomer = seq(20)
    s.add(newcomer)
    s.admit()
    plan = s.schedule()
    assert [len(w.tokens) for w in plan] == [1, 1, 1, 3]   # 3 decodes + 3 prompt tokens
    assert plan[-1].seq is newcomer and not plan[-1].sample


def test_finish_frees_slot_for_waiting_request():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8))
    a, b = seq(2), seq(2)
    s.add(a)
    s.add(b)
    s.admit()
    slot = a.slot
    s.finish(a, "stop")
    assert a.status is Status.FINISHED and a.finish_reason == "stop"
    assert s.admit() == [b] and b.slot == slot


def test_cancel_waiting_request_removes_it():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8))
    a, b = seq(2), seq(2)
    s.add(a)
    s.add(b)
    s.admit()
    s.finish(b, "cancelled")
    assert s.counts()[1] == 0 and b.finish_reason == "cancelled"
    assert s.running == [a]


@pytest.mark.parametrize("output,is_eog,ignore_eos,max_new,n_ctx,expected", [
    ([5], True, False, 8, 100, "stop"),
    ([5], True, True, 8, 100, None),
    ([5] * 8, False, False, 8, 100, "length"),
    ([5] * 3, False, False, 8, 6, "length"),     # 3 prompt + 3 output fills a 6-token context
    ([5] * 3, False, False, 8, 100, None),
])
def test_stop_reason(output, is_eog, ignore_eos, max_new, n_ctx, expected):
    s = seq(3, max_new=max_new, ignore_eos=ignore_eos)
    s.output = output
    assert Scheduler.stop_reason(s, output[-1], is_eog, n_ctx) == expected


# ---- plans and results: KV attached first, then what the step did ------------------------


class DiskCache:
    """A prefix cache whose disk holds `n` tokens of every prompt."""

    def __init__(self, n: int):
        self.n = n

    def plan_attach(self, seq_id, slot, prompt, kv_src, moved):
        hit = Hit(Path("state"), self.n, 0)
        return AttachPlan(seq_id, slot, prompt, kv_src[0], kv_src[1], moved, None, hit)


def sharing(cache) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64,
                                     prefix_sharing=True, min_share=4, tile=1), cache=cache)


def test_a_new_sequences_kv_is_attached_first_and_its_chunk_starts_after_it():
    s, a = sharing(DiskCache(48)), seq(100)
    s.add(a)
    s.admit()
    plan = s.schedule()
    (attach,) = plan.attach
    assert attach.seq is a and attach.expect == 48
    assert [(w.pos, len(w.tokens), w.sample) for w in plan] == [(48, 52, True)]
    result = StepResult(attached={a.id: Attached(48, 48, from_disk=True)})
    r = result.of(a)
    r.computed, r.sampled = 52, [Sampled(7, b"x", False)]
    out = s.update(plan, result)
    assert (a.n_computed, a.n_cached, a.cached_from_disk, a.output) == (100, 48, True, [7])
    assert out.prefilled == [a] and isinstance(out.events[0][1], TokenEvent)


def test_a_plan_whose_kv_fell_back_starts_again_from_what_the_slot_holds():
    s, a = sharing(DiskCache(48)), seq(100)
    s.add(a)
    s.admit()
    plan = s.schedule()
    # The runner held its rows back: the state was unreadable, memory gave 0.
    s.update(plan, StepResult(attached={a.id: Attached(0, 0)}))
    assert (a.n_computed, a.n_cached, a.output) == (0, 0, [])
    again = s.schedule()
    assert not again.attach and [(w.pos, len(w.tokens)) for w in again] == [(0, 64)]


def test_a_failed_attach_ends_that_request_with_its_error():
    s, a = sharing(DiskCache(48)), seq(100)
    s.add(a)
    s.admit()
    slot = a.slot
    out = s.update(s.schedule(), StepResult(attached={a.id: OSError("the disk is gone")}))
    (ending,) = out.ended
    assert (ending.slot, ending.park) == (slot, None) and isinstance(ending.event, ErrorEvent)
    assert "the disk is gone" in ending.event.error.message
    assert a.status is Status.FINISHED and s.counts() == (0, 0, 0, 2)


def test_a_check_confirms_its_guesses_and_a_stop_string_ends_it_midway():
    s = Scheduler(SchedulerConfig(4, 64, spec=SpecConfig("ngram", 8, 1), tile=1))
    a = seq(4, max_new=50, stop=["AB"])
    s.add(a)
    s.admit()
    run_plan(s, s.schedule())                   # the prompt, and a first token
    plan = s.schedule()
    result = StepResult()
    r = result.of(a)
    r.computed, r.drafted = 1, 3
    r.sampled = [Sampled(1, b"x", False), Sampled(2, b"A", False), Sampled(3, b"B", False),
                 Sampled(4, b"y", False)]
    out = s.update(plan, result)
    # Two guesses confirmed before the stop string; the last token is never taken.
    assert (a.output, a.n_computed, a.spec_cap) == ([7, 1, 2, 3], 7, 7)
    assert [e.text for _, e in out.events if isinstance(e, TokenEvent)] == ["x"]
    (ending,) = out.ended
    assert isinstance(ending.event, FinishEvent) and ending.event.stop == "AB"
    assert a.finish_reason == "stop" and ending.slot is not None and ending.park is None


def test_an_error_in_a_step_ends_only_its_request():
    s = Scheduler(SchedulerConfig(4, 64, tile=1))
    a, b = seq(4), seq(4)
    for x in (a, b):
        s.add(x)
    s.admit()
    plan = s.schedule()
    result = StepResult()
    for w in plan:
        result.of(w.seq).computed = len(w.tokens)
        result.of(w.seq).sampled = [Sampled(7, b"x", False)]
    result.of(b).error = ValueError("sampler exploded")
    out = s.update(plan, result)
    assert [e.seq for e in out.ended] == [b] and isinstance(out.ended[0].event, ErrorEvent)
    assert a.status is Status.DECODING and a.output == [7]
    assert s.make_stats().requests["error"] == 1
