"""The one interface speculation is made of: a proposer guesses each
speculating sequence's next tokens, and the engine checks the guesses with
`check_guesses` in its one batched decode. The scheduler only budgets how
many guesses each sequence may have (`Work.room`).

Guesses never change the output: a guess is kept only where the target's
own sampler picks the same token (the greedy-draft rule), so a proposer
that is wrong, slow or failing only costs speed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar

# (slot, the sequence's tokens so far, most guesses wanted). The tokens are
# the engine's running array of them (adaptive.SeqSpec.history): copying a
# long prompt into a new array every step would cost more than a lookup.
Want = tuple[int, Sequence[int], int]


@dataclass(frozen=True)
class Guess:
    """A proposer's guessed next tokens, and the length of the n-gram match
    behind them (0 where they come from elsewhere, a draft model): the
    evidence kind adaptive speculation measures them by."""

    tokens: list[int]
    match: int = 0


NO_GUESS = Guess([])

T = TypeVar("T")


class Proposer(Protocol):
    """Guesses next tokens for many sequences at once."""

    def worth(self, slot: int, tokens: Sequence[int], remaining: int) -> bool:
        """Whether guessing for this sequence, with `remaining` tokens left
        to generate, can pay at all."""
        ...

    def propose(self, wants: list[Want]) -> list[Guess]:
        """For each want, up to its most guesses (none: none this step).
        Never raises: a failed guess is no guess."""
        ...

    def close(self) -> None:
        """Free what the proposer holds."""
        ...


def check_guesses(guesses: list[int], sample: Callable[[int], tuple[int, T]]) -> list[tuple[int, T]]:
    """Verify a speculating step: sample each guessed position in order
    (`sample(i)` samples, with the sequence's own sampler, the logits after
    the step's i-th token: its last accepted token, then each guess) and go
    on while the samples equal the guesses. Returns what was sampled: the accepted guesses, then the token
    plain decoding gives where the first guess failed (or after the last).
    Raises what `sample` raises."""
    sampled = []
    for i in range(len(guesses) + 1):
        sampled.append(sample(i))
        if i == len(guesses) or sampled[-1][0] != guesses[i]:
            break
    return sampled
