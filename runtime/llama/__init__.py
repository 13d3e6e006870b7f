"""The llama.cpp boundary: the only code that imports llama_cpp.

Callers import the public surface from here: `from llmctl.runtime.llama
import LlamaModel`."""

from llmctl.runtime.llama.backend import (
    LLAMA_CPP_VERSION,
    POOLING,
    ContextConfig,
    EmbeddingContext,
    LlamaContext,
    LlamaModel,
    LogCapture,
    Sampler,
    capture_log,
    file_types,
    init_backend,
    kv_ggml_type,
    quantize_file,
    supports_gpu_offload,
    system_info,
    validate_grammar,
    validate_sampling,
)

__all__ = [
    "LLAMA_CPP_VERSION", "POOLING", "ContextConfig", "EmbeddingContext", "LlamaContext",
    "LlamaModel", "LogCapture", "Sampler", "capture_log", "file_types", "init_backend",
    "kv_ggml_type", "quantize_file", "supports_gpu_offload", "system_info",
    "validate_grammar", "validate_sampling",
]
