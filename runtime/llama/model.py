"""A loaded model: its weights, its vocabulary and the GGUF metadata llmctl
reads, and the contexts made on it (each is freed before the weights are)."""

from __future__ import annotations

import ctypes
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp as lc

from llmctl.errors import BadModelFile
from llmctl.runtime.llama.library import init_backend

if TYPE_CHECKING:
    from llmctl.runtime.llama.handle import ContextHandle

# llama.cpp's pooling types by name: how one sequence's token vectors become one.
POOLING = {"none": lc.LLAMA_POOLING_TYPE_NONE, "mean": lc.LLAMA_POOLING_TYPE_MEAN,
           "cls": lc.LLAMA_POOLING_TYPE_CLS, "last": lc.LLAMA_POOLING_TYPE_LAST,
           "rank": lc.LLAMA_POOLING_TYPE_RANK}


class LlamaModel:
    """A loaded model: weights and vocabulary. `repack` False keeps ggml's
    CPU backend from repacking quantized weights for its faster kernels:
    those compute a multi-row batch with another kernel than a single row,
    rounding differently (scripts/bench_rows.py measures both); in the
    file's layout llmctl's build computes a row alike at any row count
    (docs/exactness.md). Raises BadModelFile when llama.cpp cannot load the
    file."""

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
        self._contexts: weakref.WeakSet[ContextHandle] = weakref.WeakSet()
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

    def has_token(self, text: str) -> bool:
        """Whether the vocabulary holds `text` as one token (a chat format's
        turn marker, say)."""
        return len(self.tokenize(text, add_special=False, parse_special=True)) == 1

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
