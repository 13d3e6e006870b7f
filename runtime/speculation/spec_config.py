"""Speculation settings and their defaults, defined once for the engine,
LoadOptions and the CLI."""

from __future__ import annotations

from dataclasses import dataclass

DRAFT_MAX = 8       # most guessed tokens per step, forced modes
# Auto's cap is higher: its drafts are earned run by run (adaptive.py), so a
# long one is checked only after a long run held (docs/speculation.md).
AUTO_DRAFT_MAX = 16
DRAFT_MIN = 1       # fewer found: don't speculate this step
# A draft model's guesses stop where its top probability is lower
# (llama-server's --draft-p-min has the same default).
P_MIN = 0.75
MODES = (None, "auto", "ngram", "draft")


def next_cap(kept: int, probe: int) -> int:
    """The most guesses a sequence's next check may take after one of
    which `kept` held: twice that run, and `probe` more to learn whether a
    longer one would hold (1 under a forced mode; auto probes with its own,
    adaptive.py). A checked row costs a good part of a decode step on a
    CPU (docs/speculation.md), so guesses that keep failing are checked a
    few at a time, and a cap whose guesses hold doubles."""
    return 2 * kept + probe


def default_draft_max(mode: str | None) -> int:
    """The most guesses per step when --draft-max is not given."""
    return AUTO_DRAFT_MAX if mode == "auto" else DRAFT_MAX


@dataclass(frozen=True)
class SpecConfig:
    """Speculation settings; `mode` None turns it off. Raises ValueError
    for out-of-range values."""

    # "auto" (n-gram guesses where they pay: adaptive.py), "ngram" (always),
    # or "draft" (a draft model: draft.py)
    mode: str | None = None
    draft_max: int = DRAFT_MAX      # most guessed tokens per step
    draft_min: int = DRAFT_MIN      # fewer found: don't speculate this step
    p_min: float = P_MIN            # a draft model's guesses stop below it

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown speculation mode {self.mode!r}: use auto, ngram or draft")
        if not 1 <= self.draft_min <= self.draft_max <= 64:
            raise ValueError("need 1 <= draft_min <= draft_max <= 64")
        if not 0 <= self.p_min <= 1:
            raise ValueError("draft_p_min must be in [0, 1]")
