"""One ggml op on the CPU, straight through ggml's C API: how llmctl's
patched kernels (scripts/llama_cpp_*_rows.h) are tested on their own, apart
from any model. A matmul of quantized weights by float activations runs
exactly as llama.cpp runs it in a model's graph: the same kernel choice by
row count, the same activation quantization, the same threads."""

from __future__ import annotations

import ctypes
import pathlib
import time

import llama_cpp
import numpy as np

from llmctl.native import library_path

# ggml's type ids (ggml.h)
F32, F16, Q4_K, Q6_K, Q8_K = 0, 1, 12, 14, 15

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", _P), ("no_alloc", ctypes.c_bool)]


class _Plan(ctypes.Structure):     # struct ggml_cplan (ggml-cpu.h)
    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", _P), ("n_threads", ctypes.c_int),
                ("threadpool", _P), ("abort_callback", _P), ("abort_callback_data", _P),
                ("use_ref", ctypes.c_bool)]


def _bind():
    # The ggml beside the libllama that llama_cpp itself loads: a build
    # under test, through LLAMA_CPP_LIB_PATH, or the package's own.
    found = library_path()
    lib = found.parent if found else pathlib.Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    sigs = {
        (base, "ggml_init"): ([_InitParams], _P),
        (base, "ggml_free"): ([_P], None),
        (base, "ggml_new_tensor_2d"): ([_P, ctypes.c_int, _I64, _I64], _P),
        (base, "ggml_new_tensor_3d"): ([_P, ctypes.c_int, _I64, _I64, _I64], _P),
        (base, "ggml_mul_mat"): ([_P, _P, _P], _P),
        (base, "ggml_flash_attn_ext"): ([_P, _P, _P, _P, _P, ctypes.c_float, ctypes.c_float,
                                         ctypes.c_float], _P),
        (base, "ggml_new_graph"): ([_P], _P),
        (base, "ggml_build_forward_expand"): ([_P, _P], None),
        (base, "ggml_get_data"): ([_P], _P),
        (base, "ggml_quantize_chunk"): ([ctypes.c_int, _P, _P, _I64, _I64, _I64, _P],
                                        ctypes.c_size_t),
        (base, "ggml_row_size"): ([ctypes.c_int, _I64], ctypes.c_size_t),
        (cpu, "ggml_graph_plan"): ([_P, ctypes.c_int, _P], _Plan),
        (cpu, "ggml_graph_compute"): ([_P, ctypes.POINTER(_Plan)], ctypes.c_int),
        (cpu, "ggml_cpu_init"): ([], None),
        (cpu, "quantize_row_q8_K"): ([_P, _P, _I64], None),
        (base, "quantize_row_q8_K_ref"): ([_P, _P, _I64], None),
    }
    for (so, name), (args, res) in sigs.items():
        fn = getattr(so, name)
        fn.argtypes, fn.restype = args, res
    cpu.ggml_cpu_init()
    return base, cpu


_LIBS = None


def _libs():
    global _LIBS
    if _LIBS is None:
        _LIBS = _bind()
    return _LIBS


def quantize(wtype: int, w: np.ndarray) -> bytes:
    """w (rows, k) as ggml stores it in `wtype`: the file's layout."""
    base, _ = _libs()
    w = np.ascontiguousarray(w, dtype=np.float32)
    rows, k = w.shape
    out = ctypes.create_string_buffer(base.ggml_row_size(wtype, k) * rows)
    base.ggml_quantize_chunk(wtype, w.ctypes.data, out, 0, rows, k, None)
    return out.raw


def quantize_q8_K(x: np.ndarray, *, reference: bool = False, fill: int = 0,
                  times: list[float] | None = None) -> bytes:
    """Activations as every K-quant matmul first converts them: the CPU
    backend's quantize_row_q8_K, or with `reference` ggml's scalar
    quantize_row_q8_K_ref. The output starts as `fill` bytes (a block of
    zeros leaves its sums as they were); with `times`, the conversion runs
    len(times) times and each one's seconds go there."""
    base, cpu = _libs()
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    out = ctypes.create_string_buffer(bytes([fill]) * base.ggml_row_size(Q8_K, x.size))
    fn = base.quantize_row_q8_K_ref if reference else cpu.quantize_row_q8_K
    _repeat(lambda: fn(x.ctypes.data, out, x.size), times)
    return out.raw


