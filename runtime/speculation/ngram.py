"""Prompt-lookup speculation (`--spec ngram`): guess the next tokens by
finding the sequence's last few tokens earlier in its prompt or output and
proposing what followed them there. Edits, RAG answers and code repeat
their input, so the guesses often hold; checking k of them costs one
batched decode instead of k single-token steps.

Verification keeps the model's own choices: the engine samples every
guessed position with the sequence's own sampler, in order, and keeps
guesses only while they equal what it sampled (the greedy-draft rule). Where
llama.cpp computes a checked row exactly as a lone decode row (README,
speculation; scripts/bench_rows.py), the output is plain decoding's token
for token, at any temperature with a fixed seed."""

from __future__ import annotations

from array import array

from llmctl.runtime.speculation.proposer import Want

# Longest and shortest n-gram matched, longest first (llama.cpp's
# prompt-lookup decoding uses the same idea with similar sizes).
NGRAM_MAX = 4
NGRAM_MIN = 2
# How far back a match is looked for: a bound on Python work per step.
LOOKBACK = 4096


def ngram_draft(tokens: list[int], k: int) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the
    longest possible suffix n-gram of `tokens` (n from NGRAM_MAX down to
    NGRAM_MIN); [] when none recurs. Raises nothing."""
    if k <= 0 or len(tokens) <= NGRAM_MIN:
        return []
    # Searched as bytes: bytes.rfind runs in C, a Python scan per step would
    # cost more than the decode it saves on a small model.
    window = array("i", tokens[-LOOKBACK:]).tobytes()
    size = array("i").itemsize
    n_tok = len(window) // size
    for n in range(min(NGRAM_MAX, n_tok - 1), NGRAM_MIN - 1, -1):
        tail = window[(n_tok - n) * size:]
        end = (n_tok - 1) * size        # the match must end before the last token
        while True:
            at = window.rfind(tail, 0, end)
            if at < 0:
                break
            if at % size == 0:
                start = at // size + n
                follow = array("i", window[start * size:(start + k) * size]).tolist()
                if follow:
                    return follow
                break
            end = at + len(tail) - 1    # misaligned hit: look further back
    return []


class NgramProposer:
    """The Proposer for prompt lookup: pure Python, nothing to free."""

    @staticmethod
    def worth(slot: int, tokens: list[int], remaining: int) -> bool:
        """Always: a lookup costs nothing worth saving."""
        return True

    @staticmethod
    def propose(wants: list[Want]) -> list[list[int]]:
        """ngram_draft for each (slot, tokens, k). Raises nothing."""
        return [ngram_draft(tokens, k) for _, tokens, k in wants]

    def close(self) -> None:
        """Nothing to free."""
