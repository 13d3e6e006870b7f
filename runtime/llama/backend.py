"""The thin layer over llama.cpp's C API (through llama-cpp-python's ctypes
bindings). Everything else in llmctl is plain Python: only this file imports
llama_cpp and touches pointers, batches, samplers, the quantizer and the
library's log."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import llama_cpp as lc
import numpy as np

from llmctl.errors import BadModelFile, DecodeError, InvalidParams, LlmctlError, UsageError
from llmctl.runtime.llama.grammar_budget import GrammarBudget, GrammarClock
from llmctl.runtime.sampling import SamplingParams

_init_lock = threading.Lock()
_initialized = False

# ggml.h's numbering (llama-cpp-python's _logger comment predates DEBUG=1).
_GGML_LOG_LEVEL_ERROR = 4
_GGML_LOG_LEVEL_CONT = 5

# What a saved KV state depends on: the library that wrote it.
LLAMA_CPP_VERSION: str = lc.__version__


class LogCapture:
    """llama.cpp's log lines while one call runs. The quantizer reports
    per-tensor progress only through its log, and a failure's reason is an
    error line we show instead of a wall of text."""

    def __init__(self, on_text: Callable[[str], None] | None = None):
        self.on_text = on_text
        self.errors: list[str] = []

    def feed(self, level: int, message: str) -> None:
        if level == _GGML_LOG_LEVEL_ERROR and message.strip():
            self.errors.append(message.strip())
        if self.on_text is not None:
            self.on_text(message)

    def last_error(self, default: str) -> str:
        """The most telling error line, or `default` when there was none."""
        lines = [e for e in self.errors if not e.startswith("=")]
        # llama.cpp ends a failure with "<func>: failed to ...: <reason>".
        final = [e for e in lines if "failed to" in e]
        return (final or lines or [default])[-1]


# The innermost capture gets every line; with none, only errors reach stderr.
_captures: list[LogCapture] = []
_log_lock = threading.Lock()
_last_level = 0


@lc.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # The one log filter: llama.cpp logs every tensor at load, and users
    # only need its errors (or, while a call captures them, none at all).
    global _last_level
    try:
        if level != _GGML_LOG_LEVEL_CONT:     # a continuation keeps its line's level
            _last_level = level
        capture = _captures[-1] if _captures else None
        if os.environ.get("LLMCTL_LLAMA_LOG") or (
                capture is None and _last_level == _GGML_LOG_LEVEL_ERROR):
            os.write(2, text)
        if capture is not None:
            capture.feed(_last_level, text.decode("utf-8", "replace"))
    except Exception:  # an exception must never cross back into C
        pass


def install_quiet_log() -> None:
    """(Re)install llmctl's log filter, in case other code (llama-cpp-python's
    own classes) replaced it."""
    lc.llama_log_set(_quiet_log, ctypes.c_void_p(0))


@contextlib.contextmanager
def capture_log(on_text: Callable[[str], None] | None = None) -> Iterator[LogCapture]:
    """Route llama.cpp's log lines (process-wide) to a LogCapture for the
    duration instead of stderr. An exception raised by `on_text` is
    swallowed: it must never unwind through C."""
    init_backend()
    capture = LogCapture(on_text)
    with _log_lock:
        _captures.append(capture)
    try:
        yield capture
    finally:
        with _log_lock:
            _captures.remove(capture)


def init_backend() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            install_quiet_log()
            lc.llama_backend_init()
            _initialized = True


def file_types() -> dict[str, int]:
    """Every file type (llama_ftype) this build can write, by name: `Q4_K_M`."""
    types = {}
    for attr in dir(lc):
        if not attr.startswith("LLAMA_FTYPE_") or attr == "LLAMA_FTYPE_GUESSED":
            continue
        name = attr.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
        types[name] = int(getattr(lc, attr))
    return types


def quantize_file(src: Path, dst: Path, ftype: int, *, threads: int = 0,
                  allow_requantize: bool = False) -> int:
    """llama_model_quantize `src` into `dst` (threads 0 = every hardware
    thread); return its status, 0 on success. Raises nothing: the reason for
    a failure is in the log, so callers run this inside `capture_log`."""
    init_backend()
    params = lc.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = allow_requantize
    return lc.llama_model_quantize(str(src).encode(), str(dst).encode(), params)


def supports_gpu_offload() -> bool:
    init_backend()
    return bool(lc.llama_supports_gpu_offload())


def system_info() -> str:
    init_backend()
    return lc.llama_print_system_info().decode(errors="replace")


class LlamaModel:
    """A loaded model: weights and vocabulary. `repack` False keeps ggml's
    CPU backend from repacking quantized weights for its faster kernels:
    those compute a multi-row batch with another kernel than a single row,
    rounding differently (scripts/bench_rows.py measures both). Raises
    BadModelFile when llama.cpp cannot load the file."""

    def __init__(self, path: str | Path, *, n_gpu_layers: int = 0, vocab_only: bool = False,
                 repack: bool = True):
        init_backend()
        self.path = Path(path)
        params = lc.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = vocab_only
        params.use_extra_bufts = repack
        self.ptr = lc.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.ptr:
            raise BadModelFile(f"{self.path}: llama.cpp could not load this model "
                               "(unsupported architecture or damaged file)")
        self.vocab = lc.llama_model_get_vocab(self.ptr)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self.ptr)
        self.n_layer = lc.llama_model_n_layer(self.ptr)
        self.add_bos = bool(lc.llama_vocab_get_add_bos(self.vocab))
        self.bos = lc.llama_vocab_bos(self.vocab)
        self.eos = lc.llama_vocab_eos(self.vocab)
        self.n_embd = lc.llama_model_n_embd(self.ptr)
        self._pieces: dict[bool, dict[int, bytes]] = {False: {}, True: {}}
        # Contexts made on this model; each is freed before the weights are.
        self._contexts: weakref.WeakSet = weakref.WeakSet()
        self.eog_tokens = [t for t in range(self.n_vocab) if lc.llama_vocab_is_eog(self.vocab, t)]
        self._eog = frozenset(self.eog_tokens)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode()
        cap = len(data) + 16
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token; control tokens render as nothing unless
        `special` (then as their text, as llama.cpp's grammar sees them)."""
        cache = self._pieces[special]
        cached = cache.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = lc.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lc.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            cached = cache[token] = buf.raw[:n]
        return cached

    def token_text(self, token: int) -> str:
        if token < 0:
            return ""
        text = lc.llama_vocab_get_text(self.vocab, token)
        return text.decode(errors="replace") if text else ""

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode(errors="replace")

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    def chat_template(self) -> str | None:
        raw = lc.llama_model_chat_template(self.ptr, None)
        return raw.decode(errors="replace") if raw else None

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text; None when the file has no `key`."""
        buf = ctypes.create_string_buffer(256)
        n = lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode(errors="replace") if n >= 0 else None

    def declared_pooling(self) -> str | None:
        """The pooling the GGUF declares (`<arch>.pooling_type`) as a POOLING
        name; None when it declares none, as decoder models don't."""
        raw = self.meta(f"{self.meta('general.architecture')}.pooling_type")
        names = {v: k for k, v in POOLING.items()}
        return names.get(int(raw)) if raw is not None and raw.lstrip("-").isdigit() else None

    @property
    def encoder_decoder(self) -> bool:
        return bool(lc.llama_model_has_encoder(self.ptr) and lc.llama_model_has_decoder(self.ptr))

    def close(self) -> None:
        if getattr(self, "ptr", None):
            # A context freed after its model reads freed memory.
            for ctx in list(self._contexts):
                ctx.close()
            lc.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


