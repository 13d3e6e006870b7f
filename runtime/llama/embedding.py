"""The embeddings context: one pooled vector per sequence instead of logits."""

from __future__ import annotations

import llama_cpp as lc
import numpy as np

from llmctl.errors import DecodeError, LlmctlError
from llmctl.runtime.llama.handle import ContextHandle
from llmctl.runtime.llama.model import POOLING, LlamaModel


class EmbeddingContext(ContextHandle):
    """A llama_context that outputs one pooled vector per sequence instead of
    logits. It is not the generation engine's context: that one is made
    without embeddings output (llama.cpp sets it per context, and turning it
    on there would make every generation step copy hidden states too), keeps
    one KV stream per slot and is driven by the engine's own thread.

    A batch holds up to n_seq_max sequences and n_tokens tokens in all, in
    one graph run (n_ubatch = n_batch): llama.cpp pools each sequence within
    a ubatch, so a sequence split across two would get the second part's
    pool only. The KV is scratch, cleared before each batch.

    Raises ValueError when n_tokens is not a multiple of n_seq_max (llama.cpp
    sizes its graph for n_tokens / n_seq_max tokens a sequence, and mean
    pooling over a remainder aborts the process), and LlmctlError when
    llama.cpp cannot make the context."""

    def __init__(self, model: LlamaModel, *, n_tokens: int, n_seq_max: int, n_threads: int,
                 pooling: str):
        if n_tokens % n_seq_max:
            raise ValueError(f"n_tokens {n_tokens} is not a multiple of n_seq_max {n_seq_max}")
        self.n_tokens, self.n_seq_max, self.pooling = n_tokens, n_seq_max, pooling
        params = lc.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_tokens
        params.n_seq_max = n_seq_max
        params.n_threads = params.n_threads_batch = n_threads
        params.embeddings = True
        params.pooling_type = POOLING[pooling]
        # One shared KV of n_tokens cells: a batch is one long text or many short ones.
        params.kv_unified = True
        params.no_perf = True
        super().__init__(model, params, n_batch=n_tokens, hint="not enough memory for embeddings")

    def embed(self, seqs: list[list[int]]) -> np.ndarray:
        """The pooled, unnormalised vectors of `seqs` (at most n_seq_max, with
        n_tokens tokens in all), one (n_embd,) float32 row each. Raises
        DecodeError, LlmctlError once the model is closed, and ValueError
        for more than n_tokens tokens."""
        if not self.ptr:
            raise LlmctlError("the model was unloaded")
        if self.mem:
            lc.llama_memory_clear(self.mem, True)
        b = self._batch
        b.clear()
        for seq_id, tokens in enumerate(seqs):
            b.add(seq_id, tokens, 0, len(tokens))     # pooling reads every token's output
        rc = lc.llama_decode(self.ptr, b.raw)
        if rc != 0:
            raise DecodeError(f"llama_decode failed (code {rc}) computing embeddings")
        out = np.empty((len(seqs), self.model.n_embd), dtype=np.float32)
        for seq_id in range(len(seqs)):
            ptr = lc.llama_get_embeddings_seq(self.ptr, seq_id)
            out[seq_id] = np.ctypeslib.as_array(ptr, shape=(self.model.n_embd,))
        return out
