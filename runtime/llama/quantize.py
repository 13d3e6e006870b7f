"""The quantizer: llama_model_quantize and the file types this build writes."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as lc

from llmctl.runtime.llama.library import init_backend


def file_types() -> dict[str, int]:
    """Every file type (llama_ftype) this build can write, by name: `Q4_K_M`.
    Raises nothing."""
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
