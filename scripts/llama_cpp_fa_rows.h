// llmctl: a CPU flash-attention kernel in which a query row's result does
// not depend on its batch, inserted into ggml-cpu/ops.cpp by
// scripts/llama_cpp_slim.cmake ahead of
// ggml_compute_forward_flash_attn_ext_f16_one_chunk, which calls it for
// every chunk of query rows: one row, a decode step's heads, a 512-row
// prompt chunk.
//
// Why: ggml has two CPU kernels that round differently (a per-row one that
// visits the KV a cell at a time, slow over a long KV, and a 64-row tile
// that converts K and the mask one scalar at a time), so a prompt's rows
// would depend on how it was cut, and neither is fast at a long prompt
// (docs/measurements.md, "Exact by default, against llama-server").
//
// How: up to LLMCTL_FA_GROUP query rows that read one KV head (a prompt
// chunk's rows of one head and the next heads' under grouped-query
// attention, or a decode step's heads) walk the KV in blocks of
// LLMCTL_FA_BLOCK cells at fixed offsets from cell 0. Per block, K is
// converted to f32 and transposed once for the group, and V converted once;
// then small register tiles of rows multiply them as a matrix product does
// (the scores, then the weighted sum of V), and each row's online softmax
// runs between the two, a vector of cells at a time.
//
// Batch invariance (docs/exactness.md) holds by construction, not by
// testing alone:
// - a score is one fused multiply-add chain over the head's dimensions in
//   order, and each output element one chain over the block's cells in
//   order, whichever tile or row count computes it;
// - a block's softmax sum adds its cells in fixed vector lanes, then a
//   fixed tree; masked and padded cells contribute exact zeros (their V is
//   made finite first, so 0 * V is 0), and an accumulator that starts at
//   +0 never holds -0, so adding them changes no bit;
// - blocks a row has no unmasked cell in leave its state untouched, so
//   skipping them for some rows and not others changes nothing;
// - cells past the KV view (its padded length depends on the batch) are
//   masked, never read.
// So a row's result depends only on its query and its sequence's KV, never
// on the rows or sequences beside it, the thread count, or the view's
// length.
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

#define LLMCTL_FA_BLOCK 64
// Rows that share one walk over the KV (and one conversion of each block).
#define LLMCTL_FA_GROUP 128

// The vector operations (llmctl_v, LLMCTL_W lanes, LLMCTL_TILE_R rows per
// tile): scripts/llama_cpp_slim.cmake puts llama_cpp_fa_simd.h in here.
#include "llama_cpp_fa_simd.h"

// The block's K cells [0, n) as f32, transposed (kt[d*BLOCK + c]), and its V
// cells as f32 (vf[c*DV + d]) with non-finite values as zero (a cell not
// yet written may hold anything; its weight is 0). Cells n.. are zeros.
static void llmctl_fa_convert(const char * kb, size_t nbk1, const char * vb, size_t nbv1,
                              int64_t DK, int64_t DV, int64_t n, float * kt, float * vf) {
    // The next block's cells on their way from memory while this one is
    // converted: a decode step over a long KV is bound by reading it.
    for (int64_t c = LLMCTL_FA_BLOCK; c < 2*LLMCTL_FA_BLOCK; ++c) {
        for (int64_t b = 0; b < DK*(int64_t) sizeof(ggml_fp16_t); b += 64) {
            _mm_prefetch(kb + c*nbk1 + b, _MM_HINT_T0);
        }
        for (int64_t b = 0; b < DV*(int64_t) sizeof(ggml_fp16_t); b += 64) {
            _mm_prefetch(vb + c*nbv1 + b, _MM_HINT_T0);
        }
    }
    for (int64_t c0 = 0; c0 < LLMCTL_FA_BLOCK; c0 += 8) {
        for (int64_t d0 = 0; d0 < DK; d0 += 8) {
            __m256 r[8];
            for (int u = 0; u < 8; ++u) {
                r[u] = c0 + u < n ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)
                                        ((const ggml_fp16_t *) (kb + (c0 + u)*nbk1) + d0)))
                                  : _mm256_setzero_ps();
            }
            llmctl_t8(r);
            for (int u = 0; u < 8; ++u) {
                _mm256_storeu_ps(kt + (d0 + u)*LLMCTL_FA_BLOCK + c0, r[u]);
            }
        }
    }
    for (int64_t c = 0; c < n; ++c) {
        const ggml_fp16_t * vr = (const ggml_fp16_t *) (vb + c*nbv1);
        for (int64_t d = 0; d < DV; d += LLMCTL_W) {
            llmctl_vstore(vf + c*DV + d, llmctl_vfinite(llmctl_vf16(vr + d)));
        }
    }
    if (n < LLMCTL_FA_BLOCK) {
        memset(vf + n*DV, 0, (LLMCTL_FA_BLOCK - n)*DV*sizeof(float));
    }
}

