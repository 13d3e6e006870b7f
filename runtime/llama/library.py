"""The llama.cpp library itself: one-time initialisation, what the build
offers, and its log. llama.cpp logs every tensor at load through one
process-wide callback; this module installs the one filter for it and lets a
call capture the lines it causes (the quantizer reports progress only there,
and a failure's reason is an error line)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Callable, Iterator

import llama_cpp as lc

from llmctl import settings

_init_lock = threading.Lock()
_initialized = False

# ggml.h's numbering (llama-cpp-python's _logger comment predates DEBUG=1).
_GGML_LOG_LEVEL_ERROR = 4
_GGML_LOG_LEVEL_CONT = 5

# What a saved KV state depends on: the library that wrote it.
LLAMA_CPP_VERSION: str = lc.__version__

# ggml's switch for its tiled K-quant matmul, which computes weights in their
# file's layout (Q4_K, Q6_K, ...). In llmctl's build it takes every row count
# and rounds a row alike in a call of any size (docs/exactness.md); set to 0,
# ggml's one-row kernel takes every call instead: also exact, but a prompt
# chunk is several times slower. ggml reads it once per process.
TILED_MATMUL_ENV = "GGML_CPU_TILED_MM"


class LogCapture:
    """llama.cpp's log lines while one call runs. The quantizer reports
    per-tensor progress only through its log, and a failure's reason is an
    error line we show instead of a wall of text. Raises nothing."""

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
# LLMCTL_LLAMA_LOG: every line to stderr; read when the filter is installed.
_show_all = False


@lc.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # The one log filter: llama.cpp logs every tensor at load, and users
    # only need its errors (or, while a call captures them, none at all).
    global _last_level
    try:
        if level != _GGML_LOG_LEVEL_CONT:     # a continuation keeps its line's level
            _last_level = level
        capture = _captures[-1] if _captures else None
        if _show_all or (
                capture is None and _last_level == _GGML_LOG_LEVEL_ERROR):
            os.write(2, text)
        if capture is not None:
            capture.feed(_last_level, text.decode("utf-8", "replace"))
    except Exception:  # an exception must never cross back into C
        pass


def install_quiet_log() -> None:
    """(Re)install llmctl's log filter, in case other code (llama-cpp-python's
    own classes) replaced it. Raises nothing."""
    global _show_all
    _show_all = settings.llama_log()
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
    """Initialise llama.cpp once per process, with llmctl's log filter.
    Raises nothing."""
    global _initialized
    with _init_lock:
        if not _initialized:
            install_quiet_log()
            lc.llama_backend_init()
            _initialized = True


def supports_gpu_offload() -> bool:
    """Whether this build can put layers on a GPU. Raises nothing."""
    init_backend()
    return bool(lc.llama_supports_gpu_offload())


def system_info() -> str:
    """llama.cpp's own line of the CPU features it was built for and found.
    Raises nothing."""
    init_backend()
    return lc.llama_print_system_info().decode(errors="replace")


def has_fa_rows_kernel() -> bool:
    """Whether this build computes flash attention's rows with llmctl's
    kernel (scripts/llama_cpp_fa_rows.h, for an F16 KV), which
    rounds a row alike in a chunk of any size: it is compiled where the
    build has AVX2, F16C and FMA, which ggml reports. Raises nothing."""
    info = system_info()
    return all(f"{flag} = 1" in info for flag in ("AVX2", "F16C", "FMA"))