# llama.cpp's pooling types by name: how one sequence's token vectors become one.
POOLING = {"none": lc.LLAMA_POOLING_TYPE_NONE, "mean": lc.LLAMA_POOLING_TYPE_MEAN,
           "cls": lc.LLAMA_POOLING_TYPE_CLS, "last": lc.LLAMA_POOLING_TYPE_LAST,
           "rank": lc.LLAMA_POOLING_TYPE_RANK}


def _new_context(model: LlamaModel, params, hint: str,
                 on_text: Callable[[str], None] | None = None):
    """llama_init_from_model. Raises LlmctlError with llama.cpp's reason and
    `hint` when it fails."""
    with capture_log(on_text) as log:
        ptr = lc.llama_init_from_model(model.ptr, params)
    if not ptr:
        reason = log.last_error("out of memory?")
        raise LlmctlError(f"llama.cpp could not create a context: {reason} ({hint})")
    return ptr


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
    n_ctx_seq: int          # tokens each sequence may hold
    n_seq_max: int          # sequences decoded together
    n_batch: int            # most tokens in one llama_decode call
    n_threads: int
    flash_attn: bool = True
    n_ubatch: int | None = None     # tokens per graph run; None: min(n_batch, 512)
    kv_type: str = "f16"            # K and V cache element type


