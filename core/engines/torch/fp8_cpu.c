/* FP8Linear's CPU kernel: core/fp8_cpu.py reads this file and core/cbuild.py builds it once per machine
   into the cache folder (triage_fp8_<hash of this text, flags, compiler, CPU>.so). */
#include <stdint.h>
#include <string.h>
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* E4M3 (fn) value times 2^-8 for every byte; only used for tails and non-vector builds. */
static float LUT[256];
static int lut_ready = 0;
static void init_lut(void) {
    if (lut_ready) return;
    for (int i = 0; i < 256; i++) {
        int s = i >> 7, e = (i >> 3) & 15, m = i & 7;
        float v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
        if (e == 15 && m == 7) v = NAN;
        LUT[i] = (s ? -v : v) / 256.0f;
    }
    lut_ready = 1;
}

int triage_fp8_isa(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    return 512;
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    return 256;
#else
    return 0;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* 32 E4M3 bytes -> two vectors of 16 floats (value * 2^-8). */
static inline void cvt32(const uint8_t* p, __m512* lo, __m512* hi) {
    __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
    __m512i h = _mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(b, _mm512_set1_epi16(0x7F)), 7),
                                _mm512_slli_epi16(_mm512_and_si512(b, _mm512_set1_epi16(0x80)), 8));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}
#define VW 32
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
static inline void cvt16(const uint8_t* p, __m256* lo, __m256* hi) {
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p));
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7),
                                _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}
#define VW 16
#else
#define VW 0
#endif

/* float and bf16 bits, rounding to nearest even as torch's .to(torch.bfloat16) does (NaN: c10's 0x7FC0). */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (f != f) return 0x7FC0;
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* Rows n0..n1 of out[M, N] for MB (<= 8) rows of x starting at x. With out16 the rows are also multiplied by xs
   (the activations' per-token scales; NULL: none) and stored as bf16 in out16 instead. */
static inline __attribute__((always_inline)) void gemv_block(const float* x, int MB, int K, const uint8_t* q,
        int n0, int n1, int N, const float* scale, float* out, const float* xs, uint16_t* out16) {
    for (int n = n0; n < n1; n++) {
        const uint8_t* w = q + (int64_t)n * K;
        float tot[8];
        int k = 0;
#if VW == 32
        __m512 acc[8];
        for (int m = 0; m < MB; m++) acc[m] = _mm512_setzero_ps();
        for (; k + 32 <= K; k += 32) {
            __m512 lo, hi;
            cvt32(w + k, &lo, &hi);
            for (int m = 0; m < MB; m++) {
                acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + (int64_t)m * K + k), lo, acc[m]);
                acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + (int64_t)m * K + k + 16), hi, acc[m]);
            }
        }
        for (int m = 0; m < MB; m++) tot[m] = _mm512_reduce_add_ps(acc[m]);
#elif VW == 16
        __m256 acc[8];
        for (int m = 0; m < MB; m++) acc[m] = _mm256_setzero_ps();
        for (; k + 16 <= K; k += 16) {
            __m256 lo, hi;
            cvt16(w + k, &lo, &hi);
            for (int m = 0; m < MB; m++) {
                acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (int64_t)m * K + k), lo, acc[m]);
                acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (int64_t)m * K + k + 8), hi, acc[m]);
            }
        }
        for (int m = 0; m < MB; m++) {
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[m]), _mm256_extractf128_ps(acc[m], 1));
            s4 = _mm_hadd_ps(s4, s4);
            s4 = _mm_hadd_ps(s4, s4);
            tot[m] = _mm_cvtss_f32(s4);
        }
#else
        for (int m = 0; m < MB; m++) tot[m] = 0.0f;
#endif
        for (; k < K; k++)
            for (int m = 0; m < MB; m++) tot[m] += x[(int64_t)m * K + k] * LUT[w[k]];
        float s = scale[n] * 256.0f;
        if (out16)
            for (int m = 0; m < MB; m++) out16[(int64_t)m * N + n] = f32_to_bf16(xs ? tot[m] * s * xs[m] : tot[m] * s);
        else
            for (int m = 0; m < MB; m++) out[(int64_t)m * N + n] = tot[m] * s;
    }
}

static void gemv_rows(const float* x, int M, int K, const uint8_t* q, int N, const float* scale, float* out,
                      const float* xs, uint16_t* out16) {
    for (int m0 = 0; m0 < M; m0 += 8) {
        int mb = M - m0 < 8 ? M - m0 : 8;
        const float* xb = x + (int64_t)m0 * K;
        float* ob = out ? out + (int64_t)m0 * N : NULL;
        const float* sb = xs ? xs + m0 : NULL;
        uint16_t* hb = out16 ? out16 + (int64_t)m0 * N : NULL;
        switch (mb) {  /* constant row counts let the compiler keep the accumulators in registers */
            case 1: gemv_block(xb, 1, K, q, 0, N, N, scale, ob, sb, hb); break;
            case 2: gemv_block(xb, 2, K, q, 0, N, N, scale, ob, sb, hb); break;
            case 3: gemv_block(xb, 3, K, q, 0, N, N, scale, ob, sb, hb); break;
            case 4: gemv_block(xb, 4, K, q, 0, N, N, scale, ob, sb, hb); break;
            case 5: gemv_block(xb, 5, K, q, 0, N, N, scale, ob, sb, hb); break;
            case 6: gemv_block(xb, 6, K, q, 0, N, N, scale, ob, sb, hb); break;
            case 7: gemv_block(xb, 7, K, q, 0, N, N, scale, ob, sb, hb); break;
            default: gemv_block(xb, 8, K, q, 0, N, N, scale, ob, sb, hb); break;
        }
    }
}

