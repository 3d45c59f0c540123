"""Kernel variants bench/kernel_probe.py measures against core/engines/fast/kernels.py, for weight-only FP8 at several
rows: E4M3 read as int32 words and unpacked in registers (vector loads instead of Triton's byte-wise shared-memory
loads), measured no faster on the H200 (docs/PERFORMANCE.md), so it stays here as the record of what was tried; and
the f16 dot not swapped (activation rows as the first operand), no faster at 64 rows (2026-12-02).
Decode attention over the E4M3 cache on the CUDA cores (`attn_split_cores`), 5-170x slower than the tensor-core
kernel at 32K x batch 8 (2026-12-02), and over int32 words taken as four planes of head dims (`attn_split_planes`),
1.4-1.6x slower (2026-12-02), stay as the record too.
Batch-1 W8A8 GEMVs with the E4M3 weight turned into float32 by moving bits instead of conversion instructions
(`gemv_w8a8_prologue`, `gemv_w8a8`: same bits, 1.5-1.7x slower on the H200, 2026-12-03).
(The dot in float16, measured here on 2026-12-02, won and is now kernels.py's weight-only path; decode attention
from int32 words, no faster, is in the history: bench/kernel_variants.py at commit 1d95ca3.)"""
import torch
import triton
import triton.language as tl

from core.engines.fast.kernels import _pdl_enter


