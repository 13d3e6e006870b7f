"""The server's queue bounds (server/admission.py) without a model: what a
ticket is charged, when a request is refused, and when it leaves the
queue. The real-server side is tests/test_bursts.py."""

from __future__ import annotations

import pytest

from llmctl.bench.workloads import burst_levels
from llmctl.errors import UsageError
from llmctl.server.admission import (
    DEFAULT_MAX_QUEUED,
    MB,
    PARSED_FACTOR,
    PER_REQUEST_BYTES,
    Admission,
    default_queued_mb,
    protocol_of,
)
from llmctl.server.workers import ServerBusy


class FakeFeed:
    def __init__(self, waiting: bool = True):
        self.waiting = waiting


def test_the_count_bound_counts_what_waits_beyond_the_slots():
    adm = Admission(max_queued=3, max_queued_bytes=64 * MB)
    adm.slots = lambda: 2
    tickets = [adm.admit("openai") for _ in range(5)]      # 2 run, 3 wait
    with pytest.raises(ServerBusy, match=r"3 requests wait .*\(--max-queued 3\)"):
        adm.admit("ollama")
    assert adm.refused == 1
    adm.release(tickets[0])                                 # one is done: room again
    sixth = adm.admit("anthropic")
    tickets[1].feeds = [FakeFeed(waiting=False)]        # holds a slot: not queued
    view = adm.view()
    assert view.in_flight == 5 and view.queued == 4 and sixth.queued and not tickets[1].queued


def test_bodies_are_charged_with_their_parsed_form_against_the_byte_budget():
    budget = PER_REQUEST_BYTES * 2 + PARSED_FACTOR * 1000
    adm = Admission(max_queued=100, max_queued_bytes=budget)
    a = adm.admit("openai")
    adm.grow(a, 1000)
    assert adm.queued_bytes == a.charge == PER_REQUEST_BYTES + PARSED_FACTOR * 1000
    b = adm.admit("openai")                 # its fixed charge still fits ...
    with pytest.raises(ServerBusy, match="--max-queued-mb"):
        adm.grow(b, 1)                      # ... one more body byte does not
    assert adm.queued_bytes == budget and adm.refused == 1
    adm.release(a)
    adm.grow(b, 1000)                       # room again once `a` is done
    adm.release(b)
    assert (adm.queued, adm.queued_bytes, adm.view().in_flight) == (0, 0, 0)


def test_the_view_counts_what_waits_by_model_and_protocol_and_the_oldest_wait():
    adm = Admission()
    first, second, third = (adm.admit(p) for p in ("openai", "ollama", "openai"))
    first.model, second.model, third.model = "qwen", "qwen", "smollm2"
    second.feeds = [FakeFeed(waiting=False), FakeFeed(waiting=True)]   # n=2: one runs
    view = adm.view()
    assert view.queued == 2 and view.by_model == {"qwen": 1, "smollm2": 1}
    assert view.by_protocol == {"openai": 2}
    assert view.oldest_wait_s >= 0 and view.in_flight == 3
    assert set(view.as_dict()) >= {"queued", "queued_bytes", "oldest_wait_s", "refused"}


def test_a_released_ticket_is_released_once():
    adm = Admission()
    t = adm.admit("openai")
    adm.release(t)
    adm.release(t)
    assert (adm.queued, adm.queued_bytes) == (0, 0)


def test_paths_name_their_protocol():
    assert [protocol_of(p) for p in ("/v1/messages", "/v1/responses", "/api/chat",
                                     "/v1/chat/completions", "/tokenize")] == \
        ["anthropic", "responses", "ollama", "openai", "other"]


def test_the_default_budget_follows_the_machines_memory_within_bounds():
    assert 256 <= default_queued_mb() <= 1024


def test_bounds_come_from_the_flags_else_the_defaults():
    adm = Admission.from_flags(7, 2.0)
    assert (adm.max_queued, adm.max_queued_bytes) == (7, 2 * MB)
    adm = Admission.from_flags()
    assert (adm.max_queued, adm.max_queued_bytes) == (DEFAULT_MAX_QUEUED, int(default_queued_mb() * MB))


def test_a_burst_level_follows_the_sweep_it_is_given():
    assert burst_levels(1000, None, 64, sweep=False) == [1000]
    assert burst_levels(100, None, 64, sweep=True) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert burst_levels(100, "1,16,500", 64, sweep=False) == [1, 16, 100]
    with pytest.raises(UsageError, match="--burst"):
        burst_levels(0, None, 64, sweep=False)
