"""The sampler chain: one llama.cpp chain per sequence (logit bias,
penalties, then greedy or top-k/top-p/min-p/temperature/seed), with the
grammar checked on the chosen token, and the checks a request's sampling
parameters need the model for. A chain llama.cpp can run inside its graph
may be attached to the context (backend sampling): then only the chosen
token is copied back, instead of every logit of the vocabulary."""

from __future__ import annotations

import ctypes
from typing import Sequence

import llama_cpp as lc
import numpy as np

from llmctl.errors import InvalidParams, LlmctlError
from llmctl.runtime.llama.context import LlamaContext
from llmctl.runtime.llama.grammar_budget import GrammarBudget
from llmctl.runtime.llama.grammar_sampler import Grammar, validate_grammar
from llmctl.runtime.llama.model import LlamaModel
from llmctl.runtime.sampling import SamplingParams

# llama_token_data as numpy lays it out, to fill a candidate array in one copy.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def backend_eligible(params: SamplingParams) -> bool:
    """Whether llama.cpp can run this request's whole chain inside the
    graph (logit biases, top-k, top-p, min-p, temperature, a seeded draw or
    greedy), so that only its token leaves the device. Not with a grammar
    (checked on the host), penalties (their history lives on the host) or
    log-probabilities (they read the raw logits, which llama.cpp then no
    longer copies)."""
    return params.grammar is None and params.logprobs is None and not (
        params.repeat_penalty != 1.0 or params.frequency_penalty or params.presence_penalty)


def validate_sampling(model: LlamaModel, params: SamplingParams) -> None:
    """Everything about `params` that needs the model: logit_bias token ids
    and the grammar. Raises InvalidParams."""
    _check_bias_ids(model, params)
    if params.grammar is not None:
        validate_grammar(model, params.grammar)


def _check_bias_ids(model: LlamaModel, params: SamplingParams) -> None:
    # An id past the vocabulary would index past llama.cpp's candidate array.
    bad = [t for t, _ in params.logit_bias if t >= model.n_vocab]
    if bad:
        raise InvalidParams(f"logit_bias token ids {bad[:5]} are outside the vocabulary "
                            f"(0..{model.n_vocab - 1})", param="logit_bias")


