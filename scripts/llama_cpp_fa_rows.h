// llmctl: a faster per-row CPU flash-attention kernel, inserted into
// ggml-cpu/ops.cpp by scripts/llama_cpp_slim.cmake ahead of
// ggml_compute_forward_flash_attn_ext_f16_one_chunk, which calls it.
//
// Why: ggml's kernel for chunks under 64 query rows (every decode step,
// every short prompt chunk) visits the KV one cell at a time: a function
// call for the dot product, a scalar expf, and an f16 accumulator that is
// converted both ways per cell. Over a coding agent's 9.5k-token prompt it
// made each decode step about twice as slow as attention without flash
// attention, so the default could not use flash attention, which is faster
// at every prefill and at many short requests (docs/measurements.md).
//
// How: up to LLMCTL_FA_GROUP query rows that read one KV head at a time (a
// prompt chunk's rows of one head, or a decode step's heads that share a KV
// head under grouped-query attention), so a block of LLMCTL_FA_BLOCK cells
// of K and V is read from memory once for all of them;
// per row and block three passes: the scores, eight cells per step with the
// horizontal sums batched; their scale, mask and exponentials, eight cells
// per step, the softmax sum in eight lanes; then V accumulated in f32.
// Online softmax rescales between blocks, as ggml's does between cells. It
// takes chunks of every size, a 512-row prompt chunk too, where ggml would
// take its 64-row tiled kernel (within 3% of it after 2,000 and 6,000
// tokens, docs/measurements.md), so no cut of a prompt changes its rows.
//
// Batch invariance (docs/exactness.md) is kept by construction: each cell's
// score uses one summation order whether it falls in an eight-cell group or
// in the tail, the tail's scale and mask go through the eight-cell path
// (padded with masked cells), the softmax sum's lanes are fixed cell offsets
// within a block and padded cells add exact zeros, block edges are fixed
// cell offsets, and masked cells contribute exact zeros. So a row's result
// depends only on its query and its sequence's KV, never on the rows or
// sequences beside it, the thread count, or the KV view's padded length.
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

#define LLMCTL_FA_BLOCK 256

// exp(x) for eight lanes (the Cephes polynomial); exact zeros are the
// caller's business (masked cells).
static inline __m256 llmctl_exp8(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, z, x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_cvttps_epi32(fx);
    e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(0x7f)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Eight f16 K or V values as f32.
static inline __m256 llmctl_load8(const ggml_fp16_t * p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p));
}

// One cell's score, summed in the same order as the eight-cell path below.
static inline float llmctl_dot_one(const float * q, const ggml_fp16_t * k, int64_t DK) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < DK; d += 8) {
        acc = _mm256_fmadd_ps(llmctl_load8(k + d), _mm256_loadu_ps(q + d), acc);
    }
    float t[8];
    _mm256_storeu_ps(t, acc);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

// Eight consecutive cells' scores into out[0..8).
static inline void llmctl_dot_eight(const float * q, const char * k0, size_t nbk1, int64_t DK,
                                    float * out) {
    __m256 acc[8];
    for (int u = 0; u < 8; ++u) {
        acc[u] = _mm256_setzero_ps();
    }
    for (int64_t d = 0; d < DK; d += 8) {
        const __m256 qd = _mm256_loadu_ps(q + d);
        for (int u = 0; u < 8; ++u) {
            acc[u] = _mm256_fmadd_ps(llmctl_load8((const ggml_fp16_t *) (k0 + u*nbk1) + d), qd, acc[u]);
        }
    }
    // Lane l of each hadd pair sums (x0+x1), (x2+x3) and so on; the result
    // for cell u is ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)), llmctl_dot_one's order.
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
    const __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
    const __m256 hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
    _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
}

// scores[j] = scores[j]*scale + slope*m[j] for the cells [0, n) of a block,
// -inf where the mask is (whatever the score: even NaN), eight cells per
// step; scores past n, to the next eight, must be -inf already. Returns
// the largest. m may be null (no mask).
static inline float llmctl_scale_mask(float * scores, int64_t n, const ggml_fp16_t * m,
                                      float slope, float scale) {
    const __m256 vs = _mm256_set1_ps(scale), vsl = _mm256_set1_ps(slope);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = ninf;
    for (int64_t j = 0; j < n; j += 8) {
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(scores + j), vs);
        if (m) {
            __m128i mh;
            if (j + 8 <= n) {
                mh = _mm_loadu_si128((const __m128i *) (m + j));
            } else {
                ggml_fp16_t pad[8];
                for (int64_t u = 0; u < 8; ++u) {
                    pad[u] = j + u < n ? m[j + u] : (ggml_fp16_t) 0xFC00;   // -inf
                }
                mh = _mm_loadu_si128((const __m128i *) pad);
            }
            const __m256 mv = _mm256_mul_ps(vsl, _mm256_cvtph_ps(mh));
            const __m256 masked = _mm256_cmp_ps(mv, ninf, _CMP_EQ_OQ);
            s = _mm256_blendv_ps(_mm256_add_ps(s, mv), ninf, masked);
        }
        _mm256_storeu_ps(scores + j, s);
        vmax = _mm256_max_ps(vmax, s);
    }
    float t[8];
    _mm256_storeu_ps(t, vmax);
    float best = t[0];
    for (int u = 1; u < 8; ++u) {
        best = std::max(best, t[u]);
    }
    return best;
}

