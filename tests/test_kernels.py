"""llmctl's patched CPU kernels, each on its own (docs/exactness.md).

K-quant weights in their file's layout: ggml's tiled matmul takes 15+
activation rows and, in llmctl's build, llmctl's few-row kernel
(scripts/llama_cpp_tiled_rows.h) takes 1-14. A row's result must be the same
bits whatever the row count and thread count, and close to the exact product.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from llmctl.runtime.llama import ggml_ops

TYPES = {"Q4_K": (ggml_ops.Q4_K, GGMLQuantizationType.Q4_K),
         "Q6_K": (ggml_ops.Q6_K, GGMLQuantizationType.Q6_K)}
ROW_COUNTS = (1, 2, 3, 5, 7, 8, 9, 14, 15, 16, 33)


def _case(seed: int, rows: int, k: int, n: int):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    # activations with an outlier channel, as real hidden states have
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[:, 7] *= 20
    return w, x


# 2304 = 9 blocks of 256: the kernel reduces eight blocks at a time, so this
# covers a full group and a tail; 1024 is a tail only.
@pytest.mark.parametrize("k", (1024, 2304))
@pytest.mark.parametrize("name", sorted(TYPES))
def test_a_row_is_the_same_bits_at_any_row_and_thread_count(name, k):
    wtype, _ = TYPES[name]
    w, x = _case(1, 80, k, 40)
    ref = ggml_ops.matmul(wtype, w, x, threads=1)      # 40 rows: ggml's tiled kernel
    for n in ROW_COUNTS:
        for threads in (1, 2):
            got = ggml_ops.matmul(wtype, w, x[:n], threads=threads)
            diff = np.abs(got - ref[:n]).max()
            assert np.array_equal(got, ref[:n]), f"{n} rows, {threads} threads: off by {diff}"


def _q8_K(x: np.ndarray) -> np.ndarray:
    """The activations as ggml rounds them before a K-quant matmul (q8_K:
    per 256 values, a float32 scale and int8 codes; quantize_row_q8_K_ref)."""
    out = np.empty(x.shape, np.float64)
    for r, row in enumerate(x.astype(np.float32)):
        for b in range(0, row.size, 256):
            blk = row[b:b + 256]
            top = blk[np.argmax(np.abs(blk))]
            iscale = np.float32(-127.0) / top
            q = np.minimum(127, np.rint(iscale * blk))
            out[r, b:b + 256] = q * np.float64(np.float32(1.0) / iscale)
    return out


@pytest.mark.parametrize("name", sorted(TYPES))
def test_the_few_row_kernel_matches_a_float64_product(name):
    """Against float64 with the weights as stored and the activations as
    ggml rounds them: what is left is float32 rounding, under 1e-5 of the
    terms' magnitude. A wrong nibble, scale or block would be far off."""
    wtype, gtype = TYPES[name]
    w, x = _case(2, 48, 2304, 24)
    stored = dequantize(np.frombuffer(ggml_ops.quantize(wtype, w), np.uint8).reshape(48, -1),
                        gtype).astype(np.float64)
    xq = _q8_K(x)
    exact = xq @ stored.T
    scale = np.abs(xq) @ np.abs(stored).T
    for n in (1, 3, 16, 24):    # the few-row kernel, and ggml's tiled one at 24
        got = ggml_ops.matmul(wtype, w, x[:n], threads=2).astype(np.float64)
        err = np.abs(got - exact[:n])
        assert (err <= 1e-5 * scale[:n]).all(), f"{n} rows: worst relative {(err / scale[:n]).max()}"
