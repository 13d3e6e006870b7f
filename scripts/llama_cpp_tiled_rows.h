// llmctl: a few-row matmul for Q4_K and Q6_K weights in their file's layout
// that rounds exactly as ggml's tiled K-quant matmul does. Inserted into
// ggml-cpu/tiled/tiled.cpp by scripts/llama_cpp_slim.cmake, which also sends
// every row count of the tiled types down the tiled path.
//
// Why: ggml computes a weight matrix times 8+ activation rows with its tiled
// kernel and fewer rows with the one-row vec_dot kernel, and the two round
// differently, so a sequence's logits depended on how many rows shared its
// step (docs/exactness.md). The tiled kernel is itself batch-invariant: each
// output is built per 256-element block from exact integer sums, then
//   r = d0 * float(s1) [- dmin0 * float(s2), fused];  acc = fma(r, d1, acc)
// block after block, whatever tile the output fell in. Forced to one row it
// is exact but about 1.4x as slow as vec_dot (a 16-wide microtile mostly
// padding). This kernel takes 1-14 rows (more are faster in the tiles), or
// 1-7 where llama_cpp_tiled_lanes.h takes 8-64 (AVX-512 VNNI): it computes
// the same integers the vec_dot way, straight from the packed blocks, and
// applies the tiled kernel's float steps.
//
// Exactness: the integer sums are exact (no int16 pair can saturate: 4-bit
// and 6-bit codes times int8 stay under 2*63*127), so only the float steps
// matter, and they are the tiled kernel's, in its order. tests/test_kernels.py
// checks it bit for bit against the tiled path at 15+ rows.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <type_traits>

#define LLMCTL_GEMV_MAX_ROWS 14  // more rows are faster in the tiled kernel
#define LLMCTL_GEMV_CHUNK 16     // weight rows per work item, at least
// A step streams every weight from memory once; each block fetches the
// lines this far ahead, a block's worth at a time. (Whole rows two ahead,
// in one burst, stalled on long rows: an 8960-wide FFN-down matmul ran
// 1.3-1.8x slower than ggml's vec_dot on an EPYC, docs/measurements.md.)
#define LLMCTL_GEMV_AHEAD 2048

// Eight lanes' sums of v[0..8) into the lanes of one vector (lane u = v[u]).
static inline __m256i llmctl_sum8(const __m256i * v) {
    const __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                            _mm256_permute2x128_si256(u0, u1, 0x31));
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define LLMCTL_512 1
static inline __m256i llmctl_fold(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
#endif

// Per block, the integers the tiled kernel builds: s[r] (eight lanes that
// sum to s1) and m[r] (lanes that sum to s2 for Q4_K; to sum_k scale_k *
// bsum_k for Q6_K, whose codes carry +32), for each activation row r.
struct llmctl_block_ints {
    __m256i s[LLMCTL_GEMV_MAX_ROWS][8];
    __m256i m[LLMCTL_GEMV_MAX_ROWS][8];
    alignas(32) float d0[8];
    alignas(32) float dmin[8];
};

// A Q4_K block's eight scales in int16 lanes, its mins each twice (for one
// madd against the sixteen 16-element bsums) into mins, and its d and dmin
// into slot u.
static inline __m128i llmctl_q4k_head(const block_q4_K & x, int u, llmctl_block_ints & t,
                                      __m256i & mins) {
    uint32_t utmp[4];
    llmctl_q4k_scales(x, utmp);
    const __m128i m8 = _mm_loadl_epi64((const __m128i *) &utmp[2]);
    mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    t.d0[u] = _cvtsh_ss(x.data.data.d);
    t.dmin[u] = _cvtsh_ss(x.data.data.dmin);
    return _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *) &utmp[0]));
}