// Scores of R rows (queries q[0..R)) against the block's cells:
// s[r*BLOCK + c] = sum over d, in order, of q[r][d]*K[c][d], one fused
// chain per score.
template <int R>
static void llmctl_fa_qk(const float * const * q, const float * kt, int64_t DK, float * s) {
    for (int c0 = 0; c0 < LLMCTL_FA_BLOCK; c0 += LLMCTL_NV*LLMCTL_W) {
        llmctl_v acc[R][LLMCTL_NV];
        for (int r = 0; r < R; ++r) {
            for (int j = 0; j < LLMCTL_NV; ++j) {
                acc[r][j] = llmctl_vzero();
            }
        }
        for (int64_t d = 0; d < DK; ++d) {
            const float * kd = kt + d*LLMCTL_FA_BLOCK + c0;
            llmctl_v kv[LLMCTL_NV];
            for (int j = 0; j < LLMCTL_NV; ++j) {
                kv[j] = llmctl_vload(kd + j*LLMCTL_W);
            }
            for (int r = 0; r < R; ++r) {
                const llmctl_v qb = llmctl_vset(q[r][d]);
                for (int j = 0; j < LLMCTL_NV; ++j) {
                    acc[r][j] = llmctl_vfma(qb, kv[j], acc[r][j]);
                }
            }
        }
        for (int r = 0; r < R; ++r) {
            for (int j = 0; j < LLMCTL_NV; ++j) {
                llmctl_vstore(s + r*LLMCTL_FA_BLOCK + c0 + j*LLMCTL_W, acc[r][j]);
            }
        }
    }
}