@triton.jit
def _unpack_e4m3_plain(w):
    """[N, K/4] int32 words of E4M3 bytes -> [N, K] bf16 (exact), bytes in memory order."""
    b0 = (w & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
    b1 = ((w >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
    b2 = ((w >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
    b3 = ((w >> 24) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
    x = tl.join(tl.join(b0, b2), tl.join(b1, b3))
    return tl.reshape(x, (w.shape[0], w.shape[1] * 4))


@triton.jit(do_not_specialize=["M"])
def linear_wo_words(x_ptr, w_ptr, ws_ptr, xs_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                    MODE: tl.constexpr, SILU_X: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    """Weight-only FP8 with w viewed as int32 words (stride_wn in words); EVEN shapes only."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    offs_kw = tl.arange(0, BLOCK_K // 4)
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_kw[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = _unpack_e4m3_plain(tl.load(w_ptrs))
        xmask = (offs_m[None, :] < M)
        x = tl.load(x_ptr + offs_m[None, :] * stride_xm + (k0 + offs_k)[:, None], mask=xmask, other=0.0)
        acc = tl.dot(w, x, acc)
        w_ptrs += BLOCK_K // 4
    acc = acc * tl.load(ws_ptr + offs_n, mask=offs_n < N, other=0.0)[:, None]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out_ptrs, acc.to(tl.bfloat16), mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))


@triton.jit(do_not_specialize=["M"])
def linear_wo_f16_rows(x_ptr, w_ptr, ws_ptr, xs_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                       MODE: tl.constexpr, SILU_X: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    """Weight-only FP8, f16 dot, not swapped: activation rows are the dot's first operand, the converted weight tile
    its second ([BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N]), as mixed-input GEMMs for many rows are usually laid out."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(w_ptrs).to(tl.float16)
        x = tl.load(x_ptrs, mask=offs_m[:, None] < M, other=0.0).to(tl.float16)
        acc = tl.dot(x, w, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    acc = acc * tl.load(ws_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(tl.bfloat16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def attn_split_cores(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, SPLIT_LEN,
                     S, stride_cb, stride_ch, stride_ct, stride_sb, stride_sh,
                     HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                     BLOCK_T: tl.constexpr, ROUND: tl.constexpr):
    """kernels._attn_split_kernel over an E4M3 cache without the tensor cores: a group's G query rows (4 for Llama-3)
    fill a quarter of the smallest MMA tile, and Triton feeds E4M3 tiles to the MMA one shared-memory byte at a time,
    so here the scores and p.v are float32 multiply-adds over tiles loaded straight into registers. ROUND: K/V rounded
    to bf16 after the scale and p to bf16, as the tensor-core kernel and the eager FP8 cache do; else each token's
    scale is folded into its score and its p (one multiply per token, not per element)."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    kvh = bh % HKV
    length = tl.load(pos_ptr + b) + 1
    start = split * SPLIT_LEN
    end = tl.minimum(start + SPLIT_LEN, length)
    offs_g = tl.arange(0, G)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + (b * HQ + kvh * G + offs_g[:, None]) * D + offs_d[None, :]).to(tl.float32)
    m = tl.full([G], float("-inf"), tl.float32)
    l = tl.zeros([G], tl.float32)
    acc = tl.zeros([G, D], tl.float32)
    base = b * stride_cb + kvh * stride_ch
    sbase = b * stride_sb + kvh * stride_sh
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tmask = offs_t < end
        kv_off = base + offs_t[:, None] * stride_ct + offs_d[None, :]
        k = tl.load(k_ptr + kv_off, mask=tmask[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + kv_off, mask=tmask[:, None], other=0.0).to(tl.float32)
        ks = tl.load(ks_ptr + sbase + offs_t, mask=tmask, other=0.0)
        vs = tl.load(vs_ptr + sbase + offs_t, mask=tmask, other=0.0)
        if ROUND:
            k = (k * ks[:, None]).to(tl.bfloat16).to(tl.float32)
            v = (v * vs[:, None]).to(tl.bfloat16).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * qk_scale
        else:
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * (ks * qk_scale)[None, :]
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        if ROUND:
            pv = p.to(tl.bfloat16).to(tl.float32)
        else:
            pv = p * vs[None, :]
        acc = acc * alpha[:, None] + tl.sum(pv[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    row = (b * HQ + kvh * G + offs_g) * S + split
    tl.store(m_ptr + row, m)
    tl.store(l_ptr + row, l)
    tl.store(acc_ptr + row[:, None] * D + offs_d[None, :], acc)


def decode_attention_cores(q, k_cache, v_cache, k_scale, v_scale, pos, out, ws, hq, hkv, d, sm_scale,
                           round_: bool = True):
    """kernels.decode_attention for an E4M3 cache through attn_split_cores (ws: its AttnWorkspace, whose block_t
    and num_warps it takes), then the same combine kernel."""
    from core.engines.fast import kernels as K

    B = q.shape[0]
    attn_split_cores[(B * hkv, ws.splits)](
        q, k_cache, v_cache, k_scale, v_scale, pos, ws.m, ws.l, ws.acc, sm_scale * 1.4426950408889634, ws.split_len,
        ws.splits, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_scale.stride(0), k_scale.stride(1),
        HQ=hq, HKV=hkv, G=hq // hkv, D=d, BLOCK_T=ws.block_t, ROUND=round_, num_warps=ws.num_warps,
        num_stages=ws.num_stages)
    K._attn_combine_kernel[(B * hq,)](ws.m, ws.l, ws.acc, out, out, ws.splits, D=d,
                                      SP=triton.next_power_of_2(ws.splits), CH=16, WANT_OUT16=False, num_warps=4,
                                      PDL=False)
    return out


@triton.jit
def attn_split_vt(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, SPLIT_LEN,
                  S, stride_cb, stride_ch, stride_ct, stride_vb, stride_vh, stride_vd, stride_sb, stride_sh,
                  HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                  BLOCK_T: tl.constexpr, FOLD: tl.constexpr):
    """kernels._attn_split_kernel over an E4M3 cache whose V is stored transposed, [B, H, D, T]: in p.v the tokens
    are the dot's reduction axis, and with V token-major each thread's pair of reduction elements are 128 bytes apart,
    so Triton reads the E4M3 V tile from shared memory one byte at a time; token-contiguous V puts the pairs side by
    side, as K's are. FOLD: each token's scale goes into its score and its p instead of into every element."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    kvh = bh % HKV
    length = tl.load(pos_ptr + b) + 1
    start = split * SPLIT_LEN
    end = tl.minimum(start + SPLIT_LEN, length)
    offs_g = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    gmask = offs_g < G
    q = tl.load(q_ptr + (b * HQ + kvh * G + offs_g[:, None]) * D + offs_d[None, :], mask=gmask[:, None], other=0.0)
    m = tl.full([GP], float("-inf"), tl.float32)
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    base = b * stride_cb + kvh * stride_ch
    vbase = b * stride_vb + kvh * stride_vh
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tmask = offs_t < end
        k = tl.load(k_ptr + base + offs_t[:, None] * stride_ct + offs_d[None, :], mask=tmask[:, None], other=0.0)
        vt = tl.load(v_ptr + vbase + offs_d[:, None] * stride_vd + offs_t[None, :], mask=tmask[None, :], other=0.0)
        ks = tl.load(ks_ptr + b * stride_sb + kvh * stride_sh + offs_t, mask=tmask, other=0.0)
        vs = tl.load(vs_ptr + b * stride_sb + kvh * stride_sh + offs_t, mask=tmask, other=0.0)
        if FOLD:
            s = tl.dot(q, tl.trans(k.to(tl.bfloat16))) * (ks * qk_scale)[None, :]
        else:
            k = (k.to(tl.float32) * ks[:, None]).to(tl.bfloat16)
            s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        if FOLD:
            acc = acc * alpha[:, None] + tl.dot((p * vs[None, :]).to(tl.bfloat16), tl.trans(vt.to(tl.bfloat16)))
        else:
            vt = (vt.to(tl.float32) * vs[None, :]).to(tl.bfloat16)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), tl.trans(vt))
        m = m_new
    row = (b * HQ + kvh * G + offs_g) * S + split
    tl.store(m_ptr + row, m, mask=gmask)
    tl.store(l_ptr + row, l, mask=gmask)
    tl.store(acc_ptr + row[:, None] * D + offs_d[None, :], acc, mask=gmask[:, None])


def decode_attention_vt(q, k_cache, v_cache_t, k_scale, v_scale, pos, out, ws, hq, hkv, d, sm_scale,
                        fold: bool = False):
    """kernels.decode_attention for an E4M3 cache through attn_split_vt (v_cache_t: [B, H, D, T])."""
    from core.engines.fast import kernels as K

    B = q.shape[0]
    g = hq // hkv
    attn_split_vt[(B * hkv, ws.splits)](
        q, k_cache, v_cache_t, k_scale, v_scale, pos, ws.m, ws.l, ws.acc, sm_scale * 1.4426950408889634, ws.split_len,
        ws.splits, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache_t.stride(0), v_cache_t.stride(1),
        v_cache_t.stride(2), k_scale.stride(0), k_scale.stride(1),
        HQ=hq, HKV=hkv, G=g, GP=max(16, triton.next_power_of_2(g)), D=d, BLOCK_T=ws.block_t, FOLD=fold,
        num_warps=ws.num_warps, num_stages=ws.num_stages)
    K._attn_combine_kernel[(B * hq,)](ws.m, ws.l, ws.acc, out, out, ws.splits, D=d,
                                      SP=triton.next_power_of_2(ws.splits), CH=16, WANT_OUT16=False, num_warps=4,
                                      PDL=False)
    return out


@triton.jit
def _e4m3_plane(w, i: tl.constexpr, scale):
    """Byte i of each int32 word of E4M3 bytes -> bf16 rounded as FP8KV.read() rounds: (e4m3 * scale).to(bf16).
    The byte's sign, exponent and mantissa are moved into f16's fields, which is the same value times 2^-8
    (subnormals too; the cache holds no NaN), so multiplying by scale * 256 rounds once, as the reference does."""
    b = (w >> (8 * i)) & 0xFF
    h = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
    x = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return (x * (scale * 256.0)[:, None]).to(tl.bfloat16)


@triton.jit
def attn_split_planes(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, SPLIT_LEN,
                      S, stride_cb, stride_ch, stride_ct, stride_sb, stride_sh,
                      HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                      BLOCK_T: tl.constexpr):
    """kernels._attn_split_kernel over an E4M3 cache read as int32 words (k_ptr/v_ptr int32, strides in words), each
    word's four bytes taken as four planes of head dims (d = 4j + i) with a dot each: no join or reshape of the
    unpacked bytes, so each 32-bit shared-memory load feeds four dots, where Triton loads an E4M3 V tile for the
    dot one byte at a time. Dequantized exactly as the kernel in use; the score sums in another order."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    kvh = bh % HKV
    length = tl.load(pos_ptr + b) + 1
    start = split * SPLIT_LEN
    end = tl.minimum(start + SPLIT_LEN, length)
    offs_g = tl.arange(0, GP)
    offs_w = tl.arange(0, D // 4)
    gmask = offs_g < G
    q_row = q_ptr + (b * HQ + kvh * G + offs_g[:, None]) * D + offs_w[None, :] * 4
    q0 = tl.load(q_row + 0, mask=gmask[:, None], other=0.0)
    q1 = tl.load(q_row + 1, mask=gmask[:, None], other=0.0)
    q2 = tl.load(q_row + 2, mask=gmask[:, None], other=0.0)
    q3 = tl.load(q_row + 3, mask=gmask[:, None], other=0.0)
    m = tl.full([GP], float("-inf"), tl.float32)
    l = tl.zeros([GP], tl.float32)
    a0 = tl.zeros([GP, D // 4], tl.float32)
    a1 = tl.zeros([GP, D // 4], tl.float32)
    a2 = tl.zeros([GP, D // 4], tl.float32)
    a3 = tl.zeros([GP, D // 4], tl.float32)
    base = b * stride_cb + kvh * stride_ch
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tmask = offs_t < end
        kv_off = base + offs_t[:, None] * stride_ct + offs_w[None, :]
        kw = tl.load(k_ptr + kv_off, mask=tmask[:, None], other=0)
        vw = tl.load(v_ptr + kv_off, mask=tmask[:, None], other=0)
        ks = tl.load(ks_ptr + b * stride_sb + kvh * stride_sh + offs_t, mask=tmask, other=0.0)
        vs = tl.load(vs_ptr + b * stride_sb + kvh * stride_sh + offs_t, mask=tmask, other=0.0)
        s = tl.dot(q0, tl.trans(_e4m3_plane(kw, 0, ks)))
        s = tl.dot(q1, tl.trans(_e4m3_plane(kw, 1, ks)), s)
        s = tl.dot(q2, tl.trans(_e4m3_plane(kw, 2, ks)), s)
        s = tl.dot(q3, tl.trans(_e4m3_plane(kw, 3, ks)), s)
        s = tl.where(tmask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        pb = p.to(tl.bfloat16)
        a0 = tl.dot(pb, _e4m3_plane(vw, 0, vs), a0 * alpha[:, None])
        a1 = tl.dot(pb, _e4m3_plane(vw, 1, vs), a1 * alpha[:, None])
        a2 = tl.dot(pb, _e4m3_plane(vw, 2, vs), a2 * alpha[:, None])
        a3 = tl.dot(pb, _e4m3_plane(vw, 3, vs), a3 * alpha[:, None])
        m = m_new
    row = (b * HQ + kvh * G + offs_g) * S + split
    tl.store(m_ptr + row, m, mask=gmask)
    tl.store(l_ptr + row, l, mask=gmask)
    acc_row = acc_ptr + row[:, None] * D + offs_w[None, :] * 4
    tl.store(acc_row + 0, a0, mask=gmask[:, None])
    tl.store(acc_row + 1, a1, mask=gmask[:, None])
    tl.store(acc_row + 2, a2, mask=gmask[:, None])
    tl.store(acc_row + 3, a3, mask=gmask[:, None])


def decode_attention_planes(q, k_cache, v_cache, k_scale, v_scale, pos, out, ws, hq, hkv, d, sm_scale):
    """kernels.decode_attention for an E4M3 cache through attn_split_planes."""
    from core.engines.fast import kernels as K

    B = q.shape[0]
    g = hq // hkv
    kw, vw = k_cache.view(torch.int32), v_cache.view(torch.int32)
    attn_split_planes[(B * hkv, ws.splits)](
        q, kw, vw, k_scale, v_scale, pos, ws.m, ws.l, ws.acc, sm_scale * 1.4426950408889634, ws.split_len,
        ws.splits, kw.stride(0), kw.stride(1), kw.stride(2), k_scale.stride(0), k_scale.stride(1),
        HQ=hq, HKV=hkv, G=g, GP=max(16, triton.next_power_of_2(g)), D=d, BLOCK_T=ws.block_t,
        num_warps=ws.num_warps, num_stages=ws.num_stages)
    K._attn_combine_kernel[(B * hq,)](ws.m, ws.l, ws.acc, out, out, ws.splits, D=d,
                                      SP=triton.next_power_of_2(ws.splits), CH=16, WANT_OUT16=False, num_warps=4,
                                      PDL=False)
    return out


@triton.jit
def _e4m3_as_f32_low(w, SIGN: tl.constexpr):
    """E4M3 -> float32 equal to the value x 2^-120 by moving bits, no conversion instruction: exponent and mantissa
    land in float32's, so normals come out 120 binades low and subnormals as float32 subnormals (exact either way).
    SIGN=False drops the sign: wrong values, only to time one integer operation fewer."""
    b = w.to(tl.uint8, bitcast=True).to(tl.int32)
    if SIGN:
        b = ((b & 0x7F) << 20) | ((b & 0x80) << 24)
    else:
        b = b << 20
    return b.to(tl.float32, bitcast=True)


# 2^119 on the activation and 2 on the sum undo the 2^-120 of _e4m3_as_f32_low exactly: an E4M3 activation (<= 448)
# times 2^119 stays below float32's largest value, and every product of two E4M3 values stays a float32 normal
ACT_UP = tl.constexpr(2.0 ** 119)


@triton.jit
def gemv_w8a8_prologue(w_ptr, ws_ptr, x_ptr, out_ptr, N, stride_wn, K: tl.constexpr, KP2: tl.constexpr,
                       BLOCK_N: tl.constexpr, CONVERT: tl.constexpr, PDL: tl.constexpr):
    """kernels._gemv_prologue_kernel for W8A8 without the norm (a bf16 row in, quantized per program), with the weight
    converted by CONVERT: 0 as kernels.py does (cvt), 1 _e4m3_as_f32_low, 2 the same without the sign."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    offs_k = tl.arange(0, KP2)
    kmask = offs_k < K
    w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=nmask[:, None] & kmask[None, :],
                other=0.0)
    if PDL:
        _pdl_enter()
    x = tl.load(x_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / 448.0
    x = tl.clamp(x / scale, -448.0, 448.0).to(tl.float8e4nv).to(tl.float32)
    if CONVERT == 0:
        out = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    else:
        out = tl.sum(_e4m3_as_f32_low(w, CONVERT == 1) * (x * ACT_UP)[None, :], axis=1) * 2.0
    out = out * tl.load(ws_ptr + offs_n, mask=nmask, other=0.0) * scale
    tl.store(out_ptr + offs_n, out.to(tl.bfloat16), mask=nmask)


@triton.jit
def gemv_w8a8(x_ptr, w_ptr, ws_ptr, xs_ptr, out_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              CONVERT: tl.constexpr, PDL: tl.constexpr):
    """kernels._gemv_kernel for W8A8 (E4M3 row in, EVEN shapes, first-tile prefetch), the weight converted by
    CONVERT as in gemv_w8a8_prologue."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    w = tl.load(w_ptrs)
    if PDL:
        _pdl_enter()
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + k0 + offs_k).to(tl.float32)
        if CONVERT == 0:
            acc += w.to(tl.float32) * x[None, :]
        else:
            acc += _e4m3_as_f32_low(w, CONVERT == 1) * (x * ACT_UP)[None, :]
        w_ptrs += BLOCK_K
        if k0 + BLOCK_K < K:
            w = tl.load(w_ptrs)
    out = tl.sum(acc, axis=1)
    if CONVERT != 0:
        out = out * 2.0
    out = out * tl.load(ws_ptr + offs_n) * tl.load(xs_ptr)
    tl.store(out_ptr + offs_n, out.to(tl.bfloat16))