#ifdef LLMCTL_512
// For each activation row r, block b into slot u: s[r][u], eight lanes
// that sum to sum_k scale_k * (codes_k . a_k) (q: a block's unsigned codes,
// sv: each group's scale in int16 lanes), and m[r][u], lanes that sum to
// the sixteen bsums weighted by bw.
// (always_inline: without it, GCC compiled 5-row steps 6% slower.)
static inline __attribute__((always_inline)) void llmctl_rows_ints(
        const __m512i * q, const __m512i * sv, __m256i bw, const block_q8_K * const * y,
        int b, int n, int u, llmctl_block_ints & t) {
    for (int r = 0; r < n; ++r) {
        const block_q8_K & a = y[r][b];
        __m512i s = _mm512_setzero_si512();
        for (int j = 0; j < 4; ++j) {
            const __m512i p = _mm512_maddubs_epi16(q[j], _mm512_loadu_si512(a.qs + 64*j));
            s = _mm512_add_epi32(s, _mm512_madd_epi16(sv[j], p));
        }
        t.s[r][u] = llmctl_fold(s);
        t.m[r][u] = _mm256_madd_epi16(bw, _mm256_loadu_si256((const __m256i *) a.bsums));
    }
}

static inline void llmctl_ints(const block_q4_K & x, const block_q8_K * const * y, int b, int n,
                               int u, llmctl_block_ints & t) {
    __m256i mins;
    const __m128i sc = llmctl_q4k_head(x, u, t, mins);
    // pair j: elements 64j..64j+63, the low then the high nibbles of qs[32j..32j+31]
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512i q4[4], sv[4];
    for (int j = 0; j < 4; ++j) {
        const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (x.qs + 32*j)));
        q4[j] = _mm512_and_si512(_mm512_srlv_epi16(bits, shift), m4);
        const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16(2*j), _mm256_set1_epi16(2*j + 1), 1);
        sv[j] = _mm512_permutexvar_epi16(idx, _mm512_castsi128_si512(sc));
    }
    llmctl_rows_ints(q4, sv, mins, y, b, n, u, t);
}
// Q6_K: codes 0..63 (the stored value + 32); scale k covers elements 16k..16k+15.
static inline void llmctl_ints(const block_q6_K & x, const block_q8_K * const * y, int b, int n,
                               int u, llmctl_block_ints & t) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) x.scales));
    // quarter p: elements 64p..64p+63, scales 4p..4p+3 (eight int16 lanes each)
    const __m512i m4 = _mm512_set1_epi8(0xF), m2 = _mm512_set1_epi8(3);
    const __m512i sh02 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sh46 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    const __m512i lane8 = _mm512_srli_epi16(_mm512_set_epi16(
        31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
        15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3);
    __m512i q6[4], sv[4];
    for (int h = 0; h < 2; ++h) {
        const __m512i ql = _mm512_loadu_si512(x.ql + 64*h);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (x.qh + 32*h)));
        q6[2*h] = _mm512_or_si512(_mm512_and_si512(ql, m4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh02), m2), 4));
        q6[2*h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh46), m2), 4));
    }
    for (int p = 0; p < 4; ++p) {
        sv[p] = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_set1_epi16(4*p), lane8),
                                         _mm512_castsi256_si512(sc16));
    }
    t.d0[u] = _cvtsh_ss(x.d);
    t.dmin[u] = 0.0f;
    llmctl_rows_ints(q6, sv, sc16, y, b, n, u, t);
}

#else
// Scale k of the eight int16 scales in each half of sc, in every lane.
static inline __m256i llmctl_scale16(__m256i sc, int k) {
    return _mm256_shuffle_epi8(sc, _mm256_set1_epi16((int16_t) (0x0100 + 0x0202*k)));
}

