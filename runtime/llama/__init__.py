"""The llama.cpp boundary: the only code that imports llama_cpp.

Callers import the public surface from here: `from llmctl.runtime.llama
import LlamaModel`. Inside the package, modules import each other directly,
never through this file.

  library          one-time init, the build's features, log capture
  model            LlamaModel: weights, vocabulary, GGUF metadata
  chat_builtin     llama.cpp's built-in chat formats, by name
  batch            Batch: the one llama_batch filler every decode uses
  handle           ContextHandle: a context's making and freeing
  context          LlamaContext, ContextConfig: the generation context
  embedding        EmbeddingContext: pooled vectors per sequence
  grammar_sampler  the grammar sampler, kept outside the chain
  grammar_budget   the bound on one request's grammar work (pure Python)
  sampler          Sampler: the per-sequence chain (on the host or in the
                   graph: backend_eligible); validate_sampling
  quantize         quantize_file, file_types
  exactness        whether a row decodes the same alone and in a batch
"""

from llmctl.runtime.llama.chat_builtin import builtin_names, render_builtin
from llmctl.runtime.llama.context import ContextConfig, LlamaContext, kv_ggml_type
from llmctl.runtime.llama.embedding import EmbeddingContext
from llmctl.runtime.llama.grammar_sampler import validate_grammar
from llmctl.runtime.llama.library import (
    LLAMA_CPP_VERSION,
    LogCapture,
    capture_log,
    init_backend,
    supports_gpu_offload,
    system_info,
)
from llmctl.runtime.llama.model import POOLING, LlamaModel
from llmctl.runtime.llama.quantize import file_types, quantize_file
from llmctl.runtime.llama.sampler import Sampler, backend_eligible, validate_sampling
from llmctl.runtime.llama.splice import Move, Splicer

__all__ = [
    "LLAMA_CPP_VERSION", "POOLING", "ContextConfig", "EmbeddingContext", "LlamaContext",
    "LlamaModel", "LogCapture", "Move", "Sampler", "Splicer", "builtin_names", "capture_log",
    "file_types", "init_backend", "kv_ggml_type", "quantize_file", "render_builtin",
    "supports_gpu_offload", "system_info", "backend_eligible",
    "validate_grammar", "validate_sampling",
]
