"""A llama_context's lifetime, shared by the generation and the embeddings
contexts: made on a model (with llama.cpp's reason when it cannot be),
registered there so it is freed before the weights, and freed once."""

from __future__ import annotations

from typing import Callable

import llama_cpp as lc

from llmctl.errors import LlmctlError
from llmctl.runtime.llama.batch import Batch
from llmctl.runtime.llama.library import capture_log
from llmctl.runtime.llama.model import LlamaModel


class ContextHandle:
    """llama_init_from_model with `params`, a memory handle and a Batch of
    `n_batch` tokens. Raises LlmctlError with llama.cpp's reason and `hint`
    when the context cannot be made."""

    def __init__(self, model: LlamaModel, params: lc.llama_context_params, *, n_batch: int,
                 hint: str, on_text: Callable[[str], None] | None = None):
        self.model = model
        with capture_log(on_text) as log:
            ptr = lc.llama_init_from_model(model.ptr, params)
        if not ptr:
            reason = log.last_error("out of memory?")
            raise LlmctlError(f"llama.cpp could not create a context: {reason} ({hint})")
        self.ptr = ptr
        model._contexts.add(self)
        self.mem = lc.llama_get_memory(self.ptr)     # NULL for encoder-only models
        self._batch = Batch(n_batch)

    def close(self) -> None:
        """Free the batch and the context; later calls do nothing."""
        if getattr(self, "ptr", None):
            self._batch.free()
            lc.llama_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()