// Rows of block b into slot u in groups of up to four: rows(R, y, s) sets a
// group's sums s[0..R), then m is each row's bsums weighted by bw.
template <typename F>
static inline __attribute__((always_inline)) void llmctl_row_groups(
        F rows, __m256i bw, const block_q8_K * const * y, int b, int n, int u, llmctl_block_ints & t) {
    for (int r0 = 0; r0 < n; r0 += 4) {
        __m256i s[4];
        const int k = std::min(4, n - r0);
        switch (k) {
            case 1: rows(std::integral_constant<int, 1>(), y + r0, s); break;
            case 2: rows(std::integral_constant<int, 2>(), y + r0, s); break;
            case 3: rows(std::integral_constant<int, 3>(), y + r0, s); break;
            default: rows(std::integral_constant<int, 4>(), y + r0, s); break;
        }
        for (int r = 0; r < k; ++r) {
            t.s[r0 + r][u] = s[r];
            t.m[r0 + r][u] = _mm256_madd_epi16(bw, _mm256_loadu_si256((const __m256i *) y[r0 + r][b].bsums));
        }
    }
}

// AVX2 alone has half the lanes and 16 registers: a weight block kept whole
// with its scale vectors spilled to the stack, and every step then waited on
// it (Qwen2.5-Coder-1.5B's one-row step took 1.6x as long as with ggml's
// repacked GEMV, docs/measurements.md). So each 64-code slice is unpacked
// once and used at once by up to four rows, whose sums stay in registers,
// with each scale vector one byte shuffle of a register.
template <int R>
static inline __attribute__((always_inline)) void llmctl_q4k_rows(
        const block_q4_K & x, __m256i sc, const block_q8_K * const * y, int b, __m256i * s) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int r = 0; r < R; ++r) {
        s[r] = _mm256_setzero_si256();
    }
    for (int j = 0; j < 4; ++j) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *) (x.qs + 32*j));
        const __m256i lo = _mm256_and_si256(bits, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        const __m256i sl = llmctl_scale16(sc, 2*j), sh = llmctl_scale16(sc, 2*j + 1);
        for (int r = 0; r < R; ++r) {
            const int8_t * a = y[r][b].qs + 64*j;
            const __m256i pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *) a)));
            const __m256i ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *) (a + 32))));
            s[r] = _mm256_add_epi32(s[r], _mm256_add_epi32(pl, ph));
        }
    }
}

static inline void llmctl_ints(const block_q4_K & x, const block_q8_K * const * y, int b, int n,
                               int u, llmctl_block_ints & t) {
    __m256i mins;
    const __m256i sc = _mm256_broadcastsi128_si256(llmctl_q4k_head(x, u, t, mins));
    llmctl_row_groups([&](auto R, const block_q8_K * const * yr, __m256i * s) __attribute__((always_inline)) {
        llmctl_q4k_rows<decltype(R)::value>(x, sc, yr, b, s);
    }, mins, y, b, n, u, t);
}

// Q6_K: codes 0..63 (the stored value + 32); scale k covers elements
// 16k..16k+15. Codes q of elements 32g..32g+31 (g = 4h + i) times each row's
// activations, with scale 2g on the first sixteen and 2g+1 on the rest.
template <int R>
static inline __attribute__((always_inline)) void llmctl_q6k_rows(
        const block_q6_K & x, const __m256i * sch, const block_q8_K * const * y, int b, __m256i * s) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    for (int r = 0; r < R; ++r) {
        s[r] = _mm256_setzero_si256();
    }
    for (int h = 0; h < 2; ++h) {
        const uint8_t * ql = x.ql + 64*h;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *) ql);
        const __m256i l1 = _mm256_loadu_si256((const __m256i *) (ql + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *) (x.qh + 32*h));
        for (int i = 0; i < 4; ++i) {
            const __m256i l = (i & 1) ? l1 : l0;
            const __m256i q = _mm256_or_si256(
                _mm256_and_si256(i < 2 ? l : _mm256_srli_epi16(l, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2*i), m2), 4));
            const __m256i sv = _mm256_shuffle_epi8(sch[h], _mm256_set_m128i(
                _mm_set1_epi16((int16_t) (0x0100 + 0x0202*(2*i + 1))),
                _mm_set1_epi16((int16_t) (0x0100 + 0x0202*(2*i)))));
            for (int r = 0; r < R; ++r) {
                const __m256i a = _mm256_loadu_si256((const __m256i *) (y[r][b].qs + 128*h + 32*i));
                s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(sv, _mm256_maddubs_epi16(q, a)));
            }
        }
    }
}

