// llmctl: the vector operations of llama_cpp_fa_rows.h, on AVX-512 (16
// lanes) or AVX2 (8), inserted into ggml-cpu/ops.cpp by
// scripts/llama_cpp_slim.cmake inside the kernel's own AVX2, F16C and FMA
// guard. Each is lane by lane, so a lane's result does not depend on its
// neighbours: the kernel's batch invariance rests on that.
#if defined(__AVX512F__) && defined(__AVX512DQ__)
typedef __m512 llmctl_v;
#define LLMCTL_W 16
#define LLMCTL_TILE_R 6      // rows per register tile: 6 x 4 accumulators
static inline llmctl_v llmctl_vload(const float * p) { return _mm512_loadu_ps(p); }
static inline void llmctl_vstore(float * p, llmctl_v x) { _mm512_storeu_ps(p, x); }
static inline llmctl_v llmctl_vset(float x) { return _mm512_set1_ps(x); }
static inline llmctl_v llmctl_vzero() { return _mm512_setzero_ps(); }
static inline llmctl_v llmctl_vfma(llmctl_v a, llmctl_v b, llmctl_v c) { return _mm512_fmadd_ps(a, b, c); }
static inline llmctl_v llmctl_vmul(llmctl_v a, llmctl_v b) { return _mm512_mul_ps(a, b); }
static inline llmctl_v llmctl_vadd(llmctl_v a, llmctl_v b) { return _mm512_add_ps(a, b); }
static inline llmctl_v llmctl_vsub(llmctl_v a, llmctl_v b) { return _mm512_sub_ps(a, b); }
static inline llmctl_v llmctl_vmax(llmctl_v a, llmctl_v b) { return _mm512_max_ps(a, b); }
static inline llmctl_v llmctl_vmin(llmctl_v a, llmctl_v b) { return _mm512_min_ps(a, b); }
static inline llmctl_v llmctl_vf16(const ggml_fp16_t * p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) p));
}
// a + m, or -inf where m is -inf (whatever a holds, even NaN)
static inline llmctl_v llmctl_vmask_add(llmctl_v a, llmctl_v m) {
    const __mmask16 k = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(k, _mm512_add_ps(a, m), _mm512_set1_ps(-INFINITY));
}
// p, or +0 where s is -inf
static inline llmctl_v llmctl_vzero_ninf(llmctl_v p, llmctl_v s) {
    const __mmask16 k = _mm512_cmp_ps_mask(s, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    return _mm512_maskz_mov_ps(k, p);
}
// x, or +0 where x is not finite
static inline llmctl_v llmctl_vfinite(llmctl_v x) {
    const __mmask16 k = _mm512_cmp_ps_mask(_mm512_sub_ps(x, x), _mm512_setzero_ps(), _CMP_EQ_OQ);
    return _mm512_maskz_mov_ps(k, x);
}
static inline llmctl_v llmctl_vfloor(llmctl_v x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
static inline llmctl_v llmctl_vpow2i(llmctl_v fx) {
    __m512i e = _mm512_cvttps_epi32(fx);
    e = _mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(0x7f)), 23);
    return _mm512_castsi512_ps(e);
}
#else
typedef __m256 llmctl_v;
#define LLMCTL_W 8
#define LLMCTL_TILE_R 3      // 16 registers: 3 x 4 accumulators
static inline llmctl_v llmctl_vload(const float * p) { return _mm256_loadu_ps(p); }
static inline void llmctl_vstore(float * p, llmctl_v x) { _mm256_storeu_ps(p, x); }
static inline llmctl_v llmctl_vset(float x) { return _mm256_set1_ps(x); }
static inline llmctl_v llmctl_vzero() { return _mm256_setzero_ps(); }
static inline llmctl_v llmctl_vfma(llmctl_v a, llmctl_v b, llmctl_v c) { return _mm256_fmadd_ps(a, b, c); }
static inline llmctl_v llmctl_vmul(llmctl_v a, llmctl_v b) { return _mm256_mul_ps(a, b); }
static inline llmctl_v llmctl_vadd(llmctl_v a, llmctl_v b) { return _mm256_add_ps(a, b); }
static inline llmctl_v llmctl_vsub(llmctl_v a, llmctl_v b) { return _mm256_sub_ps(a, b); }
static inline llmctl_v llmctl_vmax(llmctl_v a, llmctl_v b) { return _mm256_max_ps(a, b); }
static inline llmctl_v llmctl_vmin(llmctl_v a, llmctl_v b) { return _mm256_min_ps(a, b); }
static inline llmctl_v llmctl_vf16(const ggml_fp16_t * p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p));
}
static inline llmctl_v llmctl_vmask_add(llmctl_v a, llmctl_v m) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    return _mm256_blendv_ps(_mm256_add_ps(a, m), ninf, _mm256_cmp_ps(m, ninf, _CMP_EQ_OQ));
}
static inline llmctl_v llmctl_vzero_ninf(llmctl_v p, llmctl_v s) {
    return _mm256_and_ps(p, _mm256_cmp_ps(s, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
}
static inline llmctl_v llmctl_vfinite(llmctl_v x) {
    return _mm256_and_ps(x, _mm256_cmp_ps(_mm256_sub_ps(x, x), _mm256_setzero_ps(), _CMP_EQ_OQ));
}
static inline llmctl_v llmctl_vfloor(llmctl_v x) { return _mm256_floor_ps(x); }
static inline llmctl_v llmctl_vpow2i(llmctl_v fx) {
    __m256i e = _mm256_cvttps_epi32(fx);
    e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(0x7f)), 23);
    return _mm256_castsi256_ps(e);
}
#endif

