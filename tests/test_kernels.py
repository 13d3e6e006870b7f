"""llmctl's patched CPU kernels, each on its own (docs/exactness.md),
through ggml's C API (runtime/llama/ggml_ops.py): a row's result must be
the same bits whatever the row count and thread count, and close to a
float64 reference.

K-quant weights in their file's layout: in llmctl's build, llmctl's few-row
kernel (scripts/llama_cpp_tiled_rows.h) takes 1-14 activation rows, or 1-7
where its lanes kernel (scripts/llama_cpp_tiled_lanes.h, AVX-512 VNNI) takes
8-64, and ggml's tiled matmul the rest; the activations reach them as Q8_K
through scripts/llama_cpp_q8k.h on x86. Flash attention: see below.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from llmctl.runtime.llama import ggml_ops

TYPES = {"Q4_K": (ggml_ops.Q4_K, GGMLQuantizationType.Q4_K),
         "Q6_K": (ggml_ops.Q6_K, GGMLQuantizationType.Q6_K)}
# each side of every hand-over: 7|8 and 14|15 (the kernels), 16|17, 32|33
# and 48|49 (the lanes kernel's registers of rows), 64|65 (the tiles)
ROW_COUNTS = (1, 2, 3, 5, 7, 8, 9, 14, 15, 16, 17, 32, 33, 48, 49, 64, 65)


def _case(seed: int, rows: int, k: int, n: int):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    # activations with an outlier channel, as real hidden states have
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[:, 7] *= 20
    return w, x


# 2304 = 9 blocks of 256: the few-row kernel reduces eight blocks at a time,
# so this covers a full group and a tail; 1024 is a tail only. 78 weight
# rows: the lanes kernel takes 8, 4 or 2 at a time, so a chunk ends short.
@pytest.mark.parametrize("k", (1024, 2304))
@pytest.mark.parametrize("name", sorted(TYPES))
def test_a_row_is_the_same_bits_at_any_row_and_thread_count(name, k):
    wtype, _ = TYPES[name]
    w, x = _case(1, 78, k, 80)
    ref = ggml_ops.matmul(wtype, w, x, threads=1)      # 80 rows: ggml's tiled kernel
    for n in ROW_COUNTS:
        for threads in (1, 2):
            got = ggml_ops.matmul(wtype, w, x[:n], threads=threads)
            diff = np.abs(got - ref[:n]).max()
            assert np.array_equal(got, ref[:n]), f"{n} rows, {threads} threads: off by {diff}"


def _hostile_rows() -> np.ndarray:
    """Blocks of 256 that probe each rule of quantize_row_q8_K_ref."""
    rng = np.random.default_rng(5)
    rows = np.stack([rng.standard_normal(256) for _ in range(9)] + [np.zeros(256)]).astype(np.float32)
    rows[:4] *= np.array([1e-3, 1.0, 30.0, 1e4], np.float32)[:, None]
    rows[4, [9, 200]] = (-5.0, 5.0)              # the first of equal |max| wins
    rows[5] = 0.5
    rows[5, 0] = -127.0                          # products at exact halves
    rows[5, 1::7] = np.arange(1, 38) + 0.5
    rows[6, [3, 100]] = np.nan                   # NaNs are skipped for the max
    rows[6].view(np.uint32)[4] = 0x7FA12345      # a signalling NaN with a payload
    rows[7, 17] = np.inf
    rows[8] *= np.float32(1e-39)                 # a scale past float's range
    rows[8, :2] = 0.0
    return np.concatenate([rows, -rows[9:]])     # and a block of -0.0


def test_the_q8_K_conversion_writes_the_reference_bytes():
    """llmctl's vectorized x86 quantize_row_q8_K (scripts/llama_cpp_q8k.h)
    against ggml's scalar reference, byte for byte, a block's sums
    included: random rows of every scale, then hostile ones."""
    rng = np.random.default_rng(4)
    rows = [rng.standard_normal(2304) * rng.uniform(1e-3, 1e3) for _ in range(40)]
    rows += list(_hostile_rows())
    for i, row in enumerate(rows):
        for fill in (0, 0xA5):
            ref = ggml_ops.quantize_q8_K(row, reference=True, fill=fill)
            got = ggml_ops.quantize_q8_K(row, fill=fill)
            assert got == ref, f"row {i}, fill {fill:#x}"


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
def test_the_matmul_kernels_match_a_float64_product(name):
    """Against float64 with the weights as stored and the activations as
    ggml rounds them: what is left is float32 rounding, under 1e-5 of the
    terms' magnitude. A wrong nibble, scale or block would be far off."""
    wtype, gtype = TYPES[name]
    w, x = _case(2, 48, 2304, 72)
    stored = dequantize(np.frombuffer(ggml_ops.quantize(wtype, w), np.uint8).reshape(48, -1),
                        gtype).astype(np.float64)
    xq = _q8_K(x)
    exact = xq @ stored.T
    scale = np.abs(xq) @ np.abs(stored).T
    for n in (1, 3, 16, 24, 72):    # every kernel: ggml's tiled one at 72
        got = ggml_ops.matmul(wtype, w, x[:n], threads=2).astype(np.float64)
        err = np.abs(got - exact[:n])
        assert (err <= 1e-5 * scale[:n]).all(), f"{n} rows: worst relative {(err / scale[:n]).max()}"