def _repeat(call, times: list[float] | None) -> None:
    """call() once, or len(times) times with each one's seconds in times."""
    for i in range(len(times) if times else 1):
        start = time.perf_counter()
        call()
        if times:
            times[i] = time.perf_counter() - start


def _run(mem: int, build, threads: int, out: np.ndarray,
         times: list[float] | None = None) -> np.ndarray:
    """Make a context, let `build(base, ctx)` return the result tensor,
    compute it on `threads` threads and copy it into `out`; with `times`,
    compute it len(times) times and put each one's seconds there."""
    base, cpu = _libs()
    ctx = base.ggml_init(_InitParams(mem + (1 << 20), None, False))
    if not ctx:
        raise MemoryError("ggml_init failed")
    try:
        c = build(base, ctx)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, c)
        # one work buffer for every run, as llama.cpp keeps one
        plan = cpu.ggml_graph_plan(graph, threads, None)
        work = ctypes.create_string_buffer(plan.work_size + 64)
        plan.work_data = (ctypes.addressof(work) + 63) & ~63

        def compute():
            if cpu.ggml_graph_compute(graph, ctypes.byref(plan)) != 0:
                raise RuntimeError("ggml_graph_compute failed")

        _repeat(compute, times)
        ctypes.memmove(out.ctypes.data, base.ggml_get_data(c), out.nbytes)
        return out
    finally:
        base.ggml_free(ctx)


def _tensor(base, ctx, ggml_type: int, a: np.ndarray):
    """A ggml tensor holding numpy array `a` (its last axis is ggml's ne0)."""
    t = base.ggml_new_tensor_3d(ctx, ggml_type, *(list(a.shape[::-1]) + [1, 1])[:3])
    ctypes.memmove(base.ggml_get_data(t), a.ctypes.data, a.nbytes)
    return t


def matmul(wtype: int, w: np.ndarray, x: np.ndarray, threads: int = 1,
           times: list[float] | None = None) -> np.ndarray:
    """x (n, k) times the transpose of w (rows, k), w quantized to `wtype`
    and kept in its file's layout (never repacked): (n, rows) in float32.
    With `times`, the op runs len(times) times, each timed (_run)."""
    rows, k = w.shape
    n = x.shape[0]
    packed = quantize(wtype, w)
    xs = np.ascontiguousarray(x, dtype=np.float32)

    def build(base, ctx):
        a = base.ggml_new_tensor_2d(ctx, wtype, k, rows)
        ctypes.memmove(base.ggml_get_data(a), packed, len(packed))
        return base.ggml_mul_mat(ctx, a, _tensor(base, ctx, F32, xs))

    return _run(len(packed) + xs.nbytes * 2 + 4 * rows * n, build, threads,
                np.empty((n, rows), np.float32), times)


def flash_attn(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
               threads: int = 1) -> np.ndarray:
    """ggml's CPU flash attention as llama.cpp calls it: q (heads, rows, DK)
    float32, k and v (kv_heads, cells, DK or DV) float16, mask (rows, cells)
    float16 (0 or -inf); (rows, heads, DV) in float32."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    k = np.ascontiguousarray(k, dtype=np.float16)
    v = np.ascontiguousarray(v, dtype=np.float16)
    mask = np.ascontiguousarray(mask, dtype=np.float16)
    heads, rows, _ = q.shape

    def build(base, ctx):
        return base.ggml_flash_attn_ext(ctx, _tensor(base, ctx, F32, q), _tensor(base, ctx, F16, k),
                                        _tensor(base, ctx, F16, v), _tensor(base, ctx, F16, mask),
                                        scale, 0.0, 0.0)

    out = np.empty((rows, heads, v.shape[2]), np.float32)
    mem = q.nbytes + k.nbytes + v.nbytes + mask.nbytes + 2 * out.nbytes
    return _run(mem, build, threads, out)