class LlamaContext:
    """One llama_context holding the KV of up to n_seq_max sequences.

    Each sequence gets its own KV stream (kv_unified=False): attention then
    spans only that sequence's cells, which measured faster at batch 16-32
    than one unified cache whose attention spans every cell.

    Raises UsageError for an unknown kv_type and LlmctlError, with
    llama.cpp's reason, when the context cannot be made (out of memory, or
    a quantized V cache without flash attention)."""

    def __init__(self, model: LlamaModel, cfg: ContextConfig):
        self.model = model
        self.cfg = cfg
        params = lc.llama_context_default_params()
        params.n_ctx = cfg.n_ctx_seq * cfg.n_seq_max
        params.n_batch = cfg.n_batch
        params.n_ubatch = cfg.n_ubatch or min(cfg.n_batch, 512)
        params.n_seq_max = cfg.n_seq_max
        params.n_threads = params.n_threads_batch = cfg.n_threads
        params.type_k = params.type_v = kv_ggml_type(cfg.kv_type)
        # A quantized V is read only by the flash-attention kernel, so there
        # "on" must mean enabled, not llama.cpp's per-device auto choice.
        on = lc.LLAMA_FLASH_ATTN_TYPE_AUTO if cfg.kv_type == "f16" else lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.flash_attn_type = on if cfg.flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.kv_unified = False
        params.no_perf = True
        sizes: list[float] = []
        self.ptr = _new_context(
            model, params, "try a smaller --ctx-size or --max-num-seqs, or another --kv-type",
            lambda text: sizes.extend(map(float, _KV_SIZE_RE.findall(text))))
        model._contexts.add(self)
        # What llama.cpp allocated for K and V, from its own report.
        self.kv_bytes: int | None = round(sum(sizes) * (1 << 20)) if sizes else None
        self.mem = lc.llama_get_memory(self.ptr)
        self.n_ctx_seq = lc.llama_n_ctx_seq(self.ptr)
        self._batch = lc.llama_batch_init(cfg.n_batch, 0, 1)

    def decode(self, items: list[tuple[int, list[int], int, int]]) -> list[int]:
        """Decode one batch. Each item is (seq_id, tokens, first_pos,
        n_logits): logits for its last n_logits tokens (speculation checks
        several; True is one). Returns, per item, the batch index of its
        first logits row, the others following it (-1 where none)."""
        b = self._batch
        n = 0
        rows = [-1] * len(items)
        # With one KV stream per sequence, llama.cpp puts only runs of
        # consecutive, increasing seq ids into one ubatch; in admission order
        # a step could split into many small ubatches (one graph run each).
        for k in sorted(range(len(items)), key=lambda k: items[k][0]):
            seq_id, tokens, pos, want = items[k]
            for i, tok in enumerate(tokens):
                b.token[n] = tok
                b.pos[n] = pos + i
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq_id
                b.logits[n] = 0
                n += 1
            if want:
                for i in range(n - int(want), n):
                    b.logits[i] = 1
                rows[k] = n - int(want)
        b.n_tokens = n
        self._run(b)
        return rows

    def _run(self, batch) -> None:
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
        float32 view, valid until the next decode. Raises DecodeError."""
        b = self._batch
        n = len(tokens)
        for k, tok in enumerate(tokens):
            b.token[k] = tok
            b.pos[k] = k
            b.n_seq_id[k] = 1
            b.seq_id[k][0] = 0
            b.logits[k] = k >= first
        b.n_tokens = n
        self._run(b)
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

    def state_get(self, seq_id: int) -> memoryview:
        size = lc.llama_state_seq_get_size(self.ptr, seq_id)
        buf = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data(self.ptr, buf, size, seq_id)
        # A view keeps the one copy llama.cpp made (slicing would build a list of ints).
        return memoryview(buf).cast("B")[:written]

    def state_set(self, data: bytes | memoryview, seq_id: int) -> bool:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return lc.llama_state_seq_set_data(self.ptr, buf, len(data), seq_id) > 0

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_batch_free(self._batch)
            lc.llama_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


class EmbeddingContext:
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
        self.model = model
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
        self.ptr = _new_context(model, params, "not enough memory for embeddings")
        model._contexts.add(self)
        self.mem = lc.llama_get_memory(self.ptr)     # NULL for encoder-only models
        self._batch = lc.llama_batch_init(n_tokens, 0, 1)

    def embed(self, seqs: list[list[int]]) -> np.ndarray:
        """The pooled, unnormalised vectors of `seqs` (at most n_seq_max, with
        n_tokens tokens in all), one (n_embd,) float32 row each. Raises
        DecodeError, and LlmctlError once the model is closed."""
        if not self.ptr:
            raise LlmctlError("the model was unloaded")
        if self.mem:
            lc.llama_memory_clear(self.mem, True)
        b = self._batch
        n = 0
        for seq_id, tokens in enumerate(seqs):
            for pos, tok in enumerate(tokens):
                b.token[n], b.pos[n], b.n_seq_id[n] = tok, pos, 1
                b.seq_id[n][0] = seq_id
                b.logits[n] = 1     # pooling reads every token's output
                n += 1
        b.n_tokens = n
        rc = lc.llama_decode(self.ptr, b)
        if rc != 0:
            raise DecodeError(f"llama_decode failed (code {rc}) computing embeddings")
        out = np.empty((len(seqs), self.model.n_embd), dtype=np.float32)
        for seq_id in range(len(seqs)):
            ptr = lc.llama_get_embeddings_seq(self.ptr, seq_id)
            out[seq_id] = np.ctypeslib.as_array(ptr, shape=(self.model.n_embd,))
        return out

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_batch_free(self._batch)
            lc.llama_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


# llama_token_data as numpy lays it out, to fill a candidate array in one copy.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
_TOKEN_DATA_SIZE = ctypes.sizeof(lc.llama_token_data)
_grammar_lock = threading.Lock()
# Candidates per grammar filter call: small first, so the time of the first
# call tells whether the whole vocabulary fits the budget before most of it runs.
_FILTER_FIRST, _FILTER_MAX = 256, 8192


@contextlib.contextmanager
def _stderr_captured() -> Iterator[Callable[[], str]]:
    """fd 2 into a temporary file for the duration: llama.cpp's grammar
    parser fprintf's its reason (and the whole grammar) to stderr, and an
    untrusted grammar must neither flood a server's log nor lose the reason."""
    with _grammar_lock, tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lambda: (tmp.seek(0), tmp.read(4096).decode("utf-8", "replace"))[1]
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _new_grammar(model: LlamaModel, text: str):
    """A llama.cpp grammar sampler for `text` (start rule `root`). Raises
    InvalidParams (param "response_format") with llama.cpp's reason."""
    with _stderr_captured() as stderr, capture_log() as log:
        ptr = lc.llama_sampler_init_grammar(model.vocab, text.encode(), b"root")
        if ptr:
            return ptr
        printed = stderr()
    # "parse: error parsing grammar: <reason>\n\n<the grammar>"
    head = printed.split("\n", 1)[0].partition("error parsing grammar: ")[2]
    reason = head or log.last_error("llama.cpp could not compile it")
    raise InvalidParams(f"invalid grammar: {reason[:300]}", param="response_format")


