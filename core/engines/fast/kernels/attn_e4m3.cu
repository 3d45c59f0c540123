// Decode attention's split over an E4M3 KV cache. attn_e4m3.py reads this file and compiles it with NVRTC at first
// use, with the warps per program (W, below) filled in; its docstring explains the kernel.
typedef unsigned int u32;

__device__ __forceinline__ void e4m3x2_to_f16x2(u32 w, u32 &lo, u32 &hi) {
    // the two low bytes of w -> lo (byte 0 in lo's low half), the two high bytes -> hi
    asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}"
        : "=r"(lo), "=r"(hi) : "r"(w));
}

__device__ __forceinline__ u32 f16x2(float low, float high) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(high), "f"(low));
    return r;
}

__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load16(const unsigned char* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ u32 word(const uint4 &u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

__device__ __forceinline__ float bf16_lo(u32 w) { return __int_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __int_as_float(w & 0xffff0000u); }

#define D 128
#define W WARPS_PER_PROGRAM
#define TILE 32
#define NEG_INF (-__int_as_float(0x7f800000))

// One program: one (batch row, KV head) and one split of its tokens; W warps take the split's 32-token tiles in
// turn, each with its own running max, sum and accumulator, merged in shared memory at the end.
extern "C" __global__ void __launch_bounds__(W * 32)
attn_split_e4m3(const unsigned short* __restrict__ q, const unsigned char* __restrict__ k,
                const unsigned char* __restrict__ v, const float* __restrict__ ks, const float* __restrict__ vs,
                const long long* __restrict__ pos, float* __restrict__ m_out, float* __restrict__ l_out,
                float* __restrict__ acc_out, double qk_scale_d, int split_len, int S, int stride_cb, int stride_ch,
                int stride_sb, int stride_sh, int HQ, int HKV, int G) {
    __shared__ float sm_m[W][16];
    __shared__ float sm_l[W][16];
    extern __shared__ float sm_acc[];  // [W][G][D]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = lane >> 2, c = lane & 3;
    const int b = blockIdx.x / HKV, kvh = blockIdx.x % HKV, split = blockIdx.y;
    const int length = (int)pos[b] + 1;
    const int start = split * split_len;
    const int end = min(start + split_len, length);
    const float qk_scale = (float)qk_scale_d;

    // Q as the A operand: rows r and r + 8 (query heads of this KV head), dims 32c..32c+31 in k-step order
    u32 qa[8][4];
    float rowfac[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = r + 8 * h;
        float x[32];
        if (row < G) {
            const unsigned short* src = q + ((long long)(b * HQ + kvh * G + row)) * D + 32 * c;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint4 u = __ldg(reinterpret_cast<const uint4*>(src) + i);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    x[8 * i + 2 * j] = bf16_lo(word(u, j));
                    x[8 * i + 2 * j + 1] = bf16_hi(word(u, j));
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) x[i] = 0.f;
        }
        float amax = 0.f;
#pragma unroll
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        // amax = m * 2^e with m in [0.5, 1): scaled by 2^(15 - e) it lies in [2^14, 2^15), inside f16's range
        int e = ((__float_as_int(amax) >> 23) & 0xff) - 126;
        e = max(-100, min(e, 128));
        const float up = __int_as_float((127 + 15 - e) << 23);
        rowfac[h] = __int_as_float((127 - 15 + e) << 23) * qk_scale;
#pragma unroll
        for (int s = 0; s < 8; s++) {
            qa[s][h] = f16x2(x[4 * s] * up, x[4 * s + 1] * up);
            qa[s][2 + h] = f16x2(x[4 * s + 2] * up, x[4 * s + 3] * up);
        }
    }

    float acc[16][4];
#pragma unroll
    for (int j = 0; j < 16; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m_run[2] = {NEG_INF, NEG_INF};
    float l_run[2] = {0.f, 0.f};
    float vref = 1e-30f;  // the largest V scale seen; the accumulator holds acc / vref
    const long long base = (long long)b * stride_cb + (long long)kvh * stride_ch;
    const long long sbase = (long long)b * stride_sb + (long long)kvh * stride_sh;

    for (int t0 = start + warp * TILE; t0 < end; t0 += W * TILE) {
        const int last = end - 1;  // tokens past the end read the last valid one (finite bytes) and are masked
        // K: column n-tile i is tokens t0 + 8i .. +7; this thread loads token t0 + 8i + r, bytes 32c..32c+31
        uint4 kr[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const unsigned char* p = k + base + (long long)min(t0 + 8 * i + r, last) * D + 32 * c;
            kr[i][0] = load16(p);
            kr[i][1] = load16(p + 16);
        }
        // V: k-slice j is tokens t0 + 16j .. +15; this thread loads tokens 2c, 2c+1, 2c+8, 2c+9 of it, bytes 16r..+15
        uint4 vr[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = t0 + 16 * j + 2 * c + (e & 1) + 8 * (e >> 1);
                vr[j][e] = load16(v + base + (long long)min(t, last) * D + 16 * r);
            }
        // scales of the tokens whose scores this thread holds: t0 + 8i + 2c + {0, 1}
        float ksv[4][2], vsv[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int t = min(t0 + 8 * i + 2 * c + e, last);
                ksv[i][e] = __ldg(ks + sbase + t);
                vsv[i][e] = __ldg(vs + sbase + t);
            }

        float sc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
            for (int s = 0; s < 8; s++) {
                u32 b0, b1;
                e4m3x2_to_f16x2(word(kr[i][s >> 2], s & 3), b0, b1);
                mma(sc[i], qa[s][0], qa[s][1], qa[s][2], qa[s][3], b0, b1);
            }
        }
        float mx[2] = {NEG_INF, NEG_INF};
        float tv = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const bool ok = t0 + 8 * i + 2 * c + e < end;
                sc[i][e] = ok ? sc[i][e] * rowfac[0] * ksv[i][e] : NEG_INF;
                sc[i][2 + e] = ok ? sc[i][2 + e] * rowfac[1] * ksv[i][e] : NEG_INF;
                mx[0] = fmaxf(mx[0], sc[i][e]);
                mx[1] = fmaxf(mx[1], sc[i][2 + e]);
                tv = fmaxf(tv, vsv[i][e]);
            }
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
            mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], o));
            mx[1] = fmaxf(mx[1], __shfl_xor_sync(0xffffffffu, mx[1], o));
        }