class Sampler:
    """One llama.cpp sampler chain per sequence: penalties and the seed's RNG
    state are per-stream, so streams in one batch never disturb each other.

    With a grammar, a step samples from the chain first and checks only the
    chosen token against the grammar (llama.cpp's common_sampler does the
    same): applying a grammar to every candidate costs far more than a
    decode step. Only a rejected token makes it filter all candidates and
    sample again. Raises InvalidParams for a bad grammar or logit_bias id.

    `budget` bounds the grammar's work per token and per request; a request
    past it fails with InvalidParams from `sample`."""

    def __init__(self, model: LlamaModel, params: SamplingParams, seed: int,
                 budget: GrammarBudget | None = None):
        self.model = model
        self.grammar: Grammar | None = None
        self.ptr = None
        self._attached: tuple[LlamaContext, int] | None = None
        _check_bias_ids(model, params)
        self.ptr = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        try:
            self._build_chain(model, params, seed)
            if params.grammar is not None:
                self.grammar = Grammar(model, params.grammar, params.grammar_triggers,
                                        budget or GrammarBudget())
                self._cand = np.zeros(model.n_vocab, dtype=_TOKEN_DATA)
                self._ids = np.arange(model.n_vocab, dtype=np.int32)
        except BaseException:
            self.close()
            raise

    def _build_chain(self, model: LlamaModel, params: SamplingParams, seed: int) -> None:
        add = lambda s: lc.llama_sampler_chain_add(self.ptr, s)  # noqa: E731
        if params.ignore_eos and model.eog_tokens:
            add(_logit_bias(model, [(tok, float("-inf")) for tok in model.eog_tokens]))
        if params.logit_bias:
            add(_logit_bias(model, params.logit_bias))
        # Only the penalties remember accepted tokens: without them a rejected
        # token may be accepted into the chain and nothing changes.
        self._stateless = not (params.repeat_penalty != 1.0 or params.frequency_penalty
                               or params.presence_penalty)
        if not self._stateless:
            # llama.cpp sizes a ring buffer by the window: no window is longer
            # than the model's context, whatever a caller validated it against.
            window = min(params.repeat_last_n, model.n_ctx_train or params.repeat_last_n)
            add(lc.llama_sampler_init_penalties(
                model.n_vocab, window, params.repeat_penalty,
                params.frequency_penalty, params.presence_penalty))
        if params.greedy:
            add(lc.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(lc.llama_sampler_init_top_k(params.top_k))
            add(lc.llama_sampler_init_top_p(params.top_p, 1))
            add(lc.llama_sampler_init_min_p(params.min_p, 1))
            add(lc.llama_sampler_init_temp(params.temperature))
            add(lc.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, ctx: LlamaContext, row: int) -> int:
        """The next token, accepted into the chain's (and grammar's) state.
        Raises LlmctlError when the grammar allows no token, and
        InvalidParams (param "response_format") when constraining it passed
        the grammar budget or would pass it at the next token."""
        g = self.grammar
        if g is not None:
            g.clock.start_token()
        if g is None or self._stateless:
            # llama_sampler_sample also accepts the token into the chain's state.
            token = lc.llama_sampler_sample(self.ptr, ctx.ptr, row)
            if g is None:
                return token
        else:
            cur = self._candidates(ctx, row)
            lc.llama_sampler_apply(self.ptr, ctypes.byref(cur))
            token = cur.data[cur.selected].id
        if g.active and not g.allows(token):
            cur = self._candidates(ctx, row)
            g.apply(cur)
            lc.llama_sampler_apply(self.ptr, ctypes.byref(cur))
            chosen = cur.data[cur.selected]
            if chosen.logit == float("-inf"):
                raise LlmctlError("the grammar allows no token here")
            token = chosen.id
        if g.active:
            g.accept(token)
        if not self._stateless:
            lc.llama_sampler_accept(self.ptr, token)
        if not g.active:
            g.watch(token)
        return token

    def _candidates(self, ctx: LlamaContext, row: int) -> lc.llama_token_data_array:
        """Every token with its logit, as llama_sampler_sample builds them."""
        n = self.model.n_vocab
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx.ptr, row), shape=(n,))
        self._cand["id"] = self._ids
        self._cand["logit"] = logits
        self._cand["p"] = 0.0
        data = self._cand.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        return lc.llama_token_data_array(data, n, -1, False)

    def attach(self, ctx: LlamaContext, seq_id: int) -> bool:
        """Run this chain inside `ctx`'s graph for sequence `seq_id` (backend
        sampling): `sample` then reads the token llama.cpp chose. Only for
        a chain backend_eligible allows, attached once, before its first
        sample. Returns whether llama.cpp took it (a chain it cannot
        offload stays on the host, unchanged)."""
        if self._attached is not None or not self.ptr:
            raise ValueError("a sampler chain is attached at most once")
        if not lc.llama_set_sampler(ctx.ptr, seq_id, self.ptr):
            return False
        self._attached = (ctx, seq_id)
        return True

    @property
    def on_backend(self) -> bool:
        return self._attached is not None

    def close(self) -> None:
        if self._attached is not None:
            # Detached before it is freed: the context keeps only a pointer.
            ctx, seq_id = self._attached
            self._attached = None
            if ctx.ptr:
                lc.llama_set_sampler(ctx.ptr, seq_id, None)
        if self.grammar is not None:
            self.grammar.close()
        if getattr(self, "ptr", None):
            lc.llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


def _logit_bias(model: LlamaModel, pairs: Sequence[tuple[int, float]]) -> lc.llama_sampler_p:
    biases = (lc.llama_logit_bias * len(pairs))()
    for i, (tok, bias) in enumerate(pairs):
        biases[i] = lc.llama_logit_bias(tok, bias)
    return lc.llama_sampler_init_logit_bias(model.n_vocab, len(pairs), biases)
