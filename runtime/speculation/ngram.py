"""Prompt-lookup speculation (`--spec ngram`, and `--spec auto`'s guesses):
guess the next tokens by finding the sequence's last tokens earlier in its
prompt or output and proposing what followed them there. Edits, RAG
answers and code repeat their input, so the guesses often hold; checking k
of them costs one batched decode instead of k single-token steps.

Of the places where the last NGRAM_MIN tokens occurred before, the one
whose match reaches furthest back is taken (the most recent among equals):
a long match is strong evidence that the text is being copied, a short one
weak, and adaptive speculation (adaptive.py) measures each length's worth
separately, so the match length goes with the guess.

Verification keeps the model's own choices: the engine samples every
guessed position with the sequence's own sampler, in order, and keeps
guesses only while they equal what it sampled (the greedy-draft rule). Where
llama.cpp computes a checked row exactly as a lone decode row (README,
speculation; scripts/bench_rows.py), the output is plain decoding's token
for token, at any temperature with a fixed seed."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from llmctl.runtime.speculation.proposer import NO_GUESS, Guess, Want

# Shortest match that proposes anything, and the longest measured.
NGRAM_MIN = 2
MATCH_MAX = 256
# Most recent occurrences of the last NGRAM_MIN tokens compared, and how far
# back they are looked for: bounds on the work per step.
CANDIDATES = 16
LOOKBACK = 4096
_SIZE = array("i").itemsize


def ngram_guess(tokens: Sequence[int], k: int) -> Guess:
    """Up to `k` tokens that followed the earlier occurrence of the
    sequence's last tokens with the longest match, and that match's
    length; no guess when the last NGRAM_MIN tokens never occurred before.
    Raises nothing."""
    if k <= 0 or len(tokens) <= NGRAM_MIN:
        return NO_GUESS
    # Searched as bytes: bytes.rfind and slice compares run in C, a Python
    # scan per step would cost more than the decode it saves on a small model.
    window = tokens[-LOOKBACK:]
    if not isinstance(window, array):
        window = array("i", window)
    buf = window.tobytes()
    n = len(window)
    tail = buf[(n - NGRAM_MIN) * _SIZE:]
    end = (n - 1) * _SIZE           # a match must leave a token after it
    best_at, best_len, seen = -1, 0, 0
    while seen < CANDIDATES and best_len < MATCH_MAX:
        at = buf.rfind(tail, 0, end)
        if at < 0:
            break
        end = at + len(tail) - 1    # the next search looks further back
        if at % _SIZE:
            continue                # misaligned: the bytes straddle two tokens
        seen += 1
        follow = at // _SIZE + NGRAM_MIN
        length = _match_len(buf, follow, n)
        if length > best_len:
            best_at, best_len = follow, length
    if best_at < 0:
        return NO_GUESS
    return Guess(window[best_at:best_at + k].tolist(), best_len)


def _match_len(buf: bytes, follow: int, n: int) -> int:
    """How many tokens before `follow` equal the window's last ones (at
    least NGRAM_MIN, which the caller matched; at most MATCH_MAX)."""
    lo, hi = NGRAM_MIN, min(MATCH_MAX, follow)
    tail_end = n * _SIZE
    while lo < hi:                  # the longest equal length, by halving
        mid = (lo + hi + 1) // 2
        if buf[(follow - mid) * _SIZE:follow * _SIZE] == buf[tail_end - mid * _SIZE:tail_end]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class NgramProposer:
    """The Proposer for prompt lookup: pure Python, nothing to free."""

    @staticmethod
    def worth(slot: int, tokens: Sequence[int], remaining: int) -> bool:
        """Always: a lookup costs nothing worth saving."""
        return True

    @staticmethod
    def propose(wants: list[Want]) -> list[Guess]:
        """ngram_guess for each (slot, tokens, k). Raises nothing."""
        return [ngram_guess(tokens, k) for _, tokens, k in wants]

    def close(self) -> None:
        """Nothing to free."""
