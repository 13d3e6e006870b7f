"""Quantization: GGUF → GGUF with llama.cpp's own quantizer, Hugging Face
safetensors → GGUF conversion, and perplexity to measure what it cost."""

from llmctl.quantize.convert import ConvertResult, convert_hf
from llmctl.quantize.perplexity import PerplexityResult, perplexity
from llmctl.quantize.pipeline import QuantizeResult, quantize_model
from llmctl.quantize.types import BITS_TO_TYPE, available_types, resolve_type

__all__ = ["BITS_TO_TYPE", "ConvertResult", "PerplexityResult", "QuantizeResult",
           "available_types", "convert_hf", "perplexity", "quantize_model", "resolve_type"]
