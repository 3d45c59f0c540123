/* the integer layers' CPU kernel: core/int_cpu.py reads this file and core/cbuild.py builds it once per machine
   into the cache folder (triage_int_<hash of this text, flags, compiler, CPU>.so). */
#include <stdint.h>
#include <string.h>

/* float -> bf16 bits, round to nearest even as torch's .to(torch.bfloat16) (NaN: c10's 0x7FC0) */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (f != f) return 0x7FC0;
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* IEEE half bits -> float, exactly (scales are stored as float16; written out: older compilers have no _Float16) */
static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    uint32_t bits;
    float f;
    if (e == 0) {  /* zero or subnormal: m * 2^-24, exact in float */
        f = (float)m * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (e == 31) {
        bits = sign | 0x7F800000u | (m << 13);  /* inf, NaN */
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

/* f rounded to bf16 (nearest even), as a float: the weight a bf16 tensor holds (weights are finite) */
static inline float bf16_round(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;
    memcpy(&f, &bits, 4);
    return f;
}

typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const float* p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* out[m, n] = bf16(sum_k x[m, k] * w[k]) for MB rows of x (float, row stride K, K a multiple of 16) and one weight
   row w, as a bf16 GEMV computes it (bf16 products are exact in float; float sums, in this kernel's order). */
static inline __attribute__((always_inline)) void dot_rows(const float* restrict x, int MB, int K,
                                                           const float* restrict w, uint16_t* restrict out,
                                                           int64_t stride) {
    for (int m = 0; m < MB; m++) {
        const float* xm = x + (int64_t)m * K;
        v8f a0 = {0}, a1 = {0};
        for (int k = 0; k < K; k += 16) {
            a0 += load8(xm + k) * load8(w + k);
            a1 += load8(xm + k + 8) * load8(w + k + 8);
        }
        a0 += a1;
        float t = ((a0[0] + a0[4]) + (a0[1] + a0[5])) + ((a0[2] + a0[6]) + (a0[3] + a0[7]));
        out[m * stride] = f32_to_bf16(t);
    }
}

/* The few-row input as float, zero-padded from K to Kp inputs (row stride Kp). */
static void rows_to_float(const uint16_t* restrict x, int M, int K, int Kp, float* restrict xf) {
    for (int m = 0; m < M; m++) {
        for (int k = 0; k < K; k++) {
            uint32_t bits = (uint32_t)x[(int64_t)m * K + k] << 16;
            memcpy(&xf[(int64_t)m * Kp + k], &bits, 4);
        }
        for (int k = K; k < Kp; k++) xf[(int64_t)m * Kp + k] = 0.0f;
    }
}

#define DOT_ROWS_BLOCKS(x, M, K, w, out, N, n) \
    for (int m0 = 0; m0 < M; m0 += 4) { \
        int mb = M - m0 < 4 ? M - m0 : 4; \
        const float* xb = x + (int64_t)m0 * K; \
        uint16_t* ob = out + (int64_t)m0 * N + n; \
        switch (mb) { /* constant row counts keep the accumulators in registers */ \
            case 1: dot_rows(xb, 1, K, w, ob, N); break; \
            case 2: dot_rows(xb, 2, K, w, ob, N); break; \
            case 3: dot_rows(xb, 3, K, w, ob, N); break; \
            default: dot_rows(xb, 4, K, w, ob, N); break; \
        } \
    }

/* Store a row of float weights rounded to bf16, as bf16 bits (as_f32 = 0) or as the float32 of those bf16 values. */
static inline void store_row(const float* restrict w, int K, int as_f32, void* restrict out, int64_t row) {
    if (as_f32) {
        uint32_t* restrict o = (uint32_t*)out + row * K;
        for (int k = 0; k < K; k++) o[k] = (uint32_t)f32_to_bf16(w[k]) << 16;
    } else {
        uint16_t* restrict o = (uint16_t*)out + row * K;
        for (int k = 0; k < K; k++) o[k] = f32_to_bf16(w[k]);
    }
}

/* quant.dequantize_int4 then `/ input_scale` and `.to(bfloat16)`: w[n, k] = ((code - zero) * scale) [/ in_scale[k]],
   codes two a byte (low nibble first) in groups of `group` along the padded input Kp; the first K inputs are kept.
   scales: float16 [N, Kp / group], zeros: uint8 [N, Kp / group], in_scale: float16 [K] or NULL. work: Kp + K floats. */
void triage_int4_dequant(const uint8_t* restrict packed, const uint16_t* restrict scales,
                         const uint8_t* restrict zeros, const uint16_t* restrict in_scale, int N, int K, int Kp,
                         int group, int as_f32, float* restrict work, void* restrict out) {
    const int G = Kp / group;
    float* restrict in_f = work + Kp;
    if (in_scale)
        for (int k = 0; k < K; k++) in_f[k] = f16_to_f32(in_scale[k]);
    for (int n = 0; n < N; n++) {
        const uint8_t* p = packed + (int64_t)n * (Kp / 2);
        for (int g = 0; g < G; g++) {
            const float s = f16_to_f32(scales[(int64_t)n * G + g]);
            const float z = (float)zeros[(int64_t)n * G + g];
            const uint8_t* restrict pg = p + g * (group / 2);
            float* restrict wg = work + g * group;
            for (int j = 0; j < group / 2; j++) {
                wg[2 * j] = ((float)(pg[j] & 15) - z) * s;
                wg[2 * j + 1] = ((float)(pg[j] >> 4) - z) * s;
            }
        }
        if (in_scale)
            for (int k = 0; k < K; k++) work[k] = work[k] / in_f[k];
        store_row(work, K, as_f32, out, n);
    }
}

/* One row of triage_int4_dequant's weights, rounded to bf16, as floats; zero past K (the padding). */
static inline void int4_row(const uint8_t* restrict p, const uint16_t* restrict scales, const uint8_t* restrict zeros,
                            const float* restrict in_f, int K, int Kp, int group, float* restrict w) {
    for (int g = 0; g < Kp / group; g++) {
        const float s = f16_to_f32(scales[g]);
        const float z = (float)zeros[g];
        const uint8_t* restrict pg = p + g * (group / 2);
        float* restrict wg = w + g * group;
        for (int j = 0; j < group / 2; j++) {
            wg[2 * j] = ((float)(pg[j] & 15) - z) * s;
            wg[2 * j + 1] = ((float)(pg[j] >> 4) - z) * s;
        }
    }
    if (in_f)
        for (int k = 0; k < K; k++) w[k] = w[k] / in_f[k];
    for (int k = 0; k < K; k++) w[k] = bf16_round(w[k]);
    for (int k = K; k < Kp; k++) w[k] = 0.0f;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define INT4_LUT 1
/* table[idx] for 8 indexes 0..15 (bits above 3 are ignored), the table's 16 floats in two vectors */
static inline __m256 lut16(__m256 lo, __m256 hi, __m256i idx) {
    __m256 a = _mm256_permutevar8x32_ps(lo, idx);  /* uses bits 0-2 */
    __m256 b = _mm256_permutevar8x32_ps(hi, idx);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  /* bit 3 to the sign */
}

/* Without AWQ a group of an INT4 row has 16 weights at most, bf16((code - zero) * scale): they are looked up in
   registers by code instead of computed one by one (four times fewer instructions a weight). x: MB rows, each the
   even inputs then the odd ones (Kp / 2 each), matching the low and high nibbles of each byte. */
static inline __attribute__((always_inline)) void int4_lut_rows(const float* restrict x, int MB, int Kp,
        const uint8_t* restrict p, const uint16_t* restrict scales, const uint8_t* restrict zeros, int group,
        uint16_t* restrict out, int64_t stride) {
    __m256 al[4], ah[4];
    for (int m = 0; m < MB; m++) al[m] = ah[m] = _mm256_setzero_ps();
    const int half = Kp / 2;
    float t[16];
    for (int g = 0; g < Kp / group; g++) {
        const float s = f16_to_f32(scales[g]);
        const float z = (float)zeros[g];
        for (int c = 0; c < 16; c++) t[c] = bf16_round(((float)c - z) * s);
        const __m256 lo = _mm256_loadu_ps(t), hi = _mm256_loadu_ps(t + 8);
        const int j0 = g * (group / 2);
        for (int j = j0; j < j0 + group / 2; j += 8) {
            const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + j)));
            const __m256 wl = lut16(lo, hi, b);  /* low nibble: bits 4-7 shift out of the blend's mask */
            const __m256 wh = lut16(lo, hi, _mm256_srli_epi32(b, 4));
            for (int m = 0; m < MB; m++) {
                al[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (int64_t)m * Kp + j), wl, al[m]);
                ah[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (int64_t)m * Kp + half + j), wh, ah[m]);
            }
        }
    }
    for (int m = 0; m < MB; m++) {
        __m256 a = _mm256_add_ps(al[m], ah[m]);
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s4 = _mm_hadd_ps(s4, s4);
        s4 = _mm_hadd_ps(s4, s4);
        out[m * stride] = f32_to_bf16(_mm_cvtss_f32(s4));
    }
}
#endif