#pragma unroll
        for (int o = 1; o <= 16; o <<= 1) tv = fmaxf(tv, __shfl_xor_sync(0xffffffffu, tv, o));
        // token t0 is valid, so each row's max is finite from the first tile on
        const float vref_new = fmaxf(vref, tv);
        const float vinv = 1.f / vref_new;
        float rescale[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float m_new = fmaxf(m_run[h], mx[h]);
            const float alpha = exp2_approx(m_run[h] - m_new);
            rescale[h] = alpha * (vref * vinv);
            l_run[h] *= alpha;
            m_run[h] = m_new;
        }
        vref = vref_new;
        u32 pa[4][2];  // P * vs / vref in f16, rows r and r + 8, per n-tile
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                p[e] = exp2_approx(sc[i][e] - m_run[0]);
                p[2 + e] = exp2_approx(sc[i][2 + e] - m_run[1]);
                l_run[0] += p[e];
                l_run[1] += p[2 + e];
            }
            pa[i][0] = f16x2(p[0] * vsv[i][0] * vinv, p[1] * vsv[i][1] * vinv);
            pa[i][1] = f16x2(p[2] * vsv[i][0] * vinv, p[3] * vsv[i][1] * vinv);
        }
#pragma unroll
        for (int j = 0; j < 16; j++) {
            acc[j][0] *= rescale[0];
            acc[j][1] *= rescale[0];
            acc[j][2] *= rescale[1];
            acc[j][3] *= rescale[1];
        }
        // P.V: output column n-tile jj is head dims 16n + jj (n = 0..7), so this thread's V bytes 16r + jj
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const u32 a0 = pa[2 * j][0], a1 = pa[2 * j][1], a2 = pa[2 * j + 1][0], a3 = pa[2 * j + 1][1];
#pragma unroll
            for (int wd = 0; wd < 4; wd++) {
                const u32 x0 = word(vr[j][0], wd), x1 = word(vr[j][1], wd);
                const u32 y0 = word(vr[j][2], wd), y1 = word(vr[j][3], wd);
                u32 lo0, lo1, hi0, hi1, b00, b01, b10, b11;
                // bytes 0, 1 of the word: head dims 4wd and 4wd + 1 of the thread's 16
                e4m3x2_to_f16x2(__byte_perm(x0, x1, 0x5140), b00, b01);
                e4m3x2_to_f16x2(__byte_perm(y0, y1, 0x5140), b10, b11);
                mma(acc[4 * wd], a0, a1, a2, a3, b00, b10);
                mma(acc[4 * wd + 1], a0, a1, a2, a3, b01, b11);
                // bytes 2, 3
                e4m3x2_to_f16x2(__byte_perm(x0, x1, 0x7362), lo0, lo1);
                e4m3x2_to_f16x2(__byte_perm(y0, y1, 0x7362), hi0, hi1);
                mma(acc[4 * wd + 2], a0, a1, a2, a3, lo0, hi0);
                mma(acc[4 * wd + 3], a0, a1, a2, a3, lo1, hi1);
            }
        }
    }

    // merge the warps: each writes its rows' max, sum and accumulator (times vref), then the program combines them
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    }
    if (c == 0) {
        sm_m[warp][r] = m_run[0];
        sm_m[warp][r + 8] = m_run[1];
        sm_l[warp][r] = l_run[0];
        sm_l[warp][r + 8] = l_run[1];
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = r + 8 * h;
        if (row < G) {
            float* dst = sm_acc + (warp * G + row) * D;
#pragma unroll
            for (int jj = 0; jj < 16; jj++) {
                dst[32 * c + jj] = acc[jj][2 * h] * vref;
                dst[32 * c + 16 + jj] = acc[jj][2 * h + 1] * vref;
            }
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += W * 32) {
        const int row = idx / D, d = idx % D;
        float M = NEG_INF;
#pragma unroll
        for (int w = 0; w < W; w++) M = fmaxf(M, sm_m[w][row]);
        float tot = 0.f, L = 0.f;
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float mw = sm_m[w][row];
            const float f = mw == NEG_INF ? 0.f : exp2_approx(mw - M);
            tot += f * sm_acc[(w * G + row) * D + d];
            L += f * sm_l[w][row];
        }
        const long long orow = (long long)(b * HQ + kvh * G + row) * S + split;
        acc_out[orow * D + d] = tot;
        if (d == 0) {
            m_out[orow] = M;
            l_out[orow] = L;
        }
    }
}
