"""The integer linears' passes outside the decode GEMMs: the prompt pass (`prompt_linear`: weight-only dequantizes
the weights once into a cuBLAS GEMM, W8A8 multiplies on the INT8 tensor cores) and W8A8's per-token activation
quantization (`int8_rows`, also the first launch of a W8A8 decode product). Numerics: int_weight.py's references,
bit for bit (tests/engines/test_int_kernels.py under the interpreter, tests/gpu on the GPU)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.engines.fast.int_weight import GROUP, MODE_INT8, MODE_INT8_WO, IntWeight
from core.engines.fast.kernels.launch import launch_options, pdl_enter
from core.engines.fast.kernels.rounding import ROUND_MAGIC, div_rn, load_x, to_bf16


@triton.jit
def _int8_rows_kernel(x_ptr, q_ptr, s_ptr, K: tl.constexpr, stride_xm, stride_qm, SILU_X: tl.constexpr, BLOCK: tl.constexpr,
                      PDL: tl.constexpr):
    """One row of x (or of SiLU(gate) * up, rounded as silu_mul rounds it) to int8 with its float32 scale, as
    core.engines.torch.quant.int8_rows: amax / 127, x / scale (correctly rounded) rounded half to even, +-127."""
    if PDL:
        pdl_enter()
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    zero = tl.zeros([1], dtype=tl.int32)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        x = load_x(x_ptr + row * stride_xm, zero, k0 + offs, 1, K, 0, SILU_X)  # [BLOCK, 1]
        amax = tl.maximum(amax, tl.abs(tl.reshape(x.to(tl.float32), (BLOCK,))))
    amax = tl.maximum(tl.max(amax, axis=0), 1e-12)
    scale = tl.math.div_rn(amax, 127.0)
    inv = tl.math.div_rn(1.0, scale)
    for k0 in range(0, K, BLOCK):
        x = tl.reshape(load_x(x_ptr + row * stride_xm, zero, k0 + offs, 1, K, 0, SILU_X).to(tl.float32), (BLOCK,))
        v = div_rn(x, scale, inv)
        v = (v + ROUND_MAGIC) - ROUND_MAGIC
        v = tl.minimum(tl.maximum(v, -127.0), 127.0)
        tl.store(q_ptr + row * stride_qm + k0 + offs, v.to(tl.int8), mask=k0 + offs < K)
    tl.store(s_ptr + row, scale)


@triton.jit
def _dequant_kernel(w_ptr, ws_ptr, wz_ptr, isc_ptr, irc_ptr, seg_ptr, out_ptr, N, K, stride_wn, stride_sn,
                    stride_isc, MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The bf16 weights [N, K] of the reference's `dequantized(bf16)`, for the prompt pass's cuBLAS GEMMs."""
    pid_n = tl.program_id(0)
    t = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    if MODE == 5:
        k = t * BLOCK_K + tl.arange(0, BLOCK_K)
        m = nmask[:, None] & (k[None, :] < K)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :], mask=m, other=0)
        ws = tl.load(ws_ptr + offs_n, mask=nmask, other=0.0)
        tl.store(out_ptr + offs_n[:, None] * K + k[None, :], to_bf16(w.to(tl.float32) * ws[:, None]),
                 mask=m)
    else:
        HALF: tl.constexpr = BLOCK_K // 2
        offs_h = tl.arange(0, HALF)
        if MODE == 4:
            seg = tl.load(seg_ptr + offs_n, mask=nmask, other=0)
            isc = isc_ptr + seg[:, None] * stride_isc
            irc = irc_ptr + seg[:, None] * stride_isc
        else:
            isc = isc_ptr
            irc = irc_ptr
        p = tl.load(w_ptr + offs_n[:, None] * stride_wn + t * HALF + offs_h[None, :], mask=nmask[:, None], other=0)
        s = tl.load(ws_ptr + offs_n * stride_sn + t, mask=nmask, other=0.0).to(tl.float32)
        z = tl.load(wz_ptr + offs_n * stride_sn + t, mask=nmask, other=0).to(tl.float32)
        k_even = t * BLOCK_K + 2 * offs_h
        for j in tl.static_range(2):
            w = ((p >> (4 * j)) & 0xF).to(tl.float32)
            w = (w - z[:, None]) * s[:, None]
            if MODE == 4:
                w = div_rn(w, tl.load(isc + k_even[None, :] + j), tl.load(irc + k_even[None, :] + j))
            k = k_even + j
            tl.store(out_ptr + offs_n[:, None] * K + k[None, :], to_bf16(w),
                     mask=nmask[:, None] & (k[None, :] < K))