/* Int4Linear on M (few) bf16 rows without materializing its weights: out[M, N] bf16 = x @ W^T with W the bf16 values
   of triage_int4_dequant, each row dequantized once into a buffer that stays in L1 and used by every input row.
   work: M * Kp + Kp + K floats. */
void triage_int4_gemv_bf16(const uint16_t* restrict x, int M, int K, const uint8_t* restrict packed,
                           const uint16_t* restrict scales, const uint8_t* restrict zeros,
                           const uint16_t* restrict in_scale, int N, int Kp, int group, float* restrict work,
                           uint16_t* restrict out) {
    float* xf = work;
    float* w = work + (int64_t)M * Kp;
    float* in_f = in_scale ? w + Kp : NULL;
    rows_to_float(x, M, K, Kp, xf);
#ifdef INT4_LUT
    if (!in_scale && group % 16 == 0) {
        for (int m = 0; m < M; m++) {  /* each row as its even inputs, then its odd ones */
            float* xm = xf + (int64_t)m * Kp;
            for (int j = 0; j < Kp / 2; j++) w[j] = xm[2 * j + 1];
            for (int j = 0; j < Kp / 2; j++) xm[j] = xm[2 * j];
            memcpy(xm + Kp / 2, w, sizeof(float) * (Kp / 2));
        }
        for (int n = 0; n < N; n++) {
            const uint8_t* pn = packed + (int64_t)n * (Kp / 2);
            const uint16_t* sn = scales + (int64_t)n * (Kp / group);
            const uint8_t* zn = zeros + (int64_t)n * (Kp / group);
            for (int m0 = 0; m0 < M; m0 += 4) {
                int mb = M - m0 < 4 ? M - m0 : 4;
                const float* xb = xf + (int64_t)m0 * Kp;
                uint16_t* ob = out + (int64_t)m0 * N + n;
                switch (mb) {  /* constant row counts keep the accumulators in registers */
                    case 1: int4_lut_rows(xb, 1, Kp, pn, sn, zn, group, ob, N); break;
                    case 2: int4_lut_rows(xb, 2, Kp, pn, sn, zn, group, ob, N); break;
                    case 3: int4_lut_rows(xb, 3, Kp, pn, sn, zn, group, ob, N); break;
                    default: int4_lut_rows(xb, 4, Kp, pn, sn, zn, group, ob, N); break;
                }
            }
        }
        return;
    }
#endif
    if (in_scale)
        for (int k = 0; k < K; k++) in_f[k] = f16_to_f32(in_scale[k]);
    const int G = Kp / group;
    for (int n = 0; n < N; n++) {
        int4_row(packed + (int64_t)n * (Kp / 2), scales + (int64_t)n * G, zeros + (int64_t)n * G, in_f, K, Kp, group,
                 w);
        DOT_ROWS_BLOCKS(xf, M, Kp, w, out, N, n)
    }
}

