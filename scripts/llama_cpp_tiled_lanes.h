// llmctl: 8-64 activation rows of a Q4_K or Q6_K matmul in the weights'
// file layout, with AVX-512 VNNI, rounding exactly as ggml's tiled K-quant
// matmul does. Inserted into ggml-cpu/tiled/tiled.cpp, before
// llama_cpp_tiled_rows.h (whose entry point calls it), by
// scripts/llama_cpp_slim.cmake.
//
// Why: the few-row kernel of llama_cpp_tiled_rows.h spends three
// instructions (maddubs, madd by the scale, add) on every 64 products of one
// activation row, so past a few rows it is compute-bound; ggml's tiled
// kernel unpacks each weight tile to bytes in memory first, which a call of
// 15-64 rows does not repay. Here the activation rows lie across the lanes
// of a register, as in the tiled kernel's microtile: the call's activations
// are laid out once (lane r holds four codes of row r), and one vpdpbusd
// multiplies four codes of a weight row, broadcast, into sixteen rows. The
// scales cost one multiply per 32 (Q4_K) or 16 (Q6_K) codes, and a block's
// float steps are the tiled kernel's, lane by lane:
//   r = d0 * float(s1) [- dmin * float(s2), fused];  acc = fma(r, d1, acc)
// with s1 and s2 the same exact integers, so every output has the bits it
// has in the tiles and in the few-row kernel (tests/test_kernels.py).
// Fewer than 8 rows leave most lanes idle and go to the few-row kernel;
// more than 64 to the tiles (docs/measurements.md has the sweep).
// A Q4_K block's eight 6-bit scales, then its eight mins, as bytes:
// utmp[0..1] and utmp[2..3]. Plain C, outside the guard below: the few-row
// kernel (llama_cpp_tiled_rows.h, which follows this file) decodes with it too.
static inline void llmctl_q4k_scales(const block_q4_K & x, uint32_t utmp[4]) {
    static const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, x.scales, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && \
    defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#include <type_traits>

#define LLMCTL_LANES 1
#define LLMCTL_LANES_MIN 8
#define LLMCTL_LANES_MAX 64  // four registers of rows

// One block of 256 activations for all rows: q[g] holds codes 4g..4g+3 of
// row r in lane r; bs[p] the int16 pair (sum of sub-block 2p, of 2p+1) of
// row r (Q4_K: 32-code sub-blocks, p < 4; Q6_K: 16-code, p < 8); d the
// rows' scales. Lanes past the call's rows are zero.
template <int V>   // V registers of 16 rows
struct llmctl_lane_block {
    __m512i q[64][V];
    __m512i bs[8][V];
    __m512 d[V];
};

template <bool Q4, int V>
static void llmctl_lanes_pack(const block_q8_K * const * y, int n, int b, llmctl_lane_block<V> & L) {
    uint32_t * q = (uint32_t *) L.q;
    uint32_t * bs = (uint32_t *) L.bs;
    float * d = (float *) L.d;
    memset(&L, 0, sizeof(L));
    for (int r = 0; r < n; ++r) {
        const block_q8_K & a = y[r][b];
        uint32_t codes[64];
        memcpy(codes, a.qs, sizeof(codes));
        for (int g = 0; g < 64; ++g) {
            q[16*V*g + r] = codes[g];
        }
        for (int p = 0; p < (Q4 ? 4 : 8); ++p) {
            const int lo = Q4 ? a.bsums[4*p] + a.bsums[4*p + 1] : a.bsums[2*p];
            const int hi = Q4 ? a.bsums[4*p + 2] + a.bsums[4*p + 3] : a.bsums[2*p + 1];
            bs[16*V*p + r] = (uint32_t) (uint16_t) lo | (uint32_t) (uint16_t) hi << 16;
        }
        d[r] = a.d;
    }
}

// One weight block unpacked for the lanes: its 256 codes in order, the
// scales as int32 (Q4_K: 8; Q6_K: 16) and the pairs that weight bs
// (Q4_K: mins; Q6_K: scales), d0 and dmin.
struct llmctl_lane_w {
    alignas(64) uint8_t c[256];
    int32_t sc[16];
    uint32_t pair[8];
    float d0, dmin;
};

static inline void llmctl_lanes_unpack(const block_q4_K & x, llmctl_lane_w & u) {
    uint32_t utmp[4];
    llmctl_q4k_scales(x, utmp);
    _mm256_storeu_si256((__m256i *) u.sc, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) &utmp[0])));
    _mm_storeu_si128((__m128i *) u.pair, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *) &utmp[2])));
    const __m512i m4 = _mm512_set1_epi8(0xF);
    for (int j = 0; j < 4; j += 2) {   // qs[32j + l]: code 64j + l, high nibble 64j + 32 + l
        const __m512i bits = _mm512_loadu_si512(x.qs + 32*j);
        const __m512i lo = _mm512_and_si512(bits, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
        _mm512_store_si512(u.c + 64*j, _mm512_shuffle_i64x2(lo, hi, 0x44));
        _mm512_store_si512(u.c + 64*j + 64, _mm512_shuffle_i64x2(lo, hi, 0xEE));
    }
    u.d0 = _cvtsh_ss(x.data.data.d);
    u.dmin = _cvtsh_ss(x.data.data.dmin);
}

