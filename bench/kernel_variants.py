"""Kernel variants bench/kernel_probe.py measures against core/engines/fast/kernels.py, for weight-only FP8 at several
rows: E4M3 read as int32 words and unpacked in registers (vector loads instead of Triton's byte-wise shared-memory
loads), measured no faster on the H200 (docs/PERFORMANCE.md), so it stays here as the record of what was tried; and
the f16 dot not swapped (activation rows as the first operand), no faster at 64 rows (2026-12-02).
(The dot in float16, measured here on 2026-12-02, won and is now kernels.py's weight-only path; decode attention
from int32 words, no faster, is in the history: bench/kernel_variants.py at commit 1d95ca3.)"""
import triton
import triton.language as tl


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