def validate_grammar(model: LlamaModel, text: str) -> None:
    """Compile `text` once and drop it: a cheap check before submitting.
    Raises InvalidParams (param "response_format") for a grammar llama.cpp
    refuses (syntax, undefined rule, no `root`, left recursion)."""
    lc.llama_sampler_free(_new_grammar(model, text))


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


class _Grammar:
    """A grammar sampler kept outside the chain, and laziness done here
    rather than by llama.cpp's lazy grammar: llama.cpp feeds the trigger's
    text to the grammar inside llama_sampler_accept, and text that does not
    fit throws a C++ exception through the C API, which aborts the process.
    Here every token is checked with `allows` before it is accepted.

    Every call into the grammar is timed against the request's budget
    (grammar_budget.py); the methods that call it raise InvalidParams
    (param "response_format") when the request must stop."""

    def __init__(self, model: LlamaModel, text: str, triggers: tuple[str, ...],
                 budget: GrammarBudget):
        self.model = model
        self.clock = GrammarClock(budget)
        self.ptr = _new_grammar(model, text)
        self.triggers = [t.encode() for t in triggers]
        self.active = not triggers
        self._pending = b""     # recent output while waiting for a trigger
        self._one = lc.llama_token_data()
        self._one_arr = lc.llama_token_data_array(ctypes.pointer(self._one), 1, -1, False)

    def allows(self, token: int) -> bool:
        self._one.id, self._one.logit, self._one.p = token, 1.0, 0.0
        self._one_arr.size, self._one_arr.selected = 1, -1
        start = self.clock.now()
        lc.llama_sampler_apply(self.ptr, ctypes.byref(self._one_arr))
        self.clock.charge(self.clock.now() - start)
        return self._one.logit != float("-inf")

    def apply(self, cur) -> None:
        """Filter every candidate, in growing slices: the grammar judges each
        candidate alone, and between slices the budget can stop a filter
        that would take too long before most of it has run."""
        base, total = ctypes.addressof(cur.data.contents), cur.size
        done, size = 0, _FILTER_FIRST
        start = mark = self.clock.now()
        while done < total:
            n = min(size, total - done)
            data = ctypes.cast(base + done * _TOKEN_DATA_SIZE, ctypes.POINTER(lc.llama_token_data))
            part = lc.llama_token_data_array(data, n, -1, False)
            lc.llama_sampler_apply(self.ptr, ctypes.byref(part))
            done, size = done + n, min(2 * size, _FILTER_MAX)
            now = self.clock.now()
            self.clock.charge(now - mark)
            self.clock.check_share(now - start, done, total)
            mark = now

    def accept(self, token: int) -> None:
        """Advance past `token`. Raises LlmctlError where the grammar does
        not allow it (llama.cpp itself would abort), and InvalidParams when
        the grammar's cost says the request must stop."""
        if not self.allows(token):
            raise LlmctlError("the output no longer matches the grammar "
                              f"at {self.model.piece(token, True)!r}")
        start = self.clock.now()
        lc.llama_sampler_accept(self.ptr, token)
        self.clock.accepted(self.clock.now() - start)

    def watch(self, token: int) -> None:
        """While lazy: look for a trigger in the output; once one appears, the
        grammar takes the text from it on. Raises LlmctlError when that text
        already breaks the grammar."""
        self._pending += self.model.piece(token, special=True)
        hits = [i for i in (self._pending.find(t) for t in self.triggers) if i >= 0]
        if not hits:
            keep = max(map(len, self.triggers)) - 1
            self._pending = self._pending[-keep:] if keep else b""
            return
        try:
            text = self._pending[min(hits):].decode()
        except UnicodeDecodeError:
            return      # a character is split across tokens: wait for its end
        self.active = True
        self._pending = b""
        for t in self.model.tokenize(text, add_special=False, parse_special=False):
            self.accept(t)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_sampler_free(self.ptr)
            self.ptr = None


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
        self.grammar: _Grammar | None = None
        self.ptr = None
        _check_bias_ids(model, params)
        self.ptr = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        try:
            self._build_chain(model, params, seed)
            if params.grammar is not None:
                self.grammar = _Grammar(model, params.grammar, params.grammar_triggers,
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

    def _candidates(self, ctx: LlamaContext, row: int):
        """Every token with its logit, as llama_sampler_sample builds them."""
        n = self.model.n_vocab
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx.ptr, row), shape=(n,))
        self._cand["id"] = self._ids
        self._cand["logit"] = logits
        self._cand["p"] = 0.0
        data = self._cand.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        return lc.llama_token_data_array(data, n, -1, False)

    def close(self) -> None:
        if self.grammar is not None:
            self.grammar.close()
        if getattr(self, "ptr", None):
            lc.llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


def _logit_bias(model: LlamaModel, pairs) -> ctypes.c_void_p:
    biases = (lc.llama_logit_bias * len(pairs))()
    for i, (tok, bias) in enumerate(pairs):
        biases[i].token, biases[i].bias = tok, bias
    return lc.llama_sampler_init_logit_bias(model.n_vocab, len(pairs), biases)
