"""The scheduler's decisions, without a model."""

import pytest

from llmctl.errors import QueueFull
from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.sampling import SamplingParams


def seq(n_prompt: int, max_new: int = 8, **params) -> Sequence:
    return Sequence(prompt=list(range(1, n_prompt + 1)), params=SamplingParams(**params),
                    max_new=max_new)


def run_plan(plan, token=7):
    """Pretend the decode ran: advance positions, sample where asked."""
    for w in plan:
        Scheduler.on_computed(w.seq, len(w.tokens))
        if w.sample:
            Scheduler.on_token(w.seq, token)


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
    run_plan(s.schedule())
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
    run_plan(s.schedule())
    assert a.status is Status.PREFILLING and a.n_computed == 4
    run_plan(s.schedule())
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
    run_plan(plan)
    plan = s.schedule()
    assert [(w.seq, len(w.tokens), w.sample) for w in plan] == [(long1, 5, True), (long2, 5, False)]
    assert plan[1].pos == 0
    run_plan(plan)
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
    run_plan(s.schedule())          # all three prompts fit: 6 tokens
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