static inline void llmctl_lanes_unpack(const block_q6_K & x, llmctl_lane_w & u) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m2 = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {   // codes 128h + 32t + l, t = 0..3 (the stored value + 32)
        const __m256i l0 = _mm256_loadu_si256((const __m256i *) (x.ql + 64*h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *) (x.ql + 64*h + 32));
        const __m512i ql = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
        const __m256i h8 = _mm256_loadu_si256((const __m256i *) (x.qh + 32*h));
        const __m512i qh01 = _mm512_inserti64x4(_mm512_castsi256_si512(h8), _mm256_srli_epi16(h8, 2), 1);
        const __m512i qh23 = _mm512_srli_epi16(qh01, 4);
        _mm512_store_si512(u.c + 128*h, _mm512_or_si512(_mm512_and_si512(ql, m4),
            _mm512_slli_epi16(_mm512_and_si512(qh01, m2), 4)));
        _mm512_store_si512(u.c + 128*h + 64, _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
            _mm512_slli_epi16(_mm512_and_si512(qh23, m2), 4)));
    }
    _mm512_storeu_si512(u.sc, _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) x.scales)));
    _mm256_storeu_si256((__m256i *) u.pair, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) x.scales)));
    u.d0 = _cvtsh_ss(x.d);
    u.dmin = 0.0f;
}

#define LLMCTL_BCAST(p) _mm512_set1_epi32(*(const int32_t *) (p))

// nw (<= W) weight rows times every lane: out[w][v] gets row w's outputs,
// one lane per activation row.
template <typename B, int V, int W>
static void llmctl_lanes_rows(const char * x, size_t stride, int nw, const llmctl_lane_block<V> * L, int nb,
                              __m512 (*out)[V]) {
    constexpr bool q4 = std::is_same<B, block_q4_K>::value;
    constexpr int SUB = q4 ? 32 : 16;      // codes per scale
    constexpr int NP = q4 ? 4 : 8;         // pairs of bs
    llmctl_lane_w u[W];
    __m512 acc[W][V];
    for (int w = 0; w < W; ++w) {
        for (int v = 0; v < V; ++v) acc[w][v] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; ++b) {
        for (int w = 0; w < W; ++w) {   // past nw: row 0 again, not stored
            llmctl_lanes_unpack(((const B *) (x + (w < nw ? w : 0)*stride))[b], u[w]);
        }
        const llmctl_lane_block<V> & y = L[b];
        __m512i s1[W][V], s2[W][V];
        for (int w = 0; w < W; ++w) {
            for (int v = 0; v < V; ++v) s1[w][v] = s2[w][v] = _mm512_setzero_si512();
        }
        for (int k = 0; k < 256/SUB; ++k) {
            __m512i a[W][V];
            for (int w = 0; w < W; ++w) {
                for (int v = 0; v < V; ++v) a[w][v] = _mm512_setzero_si512();
            }
            for (int g = k*SUB/4; g < (k + 1)*SUB/4; ++g) {
                __m512i yq[V];
                for (int v = 0; v < V; ++v) yq[v] = _mm512_load_si512(&y.q[g][v]);
                for (int w = 0; w < W; ++w) {
                    const __m512i c = LLMCTL_BCAST(u[w].c + 4*g);
                    for (int v = 0; v < V; ++v) a[w][v] = _mm512_dpbusd_epi32(a[w][v], c, yq[v]);
                }
            }
            for (int w = 0; w < W; ++w) {
                const __m512i sc = _mm512_set1_epi32(u[w].sc[k]);
                for (int v = 0; v < V; ++v) s1[w][v] = _mm512_add_epi32(s1[w][v], _mm512_mullo_epi32(a[w][v], sc));
            }
        }
        for (int p = 0; p < NP; ++p) {
            for (int w = 0; w < W; ++w) {
                const __m512i m = LLMCTL_BCAST(&u[w].pair[p]);
                for (int v = 0; v < V; ++v) s2[w][v] = _mm512_dpwssd_epi32(s2[w][v], _mm512_load_si512(&y.bs[p][v]), m);
            }
        }
        for (int w = 0; w < W; ++w) {
            for (int v = 0; v < V; ++v) {
                __m512 r;
                if constexpr (q4) {
                    r = _mm512_mul_ps(_mm512_set1_ps(u[w].d0), _mm512_cvtepi32_ps(s1[w][v]));
                    r = _mm512_fnmadd_ps(_mm512_set1_ps(u[w].dmin), _mm512_cvtepi32_ps(s2[w][v]), r);
                } else {
                    r = _mm512_mul_ps(_mm512_set1_ps(u[w].d0),
                        _mm512_cvtepi32_ps(_mm512_sub_epi32(s1[w][v], _mm512_slli_epi32(s2[w][v], 5))));
                }
                acc[w][v] = _mm512_fmadd_ps(r, y.d[v], acc[w][v]);
            }
        }
    }
    for (int w = 0; w < nw; ++w) {
        for (int v = 0; v < V; ++v) out[w][v] = acc[w][v];
    }
}

