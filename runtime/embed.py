"""Embeddings of a loaded LLM: one L2-normalised vector per input text,
pooled as the GGUF declares (mean pooling for decoder models, which declare
nothing), several inputs per llama_decode.

The vectors come from a second llama_context on the same weights, made on
first use and kept while the LLM lives: the generation engine's context
has no embeddings output and belongs to the engine's thread. Calls from
many threads take turns on it one batch at a time, first come first served,
so a small request waits for one batch of a large one, not for all of it.

A request stops between batches once its CancelFlag is set (the server sets
it when the client hangs up), and one request embeds at most
LLMCTL_EMBED_MAX_TOKENS tokens (65,536 unless set): without a bound, one
request of many long inputs keeps a core busy for many minutes."""

from __future__ import annotations

import threading
import weakref

import numpy as np

from llmctl.errors import ContextOverflow, InvalidParams, LlmctlError
from llmctl.runtime.llama import EmbeddingContext, LlamaModel
from llmctl.runtime.llm import LLM, MAX_CHARS_PER_TOKEN
from llmctl.runtime.system import default_threads

MAX_INPUTS = 256        # per request, as a bound on one request's work
MAX_SEQS = 16           # inputs per llama_decode
MAX_TOKENS = 2048       # per llama_decode, and so the longest input
MIN_TOKENS = 512
# llama.cpp still runs the output layer over every token of an embeddings
# batch: its compute buffer holds n_tokens x n_vocab floats. This bounds it
# (a 262k vocabulary gets MIN_TOKENS, a 49k one about 1,300).
LOGITS_BUDGET = 256 << 20

# One per LLM, dropped with it; the LLM's close frees the context first.
_embedders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_embedders_lock = threading.Lock()