@triton.jit
def _int8_epilogue_kernel(acc_ptr, xs_ptr, ws_ptr, out_ptr, N, BLOCK: tl.constexpr):
    """The prompt pass's W8A8 scaling in one pass over torch._int_mm's int32 result: (acc * x_scale) * w_scale."""
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    acc = tl.load(acc_ptr + row * N + offs, mask=m, other=0).to(tl.float32)
    out = acc * tl.load(xs_ptr + row) * tl.load(ws_ptr + offs, mask=m, other=0.0)
    tl.store(out_ptr + row * N + offs, to_bf16(out), mask=m)



def dequantize(iw: IntWeight, out: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 [N, K] weights, bit for bit `reference_dequantized` (one Triton pass over the codes)."""
    assert iw.mode != MODE_INT8, "W8A8 multiplies int8 by int8; it never dequantizes its weights"
    out = torch.empty(iw.n, iw.k, dtype=torch.bfloat16, device=iw.w.device) if out is None else out
    bn, bk = 32, (GROUP if iw.mode != MODE_INT8_WO else 256)
    dummy = iw.scale
    grid = (triton.cdiv(iw.n, bn), triton.cdiv(iw.k, bk))
    _dequant_kernel[grid](iw.w, iw.scale, iw.zero if iw.zero is not None else dummy,
                          iw.in_scale if iw.in_scale is not None else dummy,
                          iw.in_recip if iw.in_recip is not None else dummy,
                          iw.row_seg if iw.row_seg is not None else dummy, out, iw.n, iw.k, iw.w.stride(0),
                          iw.scale.stride(0), iw.in_scale.stride(0) if iw.in_scale is not None else 0,
                          MODE=iw.mode, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    return out


def int8_rows(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, silu_x: bool = False):
    """x [M, K] (or [M, 2K] gate|up with silu_x) -> int8 q [M, K] and float32 s [M]: quant.int8_rows on the GPU."""
    M = x.shape[0]
    K = q.shape[1]
    _int8_rows_kernel[(M,)](x, q, s, K, x.stride(0), q.stride(0), SILU_X=silu_x,
                            BLOCK=min(2048, triton.next_power_of_2(K)), num_warps=4, **launch_options())
    return q, s


def prompt_linear(x: torch.Tensor, iw: IntWeight) -> torch.Tensor:
    """Many rows (the prompt pass, compute-bound): weight-only dequantizes the weights once (`dequantize`, the
    reference's bf16 weights) into a cuBLAS GEMM; W8A8 quantizes the rows (`int8_rows`), multiplies on the INT8
    tensor cores (quant.int_mm, as the reference) and scales in one pass. `reference_linear`'s numbers."""
    from core.engines.torch import quant

    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    if iw.mode != MODE_INT8:
        out = torch.nn.functional.linear(x2, dequantize(iw))
    else:
        M = x2.shape[0]
        xq = torch.empty(M, iw.k, dtype=torch.int8, device=x.device)
        xs = torch.empty(M, dtype=torch.float32, device=x.device)
        int8_rows(x2, xq, xs)
        acc, _ = quant.int_mm(xq, iw.w.t())
        acc = acc.contiguous()
        out = torch.empty(M, iw.n, dtype=x.dtype, device=x.device)
        _int8_epilogue_kernel[(M, triton.cdiv(iw.n, 1024))](acc, xs, iw.scale, out, iw.n, BLOCK=1024, num_warps=4)
    return out.reshape(*shape[:-1], iw.n)