template <typename B, int V, int W>
static void llmctl_lanes_op(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                            const block_q8_K * const * y, int64_t n, int nb, char * scratch) {
    constexpr bool q4 = std::is_same<B, block_q4_K>::value;
    const struct ggml_tensor * src0 = dst->src[0];
    llmctl_lane_block<V> * L = (llmctl_lane_block<V> *) scratch;
    for (int b = params->ith*nb/params->nth; b < (params->ith + 1)*nb/params->nth; ++b) {
        llmctl_lanes_pack<q4, V>(y, (int) n, b, L[b]);
    }
    ggml_barrier(params->threadpool);
    const int64_t nrows = src0->ne[1];
    const int64_t per = std::max<int64_t>(4*W, (nrows/(8*params->nth) + W - 1)/W*W);
    const int64_t nchunks = (nrows + per - 1)/per;
    for (int64_t c = params->ith; c < nchunks; c = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        const int64_t i1 = std::min<int64_t>(nrows, (c + 1)*per);
        for (int64_t i = c*per; i < i1; i += W) {
            const int nw = (int) std::min<int64_t>(W, i1 - i);
            __m512 out[W][V];
            llmctl_lanes_rows<B, V, W>((const char *) src0->data + i*src0->nb[1], src0->nb[1], nw, L, nb, out);
            for (int w = 0; w < nw; ++w) {
                alignas(64) float o[16*V];
                for (int v = 0; v < V; ++v) _mm512_store_ps(o + 16*v, out[w][v]);
                for (int64_t r = 0; r < n; ++r) {
                    *(float *) ((char *) dst->data + (i + w)*dst->nb[0] + r*dst->nb[1]) = o[r];
                }
            }
        }
        if (params->nth >= nchunks) {
            break;
        }
    }
}

// The whole op for LLMCTL_LANES_MIN..MAX activation rows; false where it
// does not apply. Every thread rearranges a share of the blocks into the
// tiled kernel's per-thread workspace (unused on this path), then all take
// weight rows in chunks.
template <typename B>
static bool llmctl_tiled_lanes(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                               const void * wdata, size_t row_size, char * scratch, size_t scratch_size) {
    const int64_t n = dst->src[1]->ne[1];
    const int nb = (int) (dst->src[0]->ne[0] / QK_K);
    const int V = (int) (n + 15)/16;
    if (n < LLMCTL_LANES_MIN || n > LLMCTL_LANES_MAX || nb*V*sizeof(llmctl_lane_block<1>) > scratch_size) {
        return false;
    }
    const block_q8_K * y[LLMCTL_LANES_MAX];
    for (int64_t r = 0; r < n; ++r) {
        y[r] = (const block_q8_K *) ((const char *) wdata + r*row_size);
    }
    // weight rows per pass, as many as the registers hold (measured)
    switch (V) {
        case 1: llmctl_lanes_op<B, 1, 8>(params, dst, y, n, nb, scratch); break;
        case 2: llmctl_lanes_op<B, 2, 4>(params, dst, y, n, nb, scratch); break;
        case 3: llmctl_lanes_op<B, 3, 2>(params, dst, y, n, nb, scratch); break;
        default: llmctl_lanes_op<B, 4, 2>(params, dst, y, n, nb, scratch); break;
    }
    return true;
}
#endif
