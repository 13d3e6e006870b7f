"""The generation context: the KV of up to n_seq_max sequences, one decode
per engine step, the logits it leaves, and the sequences' saved states."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

import llama_cpp as lc
import numpy as np

from llmctl.errors import DecodeError, LlmctlError, UsageError
from llmctl.runtime.batching import UBATCH_TOKENS
from llmctl.runtime.llama.handle import ContextHandle
from llmctl.runtime.llama.model import LlamaModel

# llmctl's KV-cache type names (store.gguf_info.KV_TYPES) as ggml types.
_KV_GGML_TYPES = {"f16": lc.GGML_TYPE_F16, "q8_0": lc.GGML_TYPE_Q8_0, "q4_0": lc.GGML_TYPE_Q4_0}
# One line per KV cache llama.cpp allocates (two for sliding-window models).
_KV_SIZE_RE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB")


def kv_ggml_type(name: str) -> int:
    """The ggml type of the KV-cache type `name`. Raises UsageError for a
    name llmctl does not offer."""
    try:
        return _KV_GGML_TYPES[name]
    except KeyError:
        raise UsageError(f"invalid kv_type {name!r}: use one of {', '.join(_KV_GGML_TYPES)}") from None


@dataclass(frozen=True)
class ContextConfig:
    """The shape of a generation context: tokens per sequence, sequences,
    batch sizes, threads, flash attention and the KV-cache type."""

    n_ctx_seq: int          # tokens each sequence may hold
    n_seq_max: int          # sequences decoded together
    n_batch: int            # most tokens in one llama_decode call
    n_threads: int
    flash_attn: bool = True
    n_ubatch: int | None = None     # tokens per graph run; None: min(n_batch, 512)
    kv_type: str = "f16"            # K and V cache element type
    # One KV for all sequences (n_ctx_seq cells in all), where a cell may
    # belong to several: splice.py needs it; the engine's contexts keep a
    # stream per sequence.
    kv_unified: bool = False


def _params(cfg: ContextConfig) -> lc.llama_context_params:
    """llama_context_params for `cfg`. Raises UsageError for an unknown kv_type."""
    params = lc.llama_context_default_params()
    params.n_ctx = cfg.n_ctx_seq * (1 if cfg.kv_unified else cfg.n_seq_max)
    params.n_batch = cfg.n_batch
    params.n_ubatch = cfg.n_ubatch or min(cfg.n_batch, UBATCH_TOKENS)
    params.n_seq_max = cfg.n_seq_max
    params.n_threads = params.n_threads_batch = cfg.n_threads
    params.type_k = params.type_v = kv_ggml_type(cfg.kv_type)
    # A quantized V is read only by the flash-attention kernel, so there
    # "on" must mean enabled, not llama.cpp's per-device auto choice.
    on = lc.LLAMA_FLASH_ATTN_TYPE_AUTO if cfg.kv_type == "f16" else lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
    params.flash_attn_type = on if cfg.flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    # Each sequence gets its own KV stream (see LlamaContext), unless asked.
    params.kv_unified = cfg.kv_unified
    params.no_perf = True
    return params


class LlamaContext(ContextHandle):
    """One llama_context holding the KV of up to n_seq_max sequences.

    Each sequence gets its own KV stream (kv_unified=False): attention then
    spans only that sequence's cells instead of one unified cache's every
    cell, which is faster at full batches (docs/measurements.md).

    Raises UsageError for an unknown kv_type and LlmctlError, with
    llama.cpp's reason, when the context cannot be made (out of memory, or
    a quantized V cache without flash attention)."""

    def __init__(self, model: LlamaModel, cfg: ContextConfig):
        self.cfg = cfg
        sizes: list[float] = []
        super().__init__(
            model, _params(cfg), n_batch=cfg.n_batch,
            hint="try a smaller --ctx-size or --max-num-seqs, or another --kv-type",
            on_text=lambda text: sizes.extend(map(float, _KV_SIZE_RE.findall(text))))
        # What llama.cpp allocated for K and V, from its own report.
        self.kv_bytes: int | None = round(sum(sizes) * (1 << 20)) if sizes else None
        self.n_ctx_seq = lc.llama_n_ctx_seq(self.ptr)

    def decode(self, items: list[tuple[int, list[int], int, int]]) -> list[int]:
        """Decode one batch. Each item is (seq_id, tokens, first_pos,
        n_logits): logits for its last n_logits tokens (speculation checks
        several; True is one). Returns, per item, the batch index of its
        first logits row, the others following it (-1 where none). Raises
        DecodeError, and ValueError for more tokens than n_batch."""
        b = self._batch
        b.clear()
        rows = [-1] * len(items)
        # With one KV stream per sequence, llama.cpp puts only runs of
        # consecutive, increasing seq ids into one ubatch; in admission order
        # a step could split into many small ubatches (one graph run each).
        for k in sorted(range(len(items)), key=lambda k: items[k][0]):
            seq_id, tokens, pos, want = items[k]
            rows[k] = b.add(seq_id, tokens, pos, int(want))
        self._run(b.raw)
        return rows

    def prefill(self, seq_id: int, tokens: list[int], pos: int = 0) -> None:
        """Compute the KV of `tokens` for `seq_id` from position `pos`, in
        n_batch pieces, with no logits. Raises DecodeError."""
        step = self.cfg.n_batch
        for i in range(0, len(tokens), step):
            self.decode([(seq_id, tokens[i:i + step], pos + i, 0)])

    def _run(self, batch: lc.llama_batch) -> None:
        rc = lc.llama_decode(self.ptr, batch)
        if rc != 0:
            err = DecodeError(f"llama_decode failed (code {rc}): "
                              + ("no KV space left for the batch" if rc == 1 else "aborted or failed"))
            # rc=1 leaves the KV as it was before the call: a smaller batch may fit.
            err.rc = rc
            raise err

    def decode_rows(self, tokens: list[int], first: int) -> np.ndarray:
        """Decode `tokens` as sequence 0 from position 0 (after `clear`) and
        return the logits of tokens[first:] as a (len - first, n_vocab)
        float32 view, valid until the next decode. Raises DecodeError, and
        ValueError for more tokens than n_batch."""
        b = self._batch
        b.clear()
        n = len(tokens)
        b.add(0, tokens, 0, n - first)
        self._run(b.raw)
        # Rows that asked for logits are stored contiguously, in batch order.
        ptr = lc.llama_get_logits_ith(self.ptr, first)
        return np.ctypeslib.as_array(ptr, shape=(n - first, self.model.n_vocab))

    def clear(self) -> None:
        """Forget every sequence's KV."""
        lc.llama_memory_clear(self.mem, True)

    def logits(self, row: int) -> np.ndarray:
        """A view of the raw logits of batch row `row`, valid until the next
        decode overwrites them."""
        ptr = lc.llama_get_logits_ith(self.ptr, row)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(lc.llama_memory_seq_rm(self.mem, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        lc.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Move the cells at positions [p0, p1) by `delta`; llama.cpp
        re-rotates their keys at the next decode. Raises LlmctlError when
        this context's memory cannot shift (can_shift)."""
        if not self.can_shift:
            raise LlmctlError("this model's KV cache cannot move cells")
        lc.llama_memory_seq_add(self.mem, seq_id, p0, p1, delta)

    @property
    def can_shift(self) -> bool:
        """Whether cells may move to new positions (RoPE models can)."""
        return bool(lc.llama_memory_can_shift(self.mem))

    def state_get(self, seq_id: int) -> memoryview:
        size = lc.llama_state_seq_get_size(self.ptr, seq_id)
        buf = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data(self.ptr, buf, size, seq_id)
        # A view keeps the one copy llama.cpp made (slicing would build a list of ints).
        return memoryview(buf).cast("B")[:written]

    def state_set(self, data: bytes | memoryview, seq_id: int) -> bool:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return lc.llama_state_seq_set_data(self.ptr, buf, len(data), seq_id) > 0
