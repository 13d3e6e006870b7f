"""Draft-model speculation (`--draft MODEL`): a small model with the target's
tokenizer guesses each speculating sequence's next tokens, and the target
checks every sequence's guesses in its one batched decode (engine/loop.py).

The draft runs in its own llama_context with one KV stream per target slot.
It remembers which tokens each slot's KV holds, so a step feeds it only
what it has not seen: the prompt once, then the tokens the target accepted
since. Its guesses are its greedy choices, cut short where it is unsure
(top probability under `p_min`, as llama-server's --draft-p-min): a guess
the target will likely reject costs a row of target compute for nothing.

Guesses never change the output: the engine keeps one only where the
target's own sampler picks the same token (proposer.py), so a draft that
is wrong, slow or failing only costs speed."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from llmctl.errors import DecodeError, UsageError
from llmctl.runtime.llama import ContextConfig, LlamaContext, LlamaModel
from llmctl.runtime.prefix_cache.rule import usable_prefix
from llmctl.runtime.speculation.proposer import NO_GUESS, Guess, Want
from llmctl.runtime.speculation.spec_config import DRAFT_MIN, P_MIN

log = logging.getLogger("llmctl.draft")

# Tokens compared between the two vocabularies: every special one and an
# even spread of the rest. Tokenizers that differ (another merge table or
# id order) differ nearly everywhere, and a sample keeps the check short
# where comparing every piece of a large vocabulary is slow at load.
_VOCAB_SAMPLE = 4096
# A sequence with few tokens left is not worth catching the draft up on a
# long prompt for (a sequence that becomes one of the last two decoding
# in a full batch, say): see Drafter.worth.
CATCH_UP_PER_TOKEN = 8
# A Want with its tokens copied into a list, as the draft's KV bookkeeping keeps them.
_Want = tuple[int, list[int], int]


def check_compatible(target: LlamaModel, draft: LlamaModel, names: tuple[str, str]) -> None:
    """Refuse a draft whose tokens mean something else than the target's:
    its guesses would be token ids of another vocabulary. Raises
    UsageError naming the first difference."""
    t_name, d_name = names
    why = None
    if target.n_vocab != draft.n_vocab:
        why = f"vocabularies of {target.n_vocab:,} and {draft.n_vocab:,} tokens"
    elif (target.bos, target.eos, target.add_bos) != (draft.bos, draft.eos, draft.add_bos):
        why = "different BOS/EOS tokens"
    else:
        step = max(1, target.n_vocab // _VOCAB_SAMPLE)
        ids = sorted(set(range(0, target.n_vocab, step)) | set(target.eog_tokens)
                     | set(draft.eog_tokens))
        for tok in ids:
            a, b = target.piece(tok, special=True), draft.piece(tok, special=True)
            if a != b:
                why = f"token {tok} is {a!r} in {t_name} and {b!r} in {d_name}"
                break
    if why:
        raise UsageError(f"draft model {d_name!r} does not share {t_name!r}'s tokenizer ({why}); "
                         "pick a draft from the same model family")


class Drafter:
    """The Proposer of a draft model: guesses for many sequences at once,
    one draft decode per guessed position; fewer than `draft_min` guesses
    are none. Raises what LlamaContext raises when its context cannot be
    made; `propose` never raises (a failed draft decode means no guesses)."""

    def __init__(self, model: LlamaModel, cfg: ContextConfig, p_min: float = P_MIN,
                 draft_min: int = DRAFT_MIN):
        self.ctx = LlamaContext(model, cfg)
        self.n_batch = cfg.n_batch
        self.p_min = p_min
        self.draft_min = draft_min
        self._have: dict[int, list[int]] = {}   # slot -> tokens in its draft KV

    def worth(self, slot: int, tokens: Sequence[int], remaining: int) -> bool:
        """Whether drafting for this sequence can pay: what the draft must
        first catch up on (its whole prompt, the first time) runs as a
        prefill at several times its decode rate, so it must not exceed
        CATCH_UP_PER_TOKEN tokens per token left to generate."""
        lacking = len(tokens) - usable_prefix(self._have.get(slot, []), list(tokens))
        return lacking <= CATCH_UP_PER_TOKEN * remaining

    def propose(self, asked: list[Want]) -> list[Guess]:
        """For each (slot, tokens so far, k): up to k guessed next tokens."""
        wants = [(slot, list(tokens), k) for slot, tokens, k in asked]
        guesses: list[list[int]] = [[] for _ in wants]
        try:
            live = self._catch_up(wants, guesses)
            while live:
                live = self._extend(wants, guesses, live)
        except DecodeError as e:
            log.warning("draft model decode failed, no guesses this step: %s", e)
            for slot, _, _ in wants:
                self._forget(slot)
            return [NO_GUESS for _ in wants]
        for (slot, tokens, _), g in zip(wants, guesses, strict=False):
            # Its last guess was never fed back: the KV ends just before it.
            self._have[slot] = tokens + g[:-1]
        return [Guess(g) if len(g) >= self.draft_min else NO_GUESS for g in guesses]

    def _catch_up(self, wants: list[_Want], guesses: list[list[int]]) -> list[int]:
        """Feed each slot what its draft KV lacks (the whole prompt the first
        time), chunked to the batch size; guess once from each last row.
        Returns the items that may guess further."""
        todo = []
        for i, (slot, tokens, _) in enumerate(wants):
            n = usable_prefix(self._have.get(slot, []), tokens)
            self.ctx.seq_rm(slot, n, -1)
            todo.append((i, slot, n))
        live = []
        while todo:
            items, left, budget = [], [], self.n_batch
            for i, slot, pos in todo:
                tokens = wants[i][1]
                take = min(len(tokens) - pos, budget)
                if take <= 0:
                    left.append((i, slot, pos))
                    continue
                budget -= take
                last = pos + take == len(tokens)
                items.append((i, slot, tokens[pos:pos + take], pos, last))
                if not last:
                    left.append((i, slot, pos + take))
            rows = self.ctx.decode([(slot, chunk, pos, int(last)) for _, slot, chunk, pos, last in items])
            for (i, _, _, _, last), row in zip(items, rows, strict=False):
                if last and self._guess(guesses[i], row) and wants[i][2] > 1:
                    live.append(i)
            todo = left
        return live

    def _extend(self, wants: list[_Want], guesses: list[list[int]], live: list[int]) -> list[int]:
        """One more guess for each live item: feed its latest guess."""
        items = [(wants[i][0], [guesses[i][-1]], len(wants[i][1]) + len(guesses[i]) - 1, 1)
                 for i in live]
        rows = self.ctx.decode(items)
        return [i for i, row in zip(live, rows, strict=False)
                if self._guess(guesses[i], row) and len(guesses[i]) < wants[i][2]]

    def _guess(self, out: list[int], row: int) -> bool:
        """Append the draft's greedy token when it is sure enough; whether it was."""
        logits = self.ctx.logits(row)
        tok = int(np.argmax(logits))
        # The top token's softmax probability, without normalising the rest.
        p_top = 1.0 / float(np.exp(logits - logits[tok]).sum())
        if p_top < self.p_min:
            return False
        out.append(tok)
        return True

    def _forget(self, slot: int) -> None:
        self.ctx.seq_rm(slot)
        self._have.pop(slot, None)

    def close(self) -> None:
        self.ctx.close()

