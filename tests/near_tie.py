"""Comparing two greedy answers to the same request, computed in different
company (alone or batched, cold or from the prefix cache).

Where this machine computes a row the same alone and in a batch
(llmctl.runtime.llama.exactness measures it; the `exactness` fixture), the two
answers must be identical. Elsewhere their logits differ by rounding, so
the answers must agree up to the first near-tie: the first position where
they differ must be one where the reference run's top candidates were
within NEAR_TIE nats of each other, and the other answer's token must be
one of them. After that point they are different texts and only shapes,
counts and finish reasons can be compared (the callers do).

NEAR_TIE: a rounding difference of at most d in the log-probabilities of
two tokens moves the gap between them by at most 2d. Measured on the AVX2
EPYC (where rows are not exact with flash attention off), the largest
log-probability difference among a row's 10 likeliest tokens between the
row alone and in a batch is 0.29 (0.27 after 200 tokens; the largest raw
logit difference, 0.67, falls on unlikely tokens), so a rounding
flip has a gap under about 0.6 nats; the flip seen in test_ollama_api
(" This" against " The") had a gap of 0.019. 1.0 leaves room for
differences that compound over a few positions, and still fails an answer
that changes where the model was sure (gaps of several nats), which is what
a real bug (a wrong KV cell, a lost token) looks like.
tests/test_exactness.py fails on a machine whose measured difference is
ever NEAR_TIE / 2 or more, so the bound is revisited rather than stretched.
"""

from __future__ import annotations

from typing import Sequence

NEAR_TIE = 1.0          # nats; see the module docstring

# One position's candidates, most likely first: (token id or text, logprob).
Top = Sequence[tuple[object, float]]


def top_from_engine(logprobs) -> list[list[tuple[int, float]]]:
    """Candidates per position from a Completion's logprobs (TokenLogprob)."""
    return [[(a.token, a.logprob) for a in lp.top] for lp in logprobs]


def top_from_openai(content: list[dict]) -> list[list[tuple[str, float]]]:
    """Candidates per position from an OpenAI `logprobs.content` list."""
    return [[(t["token"], t["logprob"]) for t in c["top_logprobs"]] for c in content]


def _tie_at(i: int, ref: Sequence, ref_top: Sequence[Top], matches, bound: float) -> None:
    assert i < len(ref_top) and len(ref_top[i]) >= 2, (
        f"the answers part at token {i} and the reference has no candidates there to "
        f"show a near-tie (reference {list(ref)[:i + 1]!r})")
    best = ref_top[i][0][1]
    close = [tok for tok, lp in ref_top[i][1:] if best - lp < bound and matches(tok)]
    assert close, (f"the answers part at token {i}, where the reference was not at a near-tie "
                   f"(gap bound {bound} nats): candidates {list(ref_top[i])!r}, "
                   f"reference so far {list(ref)[:i + 1]!r}")


def assert_same_until_near_tie(ref: Sequence, other: Sequence | str, ref_top: Sequence[Top],
                               bound: float = NEAR_TIE) -> int | None:
    """Assert `other` equals the reference answer `ref` up to the first
    near-tie. `ref` is a list of token ids, or of token texts when `other`
    is a text; `ref_top` holds the reference's candidates per position
    (logprobs with top_logprobs >= 2). Return where they part (a token
    index of `ref`), or None when identical. Raises AssertionError."""
    if isinstance(other, str):
        return _text_until_near_tie(list(ref), other, ref_top, bound)
    ref, other = list(ref), list(other)
    i = next((k for k, (a, b) in enumerate(zip(ref, other, strict=False)) if a != b), None)
    if i is None:
        if len(ref) == len(other):
            return None
        i = min(len(ref), len(other))
        if i == len(other):       # other stopped here: an end-of-text token won the tie
            _tie_at(i, ref, ref_top, lambda tok: True, bound)
            return i
    _tie_at(i, ref, ref_top, lambda tok: tok == other[i], bound)
    return i


def _text_until_near_tie(ref: list[str], other: str, ref_top: Sequence[Top],
                         bound: float) -> int | None:
    pos = 0
    for i, piece in enumerate(ref):
        if other.startswith(piece, pos):
            pos += len(piece)
            continue
        rest = other[pos:]
        # The other answer's token is unknown; it must start like one of the close candidates
        # (or be the end of the text, when an end-of-text token won the tie).
        _tie_at(i, ref, ref_top, lambda tok, rest=rest: bool(tok) and rest.startswith(tok) or not rest,
                bound)
        return i
    if pos == len(other):
        return None
    rest = other[pos:]
    _tie_at(len(ref), ref, ref_top, lambda tok: bool(tok) and rest.startswith(tok), bound)
    return len(ref)


def assert_greedy_agree(exactness, ref: Sequence, other: Sequence | str,
                        ref_top: Sequence[Top] | None = None,
                        ref_text: str | None = None) -> int | None:
    """Identical where `exactness` (a RowExactness for the settings the two
    runs used) says rows are exact on this machine, else the same up to the
    first near-tie. With a text `other`, `ref_text` (default: the pieces
    joined) is what it must equal. Return where they part, None when
    identical. Raises AssertionError."""
    if exactness.exact:
        want = (ref_text if ref_text is not None else "".join(ref)) if isinstance(other, str) \
            else list(ref)
        got = other if isinstance(other, str) else list(other)
        assert got == want, "rows are exact on this machine, so the answers must be identical"
        return None
    assert ref_top is not None, "not exact here: the reference's logprobs are needed"
    return assert_same_until_near_tie(ref, other, ref_top)


def assert_completions_agree(exactness, ref, other) -> int | None:
    """Two engine Completions of one greedy request (run with logprobs >= 2):
    identical where rows are exact, else the same tokens up to the first
    near-tie; where no tie parted them, the same text, finish reason and
    token count too. Return where they part, None when identical. Raises
    AssertionError."""
    ids = [[lp.chosen.token for lp in c.logprobs] for c in (ref, other)]
    for c, got in zip((ref, other), ids, strict=False):
        # The end-of-text token (or a stop string's) is counted but has no logprob.
        n = c.usage.completion_tokens
        assert len(got) == n or c.finish_reason == "stop" and 0 < len(got) < n, \
            "run them with logprobs"
    part = assert_greedy_agree(exactness, ids[0], ids[1], top_from_engine(ref.logprobs))
    if part is None:
        assert (other.text, other.finish_reason) == (ref.text, ref.finish_reason)
    else:
        assert other.finish_reason in ("stop", "length")
    return part