/* out[M, N] = (x[M, K] @ e4m3(q[N, K])^T) * scale[N], all float32 but q. */
void triage_fp8_gemv(const float* x, int M, int K, const uint8_t* q, int N, const float* scale, float* out) {
    init_lut();
    gemv_rows(x, M, K, q, N, scale, out, NULL, NULL);
}

/* float -> E4M3 (fn), c10's fp8e4m3fn_from_fp32_value: round to nearest even, saturating, NaN to 0x7F. */
static inline uint8_t f32_to_e4m3(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    const uint32_t sign = bits & 0x80000000u;
    uint8_t result;
    bits ^= sign;
    if (bits >= (1087u << 20)) {
        result = bits > 0x7F800000u ? 0x7F : 0x7E;
    } else if (bits < (121u << 23)) {  /* below 2^-6: E4M3 subnormals, rounded by a float addition */
        const uint32_t denorm_mask = 141u << 23;
        float a, d;
        memcpy(&a, &bits, 4);
        memcpy(&d, &denorm_mask, 4);
        a += d;
        memcpy(&bits, &a, 4);
        result = (uint8_t)(bits - denorm_mask);
    } else {
        uint32_t mant_odd = (bits >> 20) & 1;
        bits += ((uint32_t)(7 - 127) << 23) + 0x7FFFF + mant_odd;
        result = (uint8_t)(bits >> 20);
        if (result == 0x7F) result = 0x7E;
    }
    return result | (uint8_t)(sign >> 24);
}

/* One bf16 row of activations as W8A8 quantizes it (fp8.quantize_rows: amax of |x| clamped to 1e-12, scale = amax /
   448, x / scale clamped to +-448, to E4M3), into the E4M3 values as float (to_float); returns the scale. */
static float quantize_row(const uint16_t* x, int K, float* xf) {
    float amax = 0.0f;
    int nan = 0;
    for (int k = 0; k < K; k++) {
        xf[k] = bf16_to_f32(x[k]);
        float a = fabsf(xf[k]);
        if (a != a) nan = 1;
        else if (a > amax) amax = a;
    }
    if (nan) amax = NAN;  /* torch's amax and clamp carry a NaN on */
    else if (amax < 1e-12f) amax = 1e-12f;
    float s = amax / 448.0f;
    for (int k = 0; k < K; k++) {
        float v = xf[k] / s;
        if (v < -448.0f) v = -448.0f;
        else if (v > 448.0f) v = 448.0f;
        xf[k] = LUT[f32_to_e4m3(v)] * 256.0f;
    }
    return s;
}

/* FP8Linear's few-row step, bf16 in and out, as its torch ops compute it: W8A8 quantizes each row (quantize_row),
   then the product as triage_fp8_gemv, times the row's scale, rounded to bf16. `work`: M * K + M floats. */
void triage_fp8_decode_bf16(const uint16_t* x, int M, int K, int w8a8, const uint8_t* q, int N, const float* scale,
                            float* work, uint16_t* out) {
    init_lut();
    float* xs = work + (int64_t)M * K;
    for (int m = 0; m < M; m++) {
        float* xf = work + (int64_t)m * K;
        if (w8a8) xs[m] = quantize_row(x + (int64_t)m * K, K, xf);
        else for (int k = 0; k < K; k++) xf[k] = bf16_to_f32(x[(int64_t)m * K + k]);
    }
    gemv_rows(work, M, K, q, N, scale, NULL, w8a8 ? xs : NULL, out);
}

/* The exact E4M3 values (no scale) as float32. */
void triage_fp8_to_f32(const uint8_t* q, int64_t n, float* out) {
    init_lut();
    int64_t i = 0;
#if VW == 32
    const __m512 s256 = _mm512_set1_ps(256.0f);
    for (; i + 32 <= n; i += 32) {
        __m512 lo, hi;
        cvt32(q + i, &lo, &hi);
        _mm512_storeu_ps(out + i, _mm512_mul_ps(lo, s256));
        _mm512_storeu_ps(out + i + 16, _mm512_mul_ps(hi, s256));
    }
#endif
    for (; i < n; i++) out[i] = LUT[q[i]] * 256.0f;
}

/* The exact E4M3 values (no scale) as bf16 bits: every E4M3 value is a bf16 value, so truncation is exact. */
void triage_fp8_to_bf16(const uint8_t* q, int64_t n, uint16_t* out) {
    init_lut();
    int64_t i = 0;
#if VW == 32
    const __m512 s256 = _mm512_set1_ps(256.0f);
    for (; i + 32 <= n; i += 32) {
        __m512 lo, hi;
        cvt32(q + i, &lo, &hi);
        __m512i a = _mm512_srli_epi32(_mm512_castps_si512(_mm512_mul_ps(lo, s256)), 16);
        __m512i b = _mm512_srli_epi32(_mm512_castps_si512(_mm512_mul_ps(hi, s256)), 16);
        _mm256_storeu_si256((__m256i*)(out + i), _mm512_cvtepi32_epi16(a));
        _mm256_storeu_si256((__m256i*)(out + i + 16), _mm512_cvtepi32_epi16(b));
    }
#endif
    for (; i < n; i++) {
        float v = LUT[q[i]] * 256.0f;
        uint32_t bits;
        memcpy(&bits, &v, 4);
        out[i] = (uint16_t)(bits >> 16);
    }
}