// R rows' outputs o[r][0..DV) += sum over the cells [0, n), in order, of
// p[r*BLOCK + c]*V[c]: one fused chain per output element.
template <int R, int NV>
static void llmctl_fa_pv_part(float * const * o, const float * p, const float * vf, int64_t DV,
                              int64_t d0, int64_t n) {
    llmctl_v acc[R][NV];
    for (int r = 0; r < R; ++r) {
        for (int j = 0; j < NV; ++j) {
            acc[r][j] = llmctl_vload(o[r] + d0 + j*LLMCTL_W);
        }
    }
    for (int64_t c = 0; c < n; ++c) {
        llmctl_v vv[NV];
        for (int j = 0; j < NV; ++j) {
            vv[j] = llmctl_vload(vf + c*DV + d0 + j*LLMCTL_W);
        }
        for (int r = 0; r < R; ++r) {
            const llmctl_v pb = llmctl_vset(p[r*LLMCTL_FA_BLOCK + c]);
            for (int j = 0; j < NV; ++j) {
                acc[r][j] = llmctl_vfma(pb, vv[j], acc[r][j]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int j = 0; j < NV; ++j) {
            llmctl_vstore(o[r] + d0 + j*LLMCTL_W, acc[r][j]);
        }
    }
}

template <int R>
static void llmctl_fa_pv(float * const * o, const float * p, const float * vf, int64_t DV,
                         int64_t n) {
    int64_t d0 = 0;
    for (; d0 + LLMCTL_NV*LLMCTL_W <= DV; d0 += LLMCTL_NV*LLMCTL_W) {
        llmctl_fa_pv_part<R, LLMCTL_NV>(o, p, vf, DV, d0, n);
    }
    for (; d0 < DV; d0 += LLMCTL_W) {
        llmctl_fa_pv_part<R, 1>(o, p, vf, DV, d0, n);
    }
}

// One row's softmax over the block: s (its BLOCK scores) becomes its
// weights, and its state st = [M, S, O[DV]] is rescaled where the block
// raises its maximum. m: the mask's BLOCK cells (-inf past the KV view), or
// null for none. A block with no unmasked cell leaves weights of +0 and the
// state untouched.
static void llmctl_fa_softmax(float * s, const ggml_fp16_t * m, float slope, float scale,
                              float softcap, float * st, int64_t DV) {
    const llmctl_v vs = llmctl_vset(scale), vsl = llmctl_vset(slope);
    llmctl_v vmax = llmctl_vset(-INFINITY);
    for (int64_t c = 0; c < LLMCTL_FA_BLOCK; c += LLMCTL_W) {
        llmctl_v x = llmctl_vload(s + c);
        if (softcap != 0.0f) {
            float t[LLMCTL_W];
            llmctl_vstore(t, x);
            for (int i = 0; i < LLMCTL_W; ++i) {
                t[i] = softcap*tanhf(t[i]*scale);
            }
            x = llmctl_vload(t);
        } else {
            x = llmctl_vmul(x, vs);
        }
        if (m) {
            x = llmctl_vmask_add(x, llmctl_vmul(vsl, llmctl_vf16(m + c)));
        }
        llmctl_vstore(s + c, x);
        vmax = llmctl_vmax(vmax, x);
    }
    const float bmax = llmctl_vmaxall(vmax);
    if (bmax == -INFINITY) {
        memset(s, 0, LLMCTL_FA_BLOCK*sizeof(float));
        return;
    }
    if (bmax > st[0]) {
        if (st[0] != -INFINITY) {
            const float ms = expf(st[0] - bmax);
            for (int64_t d = 0; d < DV; ++d) {
                st[2 + d] *= ms;
            }
            st[1] *= ms;
        }
        st[0] = bmax;
    }
    const llmctl_v vm = llmctl_vset(st[0]);
    llmctl_v vsum = llmctl_vzero();
    for (int64_t c = 0; c < LLMCTL_FA_BLOCK; c += LLMCTL_W) {
        const llmctl_v x = llmctl_vload(s + c);
        const llmctl_v p = llmctl_vzero_ninf(llmctl_vexp(llmctl_vsub(x, vm)), x);
        llmctl_vstore(s + c, p);
        vsum = llmctl_vadd(vsum, p);
    }
    st[1] += llmctl_vsum(vsum);
}

static inline bool llmctl_fa_rows_ok(const ggml_tensor * q, const ggml_tensor * k,
                                     const ggml_tensor * v, const ggml_tensor * sinks,
                                     int64_t DK, int64_t DV, bool partials) {
    return !partials && sinks == nullptr && q->type == GGML_TYPE_F32 &&
           k->type == GGML_TYPE_F16 && v->type == GGML_TYPE_F16 && DK % 8 == 0 &&
           DV % LLMCTL_W == 0 && DK <= 1024 && DV <= 1024;
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

// Floats of scratch the kernel needs per thread: the converted K and V
// blocks, the group's scores, a padded mask block, and the rows' states.
// scripts/llama_cpp_slim.cmake writes the same sum into ggml's graph plan,
// with LLMCTL_FA_BLOCK and LLMCTL_FA_GROUP read from their #defines above.
static inline size_t llmctl_fa_floats(int64_t DK, int64_t DV) {
    return (DK + DV + LLMCTL_FA_GROUP + 1)*LLMCTL_FA_BLOCK + LLMCTL_FA_GROUP*(DV + 2);
}

// The blocks [*lo, *hi) that hold a row's unmasked cells among [0, n_kv)
// (m null: all of them); empty when it has none. A row's state is the same
// whether the blocks between are visited or not (the kernel's comment).
static void llmctl_fa_range(const ggml_fp16_t * m, int64_t n_kv, int64_t * lo, int64_t * hi) {
    if (m == nullptr) {
        *lo = 0;
        *hi = (n_kv + LLMCTL_FA_BLOCK - 1)/LLMCTL_FA_BLOCK;
        return;
    }
    const uint16_t ninf = 0xFC00;   // f16 -inf
    int64_t first = 0, last = n_kv - 1;
    while (first < n_kv && m[first] == ninf) {
        ++first;
    }
    while (last > first && m[last] == ninf) {
        --last;
    }
    *lo = first/LLMCTL_FA_BLOCK;
    *hi = first < n_kv ? last/LLMCTL_FA_BLOCK + 1 : *lo;
}

#define LLMCTL_FA_TILE(fn, R, ...) \
    switch (R) { \
        case 1: fn<1>(__VA_ARGS__); break; \
        case 2: fn<2>(__VA_ARGS__); break; \
        case 3: fn<3>(__VA_ARGS__); break; \
        LLMCTL_FA_TILE_WIDE(fn, __VA_ARGS__) \
        default: GGML_ABORT("llmctl: tile of %d rows", (int) (R)); \
    }
#if LLMCTL_TILE_R == 6
#define LLMCTL_FA_TILE_WIDE(fn, ...) \
        case 4: fn<4>(__VA_ARGS__); break; \
        case 5: fn<5>(__VA_ARGS__); break; \
        case 6: fn<6>(__VA_ARGS__); break;
#else
#define LLMCTL_FA_TILE_WIDE(fn, ...)
#endif

// The block's mask for one row: m + c0 where the block lies inside the
// view, else a copy padded with -inf (cells past the view are masked).
static const ggml_fp16_t * llmctl_fa_block_mask(const ggml_fp16_t * m, int64_t c0, int64_t n,
                                                ggml_fp16_t * pad) {
    if (n == LLMCTL_FA_BLOCK) {
        return m ? m + c0 : nullptr;
    }
    for (int64_t c = 0; c < LLMCTL_FA_BLOCK; ++c) {
        pad[c] = c < n ? (m ? m[c0 + c] : (ggml_fp16_t) 0) : (ggml_fp16_t) 0xFC00;
    }
    return pad;
}

// n_rows rows (queries qs, masks ms or null, slopes) over the cells
// [0, n_kv) of one KV head: each row's [M, S, VKQ[DV]] (unnormalised, as
// ggml's per-cell loop leaves them) at out + r*(DV + 2). work: the scratch
// llmctl_fa_floats names, less the states.
static void llmctl_fa_group(const float * const * qs, const ggml_fp16_t * const * ms,
                            const float * slopes, int n_rows, const char * kb, size_t nbk1,
                            const char * vb, size_t nbv1, int64_t DK, int64_t DV, int64_t n_kv,
                            float scale, float softcap, float * work, float * out) {
    float * kt = work;
    float * vf = kt + DK*LLMCTL_FA_BLOCK;
    float * p = vf + LLMCTL_FA_BLOCK*DV;
    ggml_fp16_t * pad = (ggml_fp16_t *) (p + LLMCTL_FA_GROUP*LLMCTL_FA_BLOCK);
    int64_t lo[LLMCTL_FA_GROUP], hi[LLMCTL_FA_GROUP];
    float * o[LLMCTL_FA_GROUP];
    int64_t nb = 0;
    for (int r = 0; r < n_rows; ++r) {
        float * st = out + r*(DV + 2);
        st[0] = -INFINITY;
        st[1] = 0.0f;
        memset(st + 2, 0, DV*sizeof(float));
        o[r] = st + 2;
        llmctl_fa_range(ms[r], n_kv, &lo[r], &hi[r]);
        nb = std::max(nb, hi[r]);
    }
    // Tiles of rows as even as the register tile allows (7 rows: 4 and 3).
    const int ntile = (n_rows + LLMCTL_TILE_R - 1)/LLMCTL_TILE_R;
    const int per = (n_rows + ntile - 1)/ntile;
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = b*LLMCTL_FA_BLOCK, n = std::min<int64_t>(LLMCTL_FA_BLOCK, n_kv - c0);
        bool converted = false;
        for (int t0 = 0; t0 < n_rows; t0 += per) {
            const int R = std::min(per, n_rows - t0);
            bool active = false;
            for (int r = t0; r < t0 + R; ++r) {
                active |= lo[r] <= b && b < hi[r];
            }
            if (!active) {
                continue;
            }
            if (!converted) {
                llmctl_fa_convert(kb + c0*nbk1, nbk1, vb + c0*nbv1, nbv1, DK, DV, n, kt, vf);
                converted = true;
            }
            float * pt = p + t0*LLMCTL_FA_BLOCK;
            LLMCTL_FA_TILE(llmctl_fa_qk, R, qs + t0, kt, DK, pt)
            for (int r = t0; r < t0 + R; ++r) {
                llmctl_fa_softmax(p + r*LLMCTL_FA_BLOCK, llmctl_fa_block_mask(ms[r], c0, n, pad),
                                  slopes[r], scale, softcap, out + r*(DV + 2), DV);
            }
            LLMCTL_FA_TILE(llmctl_fa_pv, R, o + t0, pt, vf, DV, n)
        }
    }
}
#else
static inline bool llmctl_fa_rows_ok(const ggml_tensor *, const ggml_tensor *,
                                     const ggml_tensor *, const ggml_tensor *, int64_t, int64_t,
                                     bool) {
    return false;
}
#define LLMCTL_FA_GROUP 1
static inline size_t llmctl_fa_floats(int64_t, int64_t) { return 0; }
static int llmctl_fa_gather(const ggml_tensor *, const ggml_tensor *, const ggml_tensor *,
                            const ggml_tensor *, int, int, float, float, float, uint32_t,
                            const float **, const ggml_fp16_t **, float *) {
    return 0;
}
static void llmctl_fa_group(const float * const *, const ggml_fp16_t * const *, const float *,
                            int, const char *, size_t, const char *, size_t, int64_t, int64_t,
                            int64_t, float, float, float *, float *) {}
#endif
