"""The bare llama.cpp quantizer: one call into `llama_model_quantize`, with
its per-tensor log lines turned into progress and its error into a typed
exception."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from llmctl.errors import BadModelFile
from llmctl.quantize.llama_log import capture_llama_log

Progress = Callable[[int, int], None]
_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]")


def quantize_params(ftype: int, *, threads: int | None = None,
                    allow_requantize: bool = False):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads or 0          # 0 = every hardware thread
    params.allow_requantize = allow_requantize
    return params


def llama_quantize(src: Path, dst: Path, ftype: int, *, threads: int | None = None,
                   allow_requantize: bool = False,
                   progress: Progress | None = None) -> None:
    """Quantize `src` into `dst` (which the caller owns and cleans up)."""
    import llama_cpp

    params = quantize_params(ftype, threads=threads, allow_requantize=allow_requantize)

    def on_text(text: str) -> None:
        match = _TENSOR_LINE.match(text)
        if match and progress is not None:
            progress(int(match.group(1)), int(match.group(2)))

    with capture_llama_log(on_text) as log:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        reason = log.last_error("llama.cpp could not quantize it")
        reason = reason.split("failed to quantize:", 1)[-1].strip()
        raise BadModelFile(f"{src}: {reason}")
