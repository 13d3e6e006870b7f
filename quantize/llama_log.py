"""Route llama.cpp's log lines to Python while a call runs. The quantizer
reports per-tensor progress only through its log, and errors are one
LLAMA_LOG_ERROR line we want to show instead of a wall of text."""

from __future__ import annotations

import contextlib
import ctypes
from typing import Callable, Iterator

# ggml.h's numbering (llama-cpp-python's _logger comment predates DEBUG=1).
GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5


class LogCapture:
    def __init__(self, on_text: Callable[[str], None] | None = None):
        self.on_text = on_text
        self.errors: list[str] = []
        self._level = 0

    def __call__(self, level: int, text: bytes, _user_data) -> None:
        if level != GGML_LOG_LEVEL_CONT:
            self._level = level
        message = text.decode("utf-8", "replace")
        if self._level == GGML_LOG_LEVEL_ERROR and message.strip():
            self.errors.append(message.strip())
        if self.on_text is not None:
            try:
                self.on_text(message)
            except Exception:  # an exception must never unwind through C++
                pass

    def last_error(self, default: str) -> str:
        lines = [e for e in self.errors if not e.startswith("=")]
        # llama.cpp ends a failure with "<func>: failed to ...: <reason>".
        final = [e for e in lines if "failed to" in e]
        return (final or lines or [default])[-1]


@contextlib.contextmanager
def capture_llama_log(on_text: Callable[[str], None] | None = None) -> Iterator[LogCapture]:
    """Install a log callback for the duration, then put llmctl's quiet
    filter back (it replaces the binding's noisy default)."""
    import llama_cpp

    from llmctl.runtime.backend import install_quiet_log

    capture = LogCapture(on_text)
    callback = llama_cpp.llama_log_callback(capture)
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    try:
        yield capture
    finally:
        install_quiet_log()
        del callback
