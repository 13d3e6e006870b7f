"""A step as data: the scheduler's plan and the runner's result.

`Scheduler.schedule()` returns a StepPlan: the KV to attach first for
sequences it admitted (the prefix cache's plans), then the rows to decode,
each sequence's room for guesses and where its token is sampled.
Speculation fills the guesses in, as a new plan. The runner (runner.py)
carries a plan out with llama.cpp and returns a StepResult: what each new
sequence's KV holds, how many tokens each work computed, the tokens it
sampled with their log-probabilities, the guesses that held, and errors.
`Scheduler.update(plan, result)` applies it: after admission, the only
place a sequence's state changes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from llmctl.runtime.engine.logprobs import TokenLogprob
from llmctl.runtime.engine.sequence import Sequence

if TYPE_CHECKING:
    from llmctl.runtime.engine.events import Event
    from llmctl.runtime.prefix_cache.cache import AttachPlan
    from llmctl.runtime.prefix_cache.reuse import Reuse


@dataclass(frozen=True)
class Work:
    """One sequence's share of a step: tokens to compute from `pos`."""

    seq: Sequence
    tokens: list[int]
    pos: int            # position of tokens[0] in the sequence
    sample: bool        # this chunk ends the known tokens: sample after it
    draft: list[int] = field(default_factory=list)  # guesses after tokens[0], a proposer's
    room: int = 0       # guesses the budget allows this step (speculation)
    decode: bool = False  # a decoding sequence's step (its last token, and any draft)
    alone: bool = False   # a tile-rule chunk: computed in a llama_decode call of its own
    on_backend: bool = False  # sampled in llama.cpp's graph: one row, no guesses

    def with_draft(self, draft: list[int]) -> "Work":
        """This work checking `draft` after its token."""
        return dataclasses.replace(self, draft=list(draft), tokens=[self.tokens[0], *draft])


@dataclass(frozen=True)
class Attach:
    """A new sequence's KV plan, and how many of its tokens the plan's
    first choice leaves computed: its rows in the same plan start there,
    and run only when the KV manager's outcome agrees."""

    seq: Sequence
    plan: AttachPlan
    expect: int


@dataclass(frozen=True)
class Attached:
    """What a sequence's slot holds once its plan ran: `n_computed` of its
    prompt's tokens, `n_cached` of them reused, from the disk or memory."""

    n_computed: int
    n_cached: int
    from_disk: bool = False


def _spliced(moved: Reuse) -> int:
    """The tokens a splice of `moved` leaves computed: through its last
    run, and the one prompt token after it (splice.py)."""
    last = moved.runs[-1]
    return last.dst + last.n + 1


def expected(plans: list[AttachPlan], splicing: bool) -> list[int]:
    """The tokens each plan leaves computed when its first choice works,
    in the KV manager's order (engine/kv.py: a disk state spliced, one
    restored, memory runs spliced, a memory prefix), and with its rule
    that a slot another plan copies from first is not written."""
    copy_sources: set[int] = set()
    out = []
    for p in plans:
        n = None
        if p.slot not in copy_sources:
            if p.disk_runs is not None:
                n = _spliced(p.disk_runs[1])
            elif p.disk_hit is not None:
                n = p.disk_hit.n
            elif p.moved is not None and splicing:
                n = _spliced(p.moved)
        if n is None:
            if p.src != p.slot:
                copy_sources.add(p.src)
            n = p.n
        out.append(n)
    return out


@dataclass(frozen=True)
class StepPlan:
    """One step: KV to attach first, then rows to decode."""

    attach: tuple[Attach, ...] = ()
    work: tuple[Work, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.attach or self.work)

    def __iter__(self) -> Iterator[Work]:
        return iter(self.work)

    def __len__(self) -> int:
        return len(self.work)

    def __getitem__(self, i: int) -> Work:
        return self.work[i]

    def with_work(self, work: list[Work]) -> "StepPlan":
        return dataclasses.replace(self, work=tuple(work))


@dataclass(frozen=True)
class Sampled:
    """A sampled token: its id, its text's bytes, whether it ends the
    generation (end of generation), and its log-probability when asked."""

    token: int
    piece: bytes
    eog: bool
    logprob: TokenLogprob | None = None


@dataclass
class SeqResult:
    """What one sequence's works in a step did."""

    computed: int = 0               # tokens now in its KV that were not before
    sampled: list[Sampled] = field(default_factory=list)   # in order; guesses that held first
    drafted: int = 0                # guesses checked
    error: Exception | None = None  # the step failed this sequence alone

    @property
    def kept(self) -> int:
        """Guesses that held (the last sampled token is the step's own)."""
        return max(len(self.sampled) - 1, 0) if self.drafted else 0


@dataclass
class StepResult:
    """What the runner did with a plan, by sequence id."""

    attached: dict[int, Attached | Exception] = field(default_factory=dict)
    seqs: dict[int, SeqResult] = field(default_factory=dict)

    def of(self, seq: Sequence) -> SeqResult:
        return self.seqs.setdefault(seq.id, SeqResult())


@dataclass(frozen=True)
class Ending:
    """A sequence the scheduler ended: the slot it had (None: none), what
    that slot keeps (`park`: the tokens whose KV it still holds; None:
    cleared) and the event that tells its caller."""

    seq: Sequence
    slot: int | None
    park: list[int] | None
    event: Event


@dataclass
class StepOutput:
    """What an update asks of the engine: events to send, prompts just
    computed (their state may go to the disk), and sequences ended (their
    KV kept to what they computed, then parked or cleared)."""

    events: list[tuple[Sequence, Event]] = field(default_factory=list)
    prefilled: list[Sequence] = field(default_factory=list)
    ended: list[Ending] = field(default_factory=list)
