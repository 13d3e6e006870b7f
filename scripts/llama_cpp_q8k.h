// llmctl: ggml's quantize_row_q8_K on x86, in vectors, byte for byte what
// its scalar reference writes. Inserted into ggml-cpu/arch/x86/quants.c by
// scripts/llama_cpp_slim.cmake in place of the body that calls
// quantize_row_q8_K_ref.
//
// Why: every K-quant matmul first converts its activations to Q8_K (ggml's
// tiled kernel and llmctl's few-row and lanes kernels alike), and the x86
// build did it one float at a time, about 1.1 ns a float on a 2-core EPYC:
// a few percent of a prompt chunk (docs/measurements.md).
//
// The same bytes: a block's largest |x| (NaNs skipped, as the reference's
// `>` skips them) and the first value holding it; the same iscale and the
// same float product per value; rounded to nearest even, as nearest_int's
// magic number rounds (vcvtps2dq, with a NaN product mapped as the magic
// number maps its bits, and an infinite one to 0 both ways); MIN(127, v)
// and the truncation to int8; sums of the stored bytes. A block of zeros
// keeps the reference's d = 0, zero codes and untouched sums.
// tests/test_kernels.py compares the two on random and hostile rows.
#if defined(__AVX2__)
#include <immintrin.h>

// Eight products' codes as nearest_int(p) would give them, before MIN.
static inline __m256i llmctl_q8k_round(__m256 p) {
    const __m256i v = _mm256_cvtps_epi32(p);
    const __m256i nanv = _mm256_and_si256(_mm256_castps_si256(p), _mm256_set1_epi32(0x3fffff));
    return _mm256_blendv_epi8(v, nanv, _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q)));
}

// The block's codes (32 at a time, the low byte of MIN(127, v)) and sums.
static inline void llmctl_q8k_codes(const float * GGML_RESTRICT x, float iscale, block_q8_K * GGML_RESTRICT y) {
    const __m256 s = _mm256_set1_ps(iscale);
    const __m256i top = _mm256_set1_epi32(127), low = _mm256_set1_epi32(0xFF);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int j = 0; j < QK_K; j += 32) {
        __m256i v[4];
        for (int u = 0; u < 4; ++u) {
            const __m256 p = _mm256_mul_ps(s, _mm256_loadu_ps(x + j + 8*u));
            v[u] = _mm256_and_si256(_mm256_min_epi32(llmctl_q8k_round(p), top), low);
        }
        const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(
            _mm256_packus_epi32(v[0], v[1]), _mm256_packus_epi32(v[2], v[3])), order);
        _mm256_storeu_si256((__m256i *) (y->qs + j), q);
        // each 8 bytes' sum, biased by 128 each (sad is unsigned)
        const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char) 0x80)),
                                            _mm256_setzero_si256());
        const __m128i a = _mm256_castsi256_si128(sad), b = _mm256_extracti128_si256(sad, 1);
        y->bsums[j/16] = (int16_t) (_mm_cvtsi128_si32(a) + _mm_extract_epi32(a, 2) - 16*128);
        y->bsums[j/16 + 1] = (int16_t) (_mm_cvtsi128_si32(b) + _mm_extract_epi32(b, 2) - 16*128);
    }
}

void quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT vy, int64_t k) {
    assert(k % QK_K == 0);
    block_q8_K * GGML_RESTRICT y = (block_q8_K *) vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / QK_K; ++i, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) {   // max(|x|, m) is m where x is NaN
            m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        if (!amax) {
            y[i].d = 0;
            memset(y[i].qs, 0, QK_K);
            continue;
        }
        float max = 0;
        const __m256 am = _mm256_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(
                _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), am, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz(hit)];
                break;
            }
        }
        const float iscale = -127.f/max;
        llmctl_q8k_codes(x, iscale, &y[i]);
        y[i].d = 1/iscale;
    }
}
#else
void quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT y, int64_t k) {
    quantize_row_q8_K_ref(x, y, k);
}
#endif
