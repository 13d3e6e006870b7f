"""The bare llama.cpp quantizer: one call into `llama_model_quantize`, with
its per-tensor log lines turned into progress and its error into a typed
exception."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from llmctl.errors import BadModelFile
from llmctl.runtime.llama import capture_log, quantize_file

Progress = Callable[[int, int], None]
_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]")


def llama_quantize(src: Path, dst: Path, ftype: int, *, threads: int | None = None,
                   allow_requantize: bool = False,
                   progress: Progress | None = None) -> None:
    """Quantize `src` into `dst` (which the caller owns and cleans up).
    Raises BadModelFile with llama.cpp's reason when it refuses or fails."""

    def on_text(text: str) -> None:
        match = _TENSOR_LINE.match(text)
        if match and progress is not None:
            progress(int(match.group(1)), int(match.group(2)))

    with capture_log(on_text) as log:
        # threads 0 lets llama.cpp use every hardware thread.
        rc = quantize_file(src, dst, ftype, threads=threads or 0,
                           allow_requantize=allow_requantize)
    if rc != 0:
        reason = log.last_error("llama.cpp could not quantize it")
        reason = reason.split("failed to quantize:", 1)[-1].strip()
        raise BadModelFile(f"{src}: {reason}")