static inline bool llmctl_fa_rows_ok(const ggml_tensor * q, const ggml_tensor * k,
                                     const ggml_tensor * v, const ggml_tensor * sinks,
                                     int64_t DK, int64_t DV, bool partials) {
    return !partials && sinks == nullptr && q->type == GGML_TYPE_F32 &&
           k->type == GGML_TYPE_F16 && v->type == GGML_TYPE_F16 && DK % 8 == 0 &&
           DV % 8 == 0 && DK <= 1024 && DV <= 1024;
}

// Rows that read one KV head computed together, so that each block of K
// and V is read from memory once for all of them (llmctl_fa_gather).
#define LLMCTL_FA_GROUP 32

// The n cells of one block (K rows kb, kb + nbk1, ...; V likewise; mask
// mp, or null) of one query row into its state st = [M, S, VKQ[DV]].
static void llmctl_fa_block(const float * q, const char * kb, size_t nbk1, const char * vb,
                            size_t nbv1, int64_t DK, int64_t DV, int64_t n,
                            const ggml_fp16_t * mp, float slope, float scale, float softcap,
                            float * scores, float * st) {
    float * VKQ32 = st + 2;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        llmctl_dot_eight(q, kb + j*nbk1, nbk1, DK, scores + j);
    }
    for (; j < n; ++j) {
        scores[j] = llmctl_dot_one(q, (const ggml_fp16_t *) (kb + j*nbk1), DK);
    }
    // Cells past n (to the next eight) are masked: the passes below run
    // eight cells at a time over them.
    for (j = n; j % 8 != 0; ++j) {
        scores[j] = -INFINITY;
    }
    float bmax = -INFINITY;
    if (softcap == 0.0f) {
        bmax = llmctl_scale_mask(scores, n, mp, slope, scale);
    } else {
        for (j = 0; j < n; ++j) {
            const float mv = mp ? slope*GGML_CPU_FP16_TO_FP32(mp[j]) : 0.0f;
            // A masked cell may hold anything (even NaN): it is -inf, exactly.
            const float s = softcap*tanhf(scores[j]*scale);
            scores[j] = mv == -INFINITY ? -INFINITY : s + mv;
            bmax = std::max(bmax, scores[j]);
        }
    }
    if (bmax == -INFINITY) {
        return;
    }
    if (bmax > st[0]) {
        const float ms = st[0] == -INFINITY ? 0.0f : expf(st[0] - bmax);
        for (int64_t d = 0; d < DV; ++d) {
            VKQ32[d] *= ms;
        }
        st[1] *= ms;
        st[0] = bmax;
    }
    const __m256 vm = _mm256_set1_ps(st[0]);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (j = 0; j < n; j += 8) {
        const __m256 s = _mm256_loadu_ps(scores + j);
        const __m256 keep = _mm256_cmp_ps(s, ninf, _CMP_NEQ_OQ);
        _mm256_storeu_ps(scores + j, _mm256_and_ps(llmctl_exp8(_mm256_sub_ps(s, vm)), keep));
    }
    // The block's sum in eight lanes, cell j in lane j % 8, then a fixed
    // reduction: padded and masked cells add exact zeros.
    __m256 vsum = _mm256_setzero_ps();
    for (j = 0; j < n; j += 8) {
        vsum = _mm256_add_ps(vsum, _mm256_loadu_ps(scores + j));
    }
    float t8[8];
    _mm256_storeu_ps(t8, vsum);
    st[1] += ((t8[0] + t8[1]) + (t8[2] + t8[3])) + ((t8[4] + t8[5]) + (t8[6] + t8[7]));
    for (int64_t d0 = 0; d0 < DV; d0 += 64) {
        const int64_t w = std::min<int64_t>(64, DV - d0);
        __m256 acc[8];
        for (int64_t u = 0; u < w/8; ++u) {
            acc[u] = _mm256_loadu_ps(VKQ32 + d0 + 8*u);
        }
        for (j = 0; j < n; ++j) {
            if (scores[j] == 0.0f) {
                continue;
            }
            const __m256 p = _mm256_set1_ps(scores[j]);
            const ggml_fp16_t * vr = (const ggml_fp16_t *) (vb + j*nbv1) + d0;
            for (int64_t u = 0; u < w/8; ++u) {
                acc[u] = _mm256_fmadd_ps(llmctl_load8(vr + 8*u), p, acc[u]);
            }
        }
        for (int64_t u = 0; u < w/8; ++u) {
            _mm256_storeu_ps(VKQ32 + d0 + 8*u, acc[u]);
        }
    }
}