# Flash attention, F16 KV: llmctl's kernel (scripts/llama_cpp_fa_rows.h)
# takes chunks of every size in llmctl's build (ggml's own takes 64+ rows with
# a tiled kernel that rounds otherwise), and past 512 cells a lone row too
# (the split-KV kernel is off). Its register tiles hold up to 6 rows (3 on
# AVX2) and its groups 128, so the row counts below cross both.
SHAPES = {"4 heads over 2, 64 wide": (4, 2, 64),
          "14 over 2 (Qwen 0.5B)": (14, 2, 64),
          "12 over 2, 128 wide (Qwen 1.5B)": (12, 2, 128)}


def _attention_case(rows: int, cells: int = 700, shape=(4, 2, 64)):
    rng = np.random.default_rng(4)
    heads, kv_heads, dim = shape
    q = rng.standard_normal((heads, rows, dim)).astype(np.float32)
    k = rng.standard_normal((kv_heads, cells, dim)).astype(np.float16)
    v = rng.standard_normal((kv_heads, cells, dim)).astype(np.float16)
    mask = np.zeros((rows, cells), np.float16)
    mask[rng.random((rows, cells)) < 0.3] = -np.inf
    mask[:, -1] = 0                         # no row is all masked
    return q, k, v, mask


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_attention_rows_are_the_same_bits_at_any_row_and_thread_count(shape):
    q, k, v, mask = _attention_case(130, shape=shape)
    ref = ggml_ops.flash_attn(q, k, v, mask, 0.125, threads=1)
    for n in (1, 2, 3, 8, 9, 17, 33, 63, 64, 65, 80, 129):
        for threads in (1, 2):
            got = ggml_ops.flash_attn(q[:, :n], k, v, mask[:n], 0.125, threads=threads)
            diff = np.abs(got - ref[:n]).max()
            assert np.array_equal(got, ref[:n]), f"{n} rows, {threads} threads: off by {diff}"


def test_a_causal_chunk_computes_its_rows_as_one_at_a_time():
    """A prompt chunk's causal mask leaves most blocks of its first rows
    masked, which the kernel skips for those rows but not for their
    neighbours in a tile: each row alone gives the same bits."""
    q, k, v, _ = _attention_case(96, cells=300, shape=(14, 2, 64))
    mask = np.zeros((96, 300), np.float16)
    for r in range(96):
        mask[r, 300 - 96 + r + 1:] = -np.inf
    ref = ggml_ops.flash_attn(q, k, v, mask, 0.125, threads=2)
    for r in (0, 5, 6, 40, 48, 50, 95):
        got = ggml_ops.flash_attn(q[:, r:r + 1], k, v, mask[r:r + 1], 0.125, threads=1)
        assert np.array_equal(got, ref[r:r + 1]), f"row {r}: off by {np.abs(got - ref[r:r + 1]).max()}"


@pytest.mark.parametrize("rows", (1, 9, 80))
def test_attention_rows_ignore_masked_cells_past_their_own(rows):
    """A KV view's length depends on the batch (other sequences' cells): the
    same rows over 700 cells and over 701-1,024, the rest masked, are the
    same bits (block edges and the padded tail)."""
    q, k, v, mask = _attention_case(rows)
    ref = ggml_ops.flash_attn(q, k, v, mask, 0.125, threads=2)
    rng = np.random.default_rng(5)
    for cells in (701, 703, 708, 757, 768, 1024):
        extra = cells - k.shape[1]
        pad = rng.standard_normal((k.shape[0], extra, k.shape[2])).astype(np.float16)
        pad[:, ::7] = np.nan                # a cell not yet written holds anything
        wide = np.full((rows, cells), -np.inf, np.float16)
        wide[:, :k.shape[1]] = mask
        got = ggml_ops.flash_attn(q, np.concatenate([k, pad], 1), np.concatenate([v, pad], 1),
                                  wide, 0.125, threads=2)
        diff = np.abs(got - ref).max()
        assert np.array_equal(got, ref), f"{rows} rows over {cells} cells: off by {diff}"


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("rows", (1, 63, 80, 512))
def test_attention_matches_a_float64_softmax(rows, shape):
    """softmax(q k^T / 8 + mask) v in float64 from the same float16 K and V:
    float32 sums and the vector exp leave under 1e-5 of max|v|."""
    q, k, v, mask = _attention_case(rows, shape=shape)
    got = ggml_ops.flash_attn(q, k, v, mask, 0.125, threads=2).astype(np.float64)
    group = q.shape[0] // k.shape[0]
    for h in range(q.shape[0]):
        kv = h // group
        s = q[h].astype(np.float64) @ k[kv].astype(np.float64).T * 0.125 + mask.astype(np.float64)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        want = (p / p.sum(axis=1, keepdims=True)) @ v[kv].astype(np.float64)
        err = np.abs(got[:, h] - want).max()
        assert err <= 1e-5 * np.abs(v).max(), f"head {h}: off by {err}"
