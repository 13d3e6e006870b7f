"""Perplexity the way llama.cpp's `llama-perplexity` measures it: the text is
tokenized once, cut into windows of `ctx` tokens (512 by default), and each
window is scored on its second half only, so every scored token has at least
ctx/2 tokens of context. The figures are therefore comparable with llama.cpp's.

All llama.cpp calls for evaluation live in this module."""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from llmctl.errors import BadModelFile, UsageError
from llmctl.quantize.llama_log import capture_llama_log

DEFAULT_CTX = 512


@dataclass
class PerplexityResult:
    model: str
    perplexity: float
    stderr: float          # ± of the estimate, as llama.cpp prints it
    chunks: int
    ctx: int
    tokens_scored: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


class _Llama:
    """A model and a one-sequence context sized for one window."""

    def __init__(self, path: Path, ctx: int, threads: int):
        import llama_cpp as L

        self.L = L
        L.llama_backend_init()
        with capture_llama_log() as log:
            mparams = L.llama_model_default_params()
            self.model = L.llama_model_load_from_file(str(path).encode(), mparams)
            if not self.model:
                raise BadModelFile(f"{path}: llama.cpp cannot load it "
                                   f"({log.last_error('unsupported or corrupt model')})")
            cparams = L.llama_context_default_params()
            cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = ctx
            cparams.n_seq_max = 1
            cparams.n_threads = cparams.n_threads_batch = threads
            self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise BadModelFile(f"{path}: cannot create a context of {ctx} tokens")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        buf = (self.L.llama_token * (len(data) + 16))()
        # add_special=True: the same BOS handling as llama-perplexity.
        n = self.L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), True, False)
        if n < 0:
            raise UsageError("text could not be tokenized")
        return list(buf[:n])

    def close(self) -> None:
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def _window_nll(llm: _Llama, batch, window: list[int], first: int) -> np.ndarray:
    """Negative log-likelihoods of window[first+1:], one decode call."""
    L = llm.L
    n = len(window)
    L.llama_memory_clear(L.llama_get_memory(llm.ctx), True)
    batch.n_tokens = n
    for k, token in enumerate(window):
        batch.token[k] = token
        batch.pos[k] = k
        batch.n_seq_id[k] = 1
        batch.seq_id[k][0] = 0
        batch.logits[k] = k >= first
    if L.llama_decode(llm.ctx, batch) != 0:
        raise BadModelFile("llama.cpp failed to evaluate a window")
    ptr = L.llama_get_logits_ith(llm.ctx, first)
    logits = np.ctypeslib.as_array(ptr, shape=(n - first, llm.n_vocab))[:-1]
    targets = np.asarray(window[first + 1:])
    peak = logits.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(logits - peak).sum(axis=1, dtype=np.float64)) + peak[:, 0]
    return log_z - logits[np.arange(len(targets)), targets]


def perplexity(model: str | Path, text: str, *, ctx: int = DEFAULT_CTX,
               threads: int | None = None, max_chunks: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> PerplexityResult:
    """Perplexity of the GGUF file `model` on `text`."""
    if ctx < 16 or ctx % 2:
        raise UsageError("--ctx must be an even number of at least 16", param="ctx")
    path = Path(model)
    started = time.perf_counter()
    llm = _Llama(path, ctx, threads or os.cpu_count() or 1)
    try:
        tokens = llm.tokenize(text)
        if len(tokens) < 2 * ctx:
            raise UsageError(f"the text has {len(tokens)} tokens; perplexity with a "
                             f"{ctx}-token window needs at least {2 * ctx}")
        n_chunks = len(tokens) // ctx
        if max_chunks:
            n_chunks = min(n_chunks, max_chunks)
        add_bos = llm.L.llama_vocab_get_add_bos(llm.vocab)
        bos = llm.L.llama_vocab_bos(llm.vocab)
        first = ctx // 2
        batch = llm.L.llama_batch_init(ctx, 0, 1)
        nll = []
        try:
            with capture_llama_log():
                for i in range(n_chunks):
                    window = tokens[i * ctx:(i + 1) * ctx]
                    if add_bos:
                        window[0] = bos
                    nll.append(_window_nll(llm, batch, window, first))
                    if progress:
                        progress(i + 1, n_chunks)
        finally:
            llm.L.llama_batch_free(batch)
    finally:
        with capture_llama_log():     # teardown chatter belongs to llama.cpp's log
            llm.close()
    values = np.concatenate(nll)
    mean = float(values.mean())
    ppl = math.exp(mean)
    var = float((values ** 2).mean()) - mean * mean
    stderr = math.sqrt(var / (len(values) - 1)) * ppl if var > 0 and len(values) > 1 else 0.0
    return PerplexityResult(model=str(path), perplexity=ppl, stderr=stderr, chunks=n_chunks,
                            ctx=ctx, tokens_scored=len(values),
                            seconds=time.perf_counter() - started)