// Vectors of cells per pass of the score tile, and of V's dimensions per
// pass of the output tile.
#define LLMCTL_NV 4

// exp(x) lane by lane (the Cephes polynomial); exact zeros for masked cells
// are the caller's business.
static inline llmctl_v llmctl_vexp(llmctl_v x) {
    x = llmctl_vmin(x, llmctl_vset(88.3762626647949f));
    x = llmctl_vmax(x, llmctl_vset(-88.3762626647949f));
    const llmctl_v fx = llmctl_vfloor(llmctl_vfma(x, llmctl_vset(1.44269504088896341f), llmctl_vset(0.5f)));
    x = llmctl_vfma(fx, llmctl_vset(-0.693359375f), x);
    x = llmctl_vfma(fx, llmctl_vset(2.12194440e-4f), x);
    const llmctl_v z = llmctl_vmul(x, x);
    llmctl_v y = llmctl_vset(1.9875691500e-4f);
    y = llmctl_vfma(y, x, llmctl_vset(1.3981999507e-3f));
    y = llmctl_vfma(y, x, llmctl_vset(8.3334519073e-3f));
    y = llmctl_vfma(y, x, llmctl_vset(4.1665795894e-2f));
    y = llmctl_vfma(y, x, llmctl_vset(1.6666665459e-1f));
    y = llmctl_vfma(y, x, llmctl_vset(5.0000001201e-1f));
    y = llmctl_vfma(y, z, x);
    y = llmctl_vadd(y, llmctl_vset(1.0f));
    return llmctl_vmul(y, llmctl_vpow2i(fx));
}

// Lanes summed in a fixed tree.
static inline float llmctl_vsum(llmctl_v x) {
    float t[LLMCTL_W];
    llmctl_vstore(t, x);
    for (int w = LLMCTL_W/2; w > 0; w /= 2) {
        for (int i = 0; i < w; ++i) {
            t[i] = t[i] + t[i + w];
        }
    }
    return t[0];
}

static inline float llmctl_vmaxall(llmctl_v x) {
    float t[LLMCTL_W];
    llmctl_vstore(t, x);
    float m = t[0];
    for (int i = 1; i < LLMCTL_W; ++i) {
        m = std::max(m, t[i]);
    }
    return m;
}

// An 8 x 8 block of floats transposed in registers.
static inline void llmctl_t8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

