"""Kernel variants bench/kernel_probe.py measures against core/engines/fast/kernels.py: E4M3 read as int32 words and
unpacked in registers (vector loads instead of Triton's byte-wise shared-memory loads). Measured no faster on the H200
(docs/PERFORMANCE.md), so they stay here, as the record of what was tried."""
import triton
import triton.language as tl


@triton.jit
def _unpack_e4m3(w, scale):
    """[T, D/4] int32 words of E4M3 bytes -> [T, D] bf16 = (e4m3 * scale[:, None]), bytes in memory order."""
    b0 = (w & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    b1 = ((w >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    b2 = ((w >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    b3 = ((w >> 24) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    x = tl.join(tl.join(b0, b2), tl.join(b1, b3))
    x = tl.reshape(x, (w.shape[0], w.shape[1] * 4))
    return (x * scale[:, None]).to(tl.bfloat16)


@triton.jit
def attn_split_words(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, SPLIT_LEN,
                     S, stride_cb, stride_ch, stride_ct, stride_sb, stride_sh,
                     HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                     BLOCK_T: tl.constexpr, FP8: tl.constexpr):
    """k_ptr / v_ptr are the E4M3 caches viewed as int32 (strides in int32 words)."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    kvh = bh % HKV
    length = tl.load(pos_ptr + b) + 1
    start = split * SPLIT_LEN
    end = tl.minimum(start + SPLIT_LEN, length)
    offs_g = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    offs_w = tl.arange(0, D // 4)
    gmask = offs_g < G
    q = tl.load(q_ptr + (b * HQ + kvh * G + offs_g[:, None]) * D + offs_d[None, :], mask=gmask[:, None], other=0.0)
    m = tl.full([GP], float("-inf"), tl.float32)
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    base = b * stride_cb + kvh * stride_ch
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tmask = offs_t < end
        kv_off = base + offs_t[:, None] * stride_ct + offs_w[None, :]
        kw = tl.load(k_ptr + kv_off, mask=tmask[:, None], other=0)
        vw = tl.load(v_ptr + kv_off, mask=tmask[:, None], other=0)
        ks = tl.load(ks_ptr + b * stride_sb + kvh * stride_sh + offs_t, mask=tmask, other=0.0)
        vs = tl.load(vs_ptr + b * stride_sb + kvh * stride_sh + offs_t, mask=tmask, other=0.0)
        k = _unpack_e4m3(kw, ks)
        v = _unpack_e4m3(vw, vs)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m = m_new
    row = (b * HQ + kvh * G + offs_g) * S + split
    tl.store(m_ptr + row, m, mask=gmask)
    tl.store(l_ptr + row, l, mask=gmask)
    tl.store(acc_ptr + row[:, None] * D + offs_d[None, :], acc, mask=gmask[:, None])


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
