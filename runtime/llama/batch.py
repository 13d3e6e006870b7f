"""The one way a llama_batch is filled: every decode (generation steps,
whole-prompt logits, embeddings) appends runs of one sequence's tokens."""

from __future__ import annotations

from typing import Sequence

import llama_cpp as lc


class Batch:
    """One llama_batch of up to `capacity` tokens, reused for every decode
    of its context. `add` refuses to go past `capacity`: the arrays end
    there, and a row past them would be written over other memory."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.raw = lc.llama_batch_init(capacity, 0, 1)

    def clear(self) -> None:
        """Start filling from the first row again."""
        self.raw.n_tokens = 0

    def add(self, seq_id: int, tokens: Sequence[int], pos: int, n_logits: int) -> int:
        """Append `tokens` of sequence `seq_id` at positions pos, pos + 1, ...;
        the last `n_logits` of them output logits. Returns the batch row of
        the first of those (-1 when n_logits is 0). Raises ValueError, with
        nothing written, when the tokens would not fit."""
        b = self.raw
        if b.n_tokens + len(tokens) > self.capacity:
            raise ValueError(f"{b.n_tokens + len(tokens)} tokens do not fit a batch of "
                             f"{self.capacity}")
        # Each field read of a ctypes struct builds a new pointer object:
        # read them once, not once a token.
        token, positions, n_seq_id, seq_ids, logits = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        n = b.n_tokens
        first = n + len(tokens) - n_logits
        for i, tok in enumerate(tokens):
            token[n] = tok
            positions[n] = pos + i
            n_seq_id[n] = 1
            seq_ids[n][0] = seq_id
            logits[n] = n >= first
            n += 1
        b.n_tokens = n
        return first if n_logits else -1

    def free(self) -> None:
        lc.llama_batch_free(self.raw)
