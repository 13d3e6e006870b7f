"""Log-probabilities of sampled tokens, for OpenAI's `logprobs`.

They are taken from the model's raw distribution (a log-softmax over the
logits, before temperature, penalties, logit_bias or a grammar), as
llama-server reports them: the figure says what the model believed, not
how the sampler was steered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Alternative:
    """One token with its log-probability."""

    token: int
    text: str
    bytes: bytes
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The sampled token, and the `top` most likely tokens at its step,
    most likely first."""

    chosen: Alternative
    top: tuple[Alternative, ...]


def token_logprob(logits: np.ndarray, token: int, n_top: int,
                  piece: Callable[[int], bytes]) -> TokenLogprob:
    """The log-probability of `token` under `logits` (one row of the
    vocabulary) and its `n_top` best alternatives; `piece` gives a token's
    bytes. Raises IndexError for a token outside the row."""
    row = logits.astype(np.float64, copy=False)
    peak = float(row.max())
    log_z = peak + float(np.log(np.exp(row - peak).sum()))

    def alt(tok: int) -> Alternative:
        raw = piece(tok)
        return Alternative(tok, raw.decode("utf-8", errors="replace"), raw,
                           float(row[tok]) - log_z)

    top: tuple[Alternative, ...] = ()
    if n_top > 0:
        n_top = min(n_top, row.shape[0])
        best = np.argpartition(-row, n_top - 1)[:n_top]
        # Ties go to the lower id, so the order is the same on every run.
        order = sorted(best.tolist(), key=lambda t: (-row[t], t))
        top = tuple(alt(t) for t in order)
    return TokenLogprob(alt(int(token)), top)