// Rows ir, ir + 1, ... of a flash-attention op (up to LLMCTL_FA_GROUP, and
// ir1) that read the same K and V as row ir: the rest of its head's rows,
// and the next heads' where they share its KV head (grouped-query
// attention: a decode step's heads then read their KV once, not once
// each). Their queries, masks and ALiBi slopes into qs, ms and slopes;
// returns how many.
static int llmctl_fa_gather(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v,
                            const ggml_tensor * mask, int ir, int ir1, float max_bias, float m0,
                            float m1, uint32_t n_head_log2, const float ** qs,
                            const ggml_fp16_t ** ms, float * slopes) {
    const int64_t neq1 = q->ne[1], neq2 = q->ne[2];
    const int64_t rk2 = neq2/k->ne[2], rk3 = q->ne[3]/k->ne[3];
    const int64_t rv2 = neq2/v->ne[2], rv3 = q->ne[3]/v->ne[3];
    int n = 0;
    int64_t kv[4] = {-1, -1, -1, -1};
    for (int r = ir; r < ir1 && n < LLMCTL_FA_GROUP; ++r) {
        const int64_t iq3 = r/(neq2*neq1);
        const int64_t iq2 = (r - iq3*neq2*neq1)/neq1;
        const int64_t iq1 = r - iq3*neq2*neq1 - iq2*neq1;
        const int64_t here[4] = {iq2/rk2, iq3/rk3, iq2/rv2, iq3/rv3};
        if (n > 0 && memcmp(here, kv, sizeof(kv)) != 0) {
            break;
        }
        memcpy(kv, here, sizeof(kv));
        qs[n] = (const float *) ((const char *) q->data + iq1*q->nb[1] + iq2*q->nb[2] + iq3*q->nb[3]);
        ms[n] = mask ? (const ggml_fp16_t *) ((const char *) mask->data + iq1*mask->nb[1] +
                                              (iq2 % mask->ne[2])*mask->nb[2] +
                                              (iq3 % mask->ne[3])*mask->nb[3]) : nullptr;
        const uint32_t h = (uint32_t) iq2;
        slopes[n] = max_bias > 0.0f ? h < n_head_log2 ? powf(m0, h + 1)
                                                      : powf(m1, 2*(h - n_head_log2) + 1)
                                    : 1.0f;
        ++n;
    }
    return n;
}

// n_rows rows (queries qs, masks ms or null, slopes) over the cells
// [0, n_kv) of one KV head: each row's [M, S, VKQ[DV]] (unnormalised, as
// ggml's per-cell loop leaves them) at out + r*(DV + 2). A row's result is
// the same in any group: its own state, updated block by block in order.
static void llmctl_fa_group(const float * const * qs, const ggml_fp16_t * const * ms,
                            const float * slopes, int n_rows, const char * kb, size_t nbk1,
                            const char * vb, size_t nbv1, int64_t DK, int64_t DV, int64_t n_kv,
                            float scale, float softcap, float * scores, float * out) {
    for (int r = 0; r < n_rows; ++r) {
        float * st = out + r*(DV + 2);
        st[0] = -INFINITY;
        st[1] = 0.0f;
        memset(st + 2, 0, DV*sizeof(float));
    }
    for (int64_t c0 = 0; c0 < n_kv; c0 += LLMCTL_FA_BLOCK) {
        const int64_t n = std::min<int64_t>(LLMCTL_FA_BLOCK, n_kv - c0);
        for (int r = 0; r < n_rows; ++r) {
            llmctl_fa_block(qs[r], kb + c0*nbk1, nbk1, vb + c0*nbv1, nbv1, DK, DV, n,
                            ms[r] ? ms[r] + c0 : nullptr, slopes[r], scale, softcap, scores,
                            out + r*(DV + 2));
        }
    }
}
#else
static inline bool llmctl_fa_rows_ok(const ggml_tensor *, const ggml_tensor *,
                                     const ggml_tensor *, const ggml_tensor *, int64_t, int64_t,
                                     bool) {
    return false;
}
#define LLMCTL_FA_BLOCK 0
#define LLMCTL_FA_GROUP 1
static int llmctl_fa_gather(const ggml_tensor *, const ggml_tensor *, const ggml_tensor *,
                            const ggml_tensor *, int, int, float, float, float, uint32_t,
                            const float **, const ggml_fp16_t **, float *) {
    return 0;
}
static void llmctl_fa_group(const float * const *, const ggml_fp16_t * const *, const float *,
                            int, const char *, size_t, const char *, size_t, int64_t, int64_t,
                            int64_t, float, float, float *, float *) {}
#endif