static inline void llmctl_ints(const block_q6_K & x, const block_q8_K * const * y, int b, int n,
                               int u, llmctl_block_ints & t) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) x.scales));
    // scales 0-7 in both halves, then 8-15: 128 elements each
    const __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                            _mm256_permute2x128_si256(sc16, sc16, 0x11)};
    t.d0[u] = _cvtsh_ss(x.d);
    t.dmin[u] = 0.0f;
    llmctl_row_groups([&](auto R, const block_q8_K * const * yr, __m256i * s) __attribute__((always_inline)) {
        llmctl_q6k_rows<decltype(R)::value>(x, sch, yr, b, s);
    }, sc16, y, b, n, u, t);
}
#endif

// One weight row times n activation rows into out[r], eight blocks at a
// time: their integer sums reduced together, then the tiled kernel's float
// steps, which are per lane the same in a vector (r = d0*float(s1), Q4_K's
// fused - dmin*float(s2)), and the fused acc = fma(r, d1, acc) block by
// block, in order, as the tiles accumulate.
template <typename B, int N>
static void llmctl_row(const B * x, const block_q8_K * const * y, int n_any, int nb, float * out) {
    constexpr bool q4 = std::is_same<B, block_q4_K>::value;
    const int n = N ? N : n_any;  // N: the row count known when compiled
    llmctl_block_ints t;
    float acc[LLMCTL_GEMV_MAX_ROWS] = {0};
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const int g = std::min(8, nb - b0);
        for (int u = 0; u < g; ++u) {
            const char * ahead = (const char *) (x + b0 + u) + LLMCTL_GEMV_AHEAD;
            for (size_t o = 0; o < sizeof(B); o += 64) {
                _mm_prefetch(ahead + o, _MM_HINT_T0);
            }
            llmctl_ints(x[b0 + u], y, b0 + u, n, u, t);
        }
        for (int u = g; u < 8; ++u) {
            for (int r = 0; r < n; ++r) {
                t.s[r][u] = t.m[r][u] = _mm256_setzero_si256();
            }
            t.d0[u] = t.dmin[u] = 0.0f;
        }
        for (int r = 0; r < n; ++r) {
            const __m256i s1 = llmctl_sum8(t.s[r]);
            const __m256i s2 = llmctl_sum8(t.m[r]);
            __m256 rv;
            if constexpr (q4) {
                rv = _mm256_mul_ps(_mm256_load_ps(t.d0), _mm256_cvtepi32_ps(s1));
                rv = _mm256_fnmadd_ps(_mm256_load_ps(t.dmin), _mm256_cvtepi32_ps(s2), rv);
            } else {
                rv = _mm256_mul_ps(_mm256_load_ps(t.d0),
                                   _mm256_cvtepi32_ps(_mm256_sub_epi32(s1, _mm256_slli_epi32(s2, 5))));
            }
            alignas(32) float rb[8];
            _mm256_store_ps(rb, rv);
            float a = acc[r];
            for (int u = 0; u < g; ++u) {
                a = fmaf(rb[u], y[r][b0 + u].d, a);
            }
            acc[r] = a;
        }
    }
    memcpy(out, acc, n*sizeof(float));
}

