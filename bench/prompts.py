"""Prompts of exact token counts, unique per request and per run so that no
server's prefix cache flatters it, unless a shared prefix is asked for."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from llmctl.bench.tokenizers import Tokenizer

# Short, common words: one token each in most vocabularies, which keeps the
# approximate tokenizer honest and the exact one quick to converge.
WORDS = """the of and to in is was for on that with as by at from his her they
this had not are but have one all were we when your can said there each which
she do how their will up other about out many then them these so some would
make like him into time has look two more write go see number no way could
people my than first water been call who oil its now find long down day did get
come made may part over new sound take only little work know place year live me
back give most very after thing our just name good sentence man think say great
where help through much before line right too mean old any same tell boy follow
came want show also around form three small set put end does another well large
must big even such because turn here why ask went men read need land different
home us move try kind hand picture again change off play spell air away animal
house point page letter mother answer found study still learn should world high
every near add food between own below country plant last school father keep tree
never start city earth eye light thought head under story saw left few while
along might close something seem next hard open example begin life always those
both paper together got group often run important until children side feet car
mile night walk white sea began grow took river four carry state once book hear
stop without second later miss idea enough eat face watch far real almost let
above girl sometimes mountain cut young talk soon list song being leave family""".split()

# Refinement rounds before settling for the closest count; in practice one or
# two suffice, since decode/encode round-trips only shift at the cut.
MAX_ROUNDS = 8


@dataclass
class Prompt:
    text: str
    tokens: int   # as counted by the tokenizer, special tokens included


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def fit(tok: Tokenizer, text: str, n_tokens: int, rng: random.Random) -> Prompt:
    """Cut `text` (extended with random words if short) to `n_tokens`."""
    ids = tok.encode(text)
    while len(ids) < n_tokens:
        text += " " + _words(rng, n_tokens - len(ids) + 8)
        ids = tok.encode(text)
    best, k = Prompt(text, len(ids)), n_tokens
    for _ in range(MAX_ROUNDS):
        candidate = tok.decode(ids[tok.bos:k])
        count = len(tok.encode(candidate))
        if abs(count - n_tokens) < abs(best.tokens - n_tokens):
            best = Prompt(candidate, count)
        if count == n_tokens:
            break
        k = max(tok.bos + 1, min(len(ids), k + n_tokens - count))
    return best


def build_prompts(tok: Tokenizer, n: int, n_tokens: int, shared_prefix: int,
                  seed: int) -> list[Prompt]:
    """`n` prompts of `n_tokens` each. All share their first `shared_prefix`
    tokens (a common document); everything after starts with a per-request
    nonce, so no two prompts, in this run or another, share more."""
    shared = ""
    if shared_prefix:
        rng = random.Random(seed)
        # Then a space: word-initial spaces start a new token in BPE and
        # SentencePiece vocabularies alike, so the boundary does not merge.
        shared = fit(tok, _words(rng, shared_prefix), shared_prefix, rng).text + " "

    def one(i: int) -> Prompt:
        rng = random.Random(f"{seed}-{i}")
        # Random from the first token: a fixed word first would be a shared prefix.
        nonce = f"{rng.getrandbits(48):012x}-{i}:"
        return fit(tok, shared + nonce + " " + _words(rng, n_tokens), n_tokens, rng)

    if tok.kind != "server":
        return [one(i) for i in range(n)]
    # A server tokenizer costs a round trip per call; overlap them.
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, range(n)))