/* Int8Linear (weight-only) on M (few) bf16 rows, as triage_int4_gemv_bf16. K a multiple of 16 (the caller checks).
   work: M * K + K floats. */
void triage_int8_gemv_bf16(const uint16_t* restrict x, int M, int K, const int8_t* restrict q,
                           const float* restrict scale, int N, float* restrict work, uint16_t* restrict out) {
    float* xf = work;
    float* w = work + (int64_t)M * K;
    rows_to_float(x, M, K, K, xf);
    for (int n = 0; n < N; n++) {
        const int8_t* qn = q + (int64_t)n * K;
        const float s = scale[n];
        for (int k = 0; k < K; k++) w[k] = bf16_round((float)qn[k] * s);
        DOT_ROWS_BLOCKS(xf, M, K, w, out, N, n)
    }
}

/* Int8Linear.dequantized: w[n, k] = (q[n, k] * scale[n]) rounded to bf16. work: K floats. */
void triage_int8_dequant(const int8_t* restrict q, const float* restrict scale, int N, int K, int as_f32,
                         float* restrict work, void* restrict out) {
    for (int n = 0; n < N; n++) {
        const int8_t* qn = q + (int64_t)n * K;
        const float s = scale[n];
        for (int k = 0; k < K; k++) work[k] = (float)qn[k] * s;
        store_row(work, K, as_f32, out, n);
    }
}