// On AVX2, 1-4 rows with the count compiled in, so that GCC unrolls the row
// loops and keeps a block's sums in registers. With AVX-512 it made no
// difference, or lost (scripts/bench_matmul.py).
template <typename B>
static inline void llmctl_row_n(const B * x, const block_q8_K * const * y, int n, int nb, float * out) {
#ifndef LLMCTL_512
    switch (n) {
        case 1: llmctl_row<B, 1>(x, y, 1, nb, out); return;
        case 2: llmctl_row<B, 2>(x, y, 2, nb, out); return;
        case 3: llmctl_row<B, 3>(x, y, 3, nb, out); return;
        case 4: llmctl_row<B, 4>(x, y, 4, nb, out); return;
        default: break;
    }
#endif
    llmctl_row<B, 0>(x, y, n, nb, out);
}

// The whole op for 1..LLMCTL_GEMV_MAX_ROWS activation rows of a 2-D matmul
// with Q4_K or Q6_K weights; false where it does not apply. Called by every
// thread after src1 is in q8_K; rows are handed out in chunks, and each
// output depends on nothing but its weight row and activation row.
template <typename B>
static bool llmctl_tiled_rows(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                              const void * wdata, size_t row_size) {
    constexpr bool q4 = std::is_same<B, block_q4_K>::value;
    constexpr bool q6 = std::is_same<B, block_q6_K>::value;
    if constexpr (!q4 && !q6) {
        return false;
    } else {
        const struct ggml_tensor * src0 = dst->src[0];
        const struct ggml_tensor * src1 = dst->src[1];
        const int64_t n = src1->ne[1];
        if (src1->ne[2] != 1 || src1->ne[3] != 1 || src0->ne[2] != 1 || src0->ne[3] != 1) {
            return false;
        }
#ifdef LLMCTL_LANES
        {   // 8-64 rows (llama_cpp_tiled_lanes.h), in the tiled kernel's
            // per-thread workspace, found where its driver finds it
            char * ws = (char *) params->wdata;
            if (src1->type != GGML_TYPE_Q8_K) {
                ws += GGML_PAD(ggml_row_size(GGML_TYPE_Q8_K, ggml_nelements(src1)), 64);
            }
            ws = (char *) (((uintptr_t) ws + 63) & ~(uintptr_t) 63);
            if (llmctl_tiled_lanes<B>(params, dst, wdata, row_size, ws, params->nth*ggml_tiled_ws_size())) {
                return true;
            }
        }
#endif
        if (n > LLMCTL_GEMV_MAX_ROWS) {
            return false;
        }
        const int nb = (int) (src0->ne[0] / QK_K);
        const block_q8_K * y[LLMCTL_GEMV_MAX_ROWS];
        for (int64_t r = 0; r < n; ++r) {
            y[r] = (const block_q8_K *) ((const char *) wdata + r*row_size);
        }
        const int64_t nrows = src0->ne[1];
        // eight work items per thread: few enough that the shared counter
        // costs nothing, enough to even out a slow core
        const int64_t per = std::max<int64_t>(LLMCTL_GEMV_CHUNK,
            (nrows/(8*params->nth) + LLMCTL_GEMV_CHUNK - 1)/LLMCTL_GEMV_CHUNK*LLMCTL_GEMV_CHUNK);
        const int64_t nchunks = (nrows + per - 1)/per;
        float out[LLMCTL_GEMV_MAX_ROWS];
        for (int64_t c = params->ith; c < nchunks; c = ggml_threadpool_chunk_add(params->threadpool, 1)) {
            const int64_t i1 = std::min<int64_t>(nrows, (c + 1)*per);
            for (int64_t i = c*per; i < i1; ++i) {
                const B * x = (const B *) ((const char *) src0->data + i*src0->nb[1]);
                llmctl_row_n<B>(x, y, (int) n, nb, out);
                for (int64_t r = 0; r < n; ++r) {
                    *(float *) ((char *) dst->data + i*dst->nb[0] + r*dst->nb[1]) = out[r];
                }
            }
            if (params->nth >= nchunks) {
                break;
            }
        }
        return true;
    }
}
#else
template <typename B>
static bool llmctl_tiled_rows(const struct ggml_compute_params *, struct ggml_tensor *, const void *,
                              size_t) {
    return false;
}
#endif
