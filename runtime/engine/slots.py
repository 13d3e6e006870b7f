"""The slot table: which llama.cpp sequence slots are free, which are parked
with a finished sequence's KV (least recently used first out), and where
each admitted prompt's longest computed prefix lives.

With prefix sharing on, a finished sequence's slot is parked with its KV
instead of being freed, and each admitted sequence is told where the
longest computed prefix of its prompt lives: in its own (parked) slot, in
another slot to copy from, or in a leader that is still prefilling it, in
which case it waits (holding its slot, computing nothing) until the leader
has computed the shared part. N requests sharing a new system prompt thus
compute it once. What may be reused is prefix_cache.rule's to say.

Plain Python, run on the engine thread; the sizes may be read from any."""

from __future__ import annotations

from collections import OrderedDict

from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.prefix_cache import reuse
from llmctl.runtime.prefix_cache.rule import parkable, reusable

# A parked slot is taken for a prompt when its KV holds at least this share
# of it (llama-server's --slot-prompt-similarity, 0.1), however short: its
# own KV costs no copy. Short chats share only their template's opening
# (about 30 tokens), and recomputing it for every request of a burst halved
# the burst's throughput (docs/measurements.md, "Bursts").
IN_PLACE_SHARE = 0.1


class SlotTable:
    """`n_slots` KV slots. A prefix shorter than `min_share` tokens is not
    worth a copy or a wait (its own slot's is, from IN_PLACE_SHARE of the
    prompt); `tile` is the exactness rule's (rule.py).
    `min_run` > 0 also reuses runs of at least that many cached tokens past
    a prompt's first difference, moved to their new positions
    (prefix_cache/reuse.py); 0 reuses exact prefixes only."""

    def __init__(self, n_slots: int, *, min_share: int, tile: int, min_run: int = 0):
        self.min_share = min_share
        self.tile = tile
        self.min_run = min_run
        self._free = list(range(n_slots - 1, -1, -1))
        self._parked: OrderedDict[int, list[int]] = OrderedDict()   # slot -> tokens in its KV
        self._held: dict[int, list[int]] = {}   # a taken parked slot's tokens, until planned
        # The runs take() planned per parked slot for one prompt, which
        # plan_prefix reuses rather than plans again.
        self._plans: tuple[list[int], dict[int, reuse.Reuse]] | None = None

    # ---- sizes (any thread) -----------------------------------------------------

    def room(self) -> int:
        """Slots a waiting request can take at the next step."""
        return len(self._free) + len(self._parked)

    def counts(self) -> tuple[int, int]:
        """(parked slots, free slots)."""
        return len(self._parked), len(self._free)

    def parked_slots(self) -> dict[int, list[int]]:
        """Parked slots, least recently used first, with the tokens in their KV."""
        return dict(self._parked)

    def is_free(self, slot: int) -> bool:
        return slot in self._free

    # ---- taking and giving back -------------------------------------------------

    def take(self, prompt: list[int]) -> tuple[int, int]:
        """(slot, prompt tokens its KV already holds) for a new sequence: the
        parked slot whose tokens best match the prompt when that is worth
        it, else the lowest free slot, else the least recently used parked
        one. Raises IndexError when every slot is busy (check `room`)."""
        best, best_n, best_score = -1, 0, 0
        self._plans = (prompt, {})
        for slot, tokens in self._parked.items():
            n = reusable(tokens, prompt, self.tile)
            score = self._moved(slot, tokens, prompt, n).total if self._worth_moving(prompt, n) else n
            if score > best_score:
                best, best_n, best_score = slot, n, score
        if best_score >= self.min_share or (best_n and best_n >= IN_PLACE_SHARE * len(prompt)):
            self._held[best] = self._parked.pop(best)
            return best, best_n
        if self._free:
            # Lowest id first: llama.cpp packs only runs of consecutive seq
            # ids into one ubatch, so compact slots mean fewer, fuller ubatches.
            slot = min(self._free)
            self._free.remove(slot)
            return slot, 0
        slot, _ = self._parked.popitem(last=False)
        return slot, 0

    def _worth_moving(self, prompt: list[int], n: int) -> bool:
        return self.min_run > 0 and len(prompt) - n >= 2 * self.min_run

    def _moved(self, slot: int, have: list[int], prompt: list[int], n: int) -> reuse.Reuse:
        """The runs of `slot`'s tokens `have` that `prompt` reuses past `n`:
        planned once per prompt and slot (take, then plan_prefix)."""
        plans = self._plans[1] if self._plans is not None and self._plans[0] is prompt else None
        got = plans.get(slot) if plans is not None else None
        if got is None or got.prefix != n:
            got = reuse.plan(have, prompt, n, self.min_run)
            if plans is not None:
                plans[slot] = got
        return got

    def give_back(self, seq: Sequence, park: list[int] | None) -> None:
        """A finished sequence's slot: parked with `park`, the tokens whose KV
        it still holds (what of them may be reused), or freed."""
        if park is not None:
            park = parkable(park, len(seq.prompt), self.tile)
        if park:
            self._parked[seq.slot] = park
        else:
            self._free.append(seq.slot)

    # ---- prefix plans -----------------------------------------------------------

    def plan_prefix(self, seq: Sequence, running: list[Sequence]) -> None:
        """Pick the longest computed prefix to reuse now, or a leader to wait
        for when one is prefilling a clearly longer shared prefix; then,
        with `min_run`, runs past the prefix to move (`seq.moved`)."""
        src, n = seq.kv_src
        leader, target = None, 0
        for other in running:
            if other is seq or other.status is Status.WAITING_PREFIX:
                continue
            shared = reusable(other.prompt if self.tile > 1 else other.tokens, seq.prompt,
                              self.tile)
            have = min(shared, other.n_computed)
            if have > n and have >= self.min_share:
                src, n = other.slot, have
            if (other.status is Status.PREFILLING and shared - have >= self.min_share
                    and shared > target):
                leader, target = other, shared
        for slot, tokens in self._parked.items():
            have = reusable(tokens, seq.prompt, self.tile)
            if have > n and have >= self.min_share:
                src, n = slot, have
        seq.kv_src = (src, n) if n else (seq.slot, 0)
        seq.moved = None
        if leader is not None and target >= n + self.min_share:
            seq.wait_for, seq.wait_until = leader, target
            seq.status = Status.WAITING_PREFIX
        else:
            self._plan_moves(seq)
        self._plans = None

    def _plan_moves(self, seq: Sequence) -> None:
        """Runs to move from the sequence's own slot or a parked one, when
        they reuse more than the exact prefix planned (by a run at least)."""
        held = self._held.pop(seq.slot, None)
        src, n = seq.kv_src
        if not self._worth_moving(seq.prompt, n):
            return
        sources = dict(self._parked)
        if held is not None:
            sources[seq.slot] = held
        best: tuple[int, reuse.Reuse] | None = None
        for slot, tokens in sources.items():
            # An exact prefix elsewhere counts only from its own slot.
            start = n if slot == src else reusable(tokens, seq.prompt, self.tile)
            got = self._moved(slot, tokens, seq.prompt, start)
            if got.runs and got.total >= (best[1].total if best else n + self.min_run):
                best = (slot, got)
        if best is not None:
            seq.kv_src, seq.moved = (best[0], best[1].prefix), best[1]

    def release_waiters(self, running: list[Sequence]) -> list[Sequence]:
        """Sequences whose leader has computed what they wait for (or is
        gone); their prefix is planned again from what exists now."""
        ready = []
        for seq in running:
            lead = seq.wait_for
            if seq.status is not Status.WAITING_PREFIX or lead is None:
                continue
            if lead.status.has_slot and lead.n_computed < seq.wait_until:
                continue
            seq.wait_for = None
            seq.status = Status.PREFILLING
            src, n = seq.kv_src
            if src != seq.slot:
                seq.kv_src = (seq.slot, 0)
            self.plan_prefix(seq, running)
            if seq.status is Status.PREFILLING:
                ready.append(seq)
        return ready