def batch_tokens(model: LlamaModel) -> int:
    """Tokens per llama_decode of embeddings: the longest input there is."""
    fit = max(MIN_TOKENS, min(MAX_TOKENS, LOGITS_BUDGET // (4 * model.n_vocab)))
    fit = min(fit, model.n_ctx_train or fit)
    # A multiple of MAX_SEQS, as EmbeddingContext needs.
    return max(fit // 256 * 256, MAX_SEQS)


def pooling_for(model: LlamaModel) -> str:
    """How a sequence's token vectors become one: the GGUF's pooling type
    when it declares mean, cls or last, else mean. A declared "none" means
    per-token vectors, and a request wants one per input, so it gets mean
    too. Raises InvalidParams (param "model") for a reranker or an
    encoder-decoder model."""
    if model.encoder_decoder:
        raise InvalidParams("embeddings from encoder-decoder models are not supported",
                            param="model")
    declared = model.declared_pooling()
    if declared == "rank":
        raise InvalidParams("this model is a reranker: its pooling gives scores, not "
                            "embeddings", param="model")
    return declared if declared in ("mean", "cls", "last") else "mean"


class Cancelled(LlmctlError):
    """An embeddings request stopped because its client left (HTTP 499:
    nobody reads the answer)."""

    http_status = 499
    code = "cancelled"


class CancelFlag:
    """Set once a request's client is gone. `close` sets it, so the server's
    cancel_on_disconnect treats it as it treats a generation stream."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def close(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


class _FairLock:
    """A lock handed over in arrival order. threading.Lock lets the thread
    that releases it take it straight back, so a large request running batch
    after batch would starve a small one waiting between them."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._issued = 0        # tickets handed out
        self._serving = 0       # the ticket that may run

    def __enter__(self) -> None:
        with self._cv:
            ticket = self._issued
            self._issued += 1
            while ticket != self._serving:
                self._cv.wait()

    def __exit__(self, *exc) -> None:
        with self._cv:
            self._serving += 1
            self._cv.notify_all()


class Embedder:
    """An LLM's embeddings context and the lock that serialises its use, a
    batch at a time. Raises what pooling_for raises, and LlmctlError when
    llama.cpp cannot make the context."""

    def __init__(self, llm: LLM):
        # Holds the model, never the LLM: the registry's value must not keep its key alive.
        self.model = llm.model
        self.n_tokens = batch_tokens(self.model)
        # Tokens one request may embed (the settings' embed_max_tokens).
        self.max_request_tokens = llm.opts.settings.embed_max_tokens
        self.ctx = EmbeddingContext(self.model, n_tokens=self.n_tokens, n_seq_max=MAX_SEQS,
                                    n_threads=llm.opts.threads or default_threads(),
                                    pooling=pooling_for(self.model))
        self._turns = _FairLock()
        # The model's one stats source: embeddings count beside generation.
        self.stats = llm.engine.scheduler.collector

    def run(self, seqs: list[list[int]], cancel: CancelFlag | None = None) -> np.ndarray:
        """Unit vectors of `seqs` (each at most n_tokens long), one row each,
        in order. Raises Cancelled between batches once `cancel` is set,
        DecodeError, and LlmctlError once the model is gone."""
        rows = []
        for batch in _batches(seqs, self.n_tokens):
            with self._turns:
                # Checked once its turn comes: the client may have left while it waited.
                if cancel is not None and cancel.cancelled:
                    raise Cancelled("the client closed the connection")
                rows.append(self.ctx.embed(batch))
            self.stats.record_embed_tokens(sum(map(len, batch)))
        return _normalised(np.vstack(rows))


def _batches(seqs: list[list[int]], n_tokens: int):
    """Runs of consecutive sequences that fit one llama_decode."""
    batch: list[list[int]] = []
    used = 0
    for seq in seqs:
        if batch and (len(batch) == MAX_SEQS or used + len(seq) > n_tokens):
            yield batch
            batch, used = [], 0
        batch.append(seq)
        used += len(seq)
    if batch:
        yield batch


def _normalised(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, np.finfo(np.float32).tiny)


def embedder(llm: LLM) -> Embedder:
    """`llm`'s Embedder, made on first use. Raises LlmctlError once the LLM
    is closed, and what Embedder raises."""
    if not llm.model.ptr:
        # Its vocabulary is freed too: tokenizing now would crash.
        raise LlmctlError("the model was unloaded")
    with _embedders_lock:
        found = _embedders.get(llm)
        if found is None:
            found = _embedders[llm] = Embedder(llm)
        return found


def embed_texts(llm: LLM, texts: list[str], *, truncate: bool = True,
                dimensions: int | None = None,
                cancel: CancelFlag | None = None) -> tuple[list[list[float]], int]:
    """L2-normalised embeddings of `texts`, in order, and the number of
    tokens embedded. A text longer than the longest input is cut to fit
    (keeping its start) with `truncate`, else refused.

    `dimensions` keeps the first N components and normalises again, the way
    Matryoshka-trained embedding models are shortened; for other models the
    shortened vector is a cruder one, but still unit-length.

    Raises InvalidParams (param "input" or "dimensions") for an empty list,
    more than MAX_INPUTS texts, a non-string or empty text, more than
    the settings' embed_max_tokens in all, or dimensions outside 1..n_embd;
    ContextOverflow (param "input") for a text too long when not truncating;
    Cancelled once `cancel` is set; what embedder() raises; DecodeError."""
    _check_list(texts)
    for text in texts:
        if not isinstance(text, str):
            raise InvalidParams("every 'input' item must be a string", param="input")
        if not text:
            raise InvalidParams("'input' holds an empty string", param="input")
    emb = embedder(llm)
    # A text of more characters than this has more tokens than fit; cutting
    # it first spares tokenizing megabytes only to drop them.
    cap = emb.n_tokens * MAX_CHARS_PER_TOKEN
    seqs = [llm.tokenize(t[:cap], add_special=True, parse_special=False) for t in texts]
    return _embed(emb, seqs, truncate, dimensions, cancel)


def embed_tokens(llm: LLM, seqs: list[list[int]], *, truncate: bool = True,
                 dimensions: int | None = None,
                 cancel: CancelFlag | None = None) -> tuple[list[list[float]], int]:
    """embed_texts for inputs given as token ids. Raises what embed_texts
    raises, and InvalidParams (param "input") for an empty token list or an
    id outside the vocabulary."""
    _check_list(seqs)
    n_vocab = llm.n_vocab
    for seq in seqs:
        if not seq:
            raise InvalidParams("'input' holds an empty token array", param="input")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab
                   for t in seq):
            raise InvalidParams(f"'input' token ids must be integers in 0..{n_vocab - 1}",
                                param="input")
    return _embed(embedder(llm), [list(s) for s in seqs], truncate, dimensions, cancel)


def _check_list(items) -> None:
    if not isinstance(items, list) or not items:
        raise InvalidParams("'input' must be a non-empty list", param="input")
    if len(items) > MAX_INPUTS:
        raise InvalidParams(f"'input' has {len(items)} items; at most {MAX_INPUTS} are allowed",
                            param="input")


def _embed(emb: Embedder, seqs: list[list[int]], truncate: bool, dimensions: int | None,
           cancel: CancelFlag | None) -> tuple[list[list[float]], int]:
    n_embd = emb.model.n_embd
    if dimensions is not None and not (isinstance(dimensions, int)
                                       and not isinstance(dimensions, bool)
                                       and 1 <= dimensions <= n_embd):
        raise InvalidParams(f"'dimensions' must be an integer in 1..{n_embd} for this model",
                            param="dimensions")
    longest = max(map(len, seqs))
    if longest > emb.n_tokens and not truncate:
        raise ContextOverflow(f"an input is longer than the {emb.n_tokens} tokens that fit "
                              "(allow truncation to cut it)", param="input")
    seqs = [s[:emb.n_tokens] for s in seqs]
    total, cap = sum(map(len, seqs)), emb.max_request_tokens
    if total > cap:
        raise InvalidParams(f"'input' has {total:,} tokens; one request may embed at most "
                            f"{cap:,}", param="input")
    try:
        vectors = emb.run(seqs, cancel)
    except Cancelled:
        emb.stats.record_embed_request("cancelled")
        raise
    except BaseException:
        emb.stats.record_embed_request("error")
        raise
    emb.stats.record_embed_request("ok")
    if dimensions is not None:
        vectors = _normalised(vectors[:, :dimensions])
    return vectors.tolist(), total
