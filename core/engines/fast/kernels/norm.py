"""The row kernels of a decode step and a prompt pass: residual add + RMSNorm, SiLU(gate) * up, and W8A8's per-token
E4M3 quantization written by the kernel that produces the row."""
from __future__ import annotations

import triton
import triton.language as tl

from core.engines.fast.kernels.launch import launch_options, pdl_enter


@triton.jit
def _add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, h_ptr, s_ptr, q_ptr, h16_ptr, N, eps, HAS_DELTA: tl.constexpr,
                        WANT_H: tl.constexpr, WANT_SCALE: tl.constexpr, WANT_H16: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    if PDL:
        pdl_enter()
    row = tl.program_id(0).to(tl.int64)  # row * N passes 2^31 in a long prefill (125K tokens x 28,672)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=0.0)
    if HAS_DELTA:
        # bf16 + bf16 rounded to bf16, as `residual + hidden_states` does in the reference
        x = (x.to(tl.float32) + tl.load(d_ptr + row * N + offs, mask=mask, other=0.0).to(tl.float32)).to(tl.bfloat16)
        tl.store(x_ptr + row * N + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # HF: weight * (x * rstd).to(bf16), the product rounded to bf16
    h = ((xf * rstd).to(tl.bfloat16).to(tl.float32) * w).to(tl.bfloat16)
    if WANT_H:
        tl.store(h_ptr + row * N + offs, h, mask=mask)
    if WANT_H16:
        tl.store(h16_ptr + row * N + offs, h.to(tl.float16), mask=mask)
    if WANT_SCALE:
        _quantize_row(h, s_ptr, q_ptr, row, N, offs, mask)


@triton.jit
def _quantize_row(v, s_ptr, q_ptr, row, N, offs, mask):
    """core.engines.torch.fp8.quantize_rows of one bf16 row: scale = max(amax, 1e-12) / 448, q = (v / scale) -> E4M3 (RNE).
    Done where the row is produced, so W8A8 linears read E4M3 activations (half the bytes, no work in their loop)."""
    vf = v.to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(vf), axis=0), 1e-12) / 448.0
    tl.store(s_ptr + row, scale)
    tl.store(q_ptr + row * N + offs, tl.clamp(vf / scale, -448.0, 448.0).to(tl.float8e4nv), mask=mask)


@triton.jit
def _silu_mul_kernel(gu_ptr, a_ptr, s_ptr, q_ptr, a16_ptr, I, WANT_A: tl.constexpr, WANT_SCALE: tl.constexpr,
                     WANT_A16: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        pdl_enter()
    row = tl.program_id(0).to(tl.int64)  # row * N passes 2^31 in a long prefill (125K tokens x 28,672)
    offs = tl.arange(0, BLOCK)
    mask = offs < I
    g = tl.load(gu_ptr + row * 2 * I + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * I + I + offs, mask=mask, other=0.0).to(tl.float32)
    a = ((g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * u).to(tl.bfloat16)
    if WANT_A:
        tl.store(a_ptr + row * I + offs, a, mask=mask)
    if WANT_A16:
        tl.store(a16_ptr + row * I + offs, a.to(tl.float16), mask=mask)
    if WANT_SCALE:
        _quantize_row(a, s_ptr, q_ptr, row, I, offs, mask)


@triton.jit
def _row_quant_kernel(x_ptr, s_ptr, q_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        pdl_enter()
    row = tl.program_id(0).to(tl.int64)  # row * N passes 2^31 in a long prefill (125K tokens x 28,672)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    _quantize_row(tl.load(x_ptr + row * N + offs, mask=mask, other=0.0), s_ptr, q_ptr, row, N, offs, mask)


def _row_warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


def add_rmsnorm(x, delta, weight, eps, h_out, scale_out=None, q_out=None, h16_out=None):
    """x += delta (in place, when delta is given); h_out = RMSNorm(x) * weight; with scale_out and q_out also
    h quantized per row to E4M3 (W8A8's activation quantization). h_out may be None when only the E4M3 copy is
    read (W8A8's prompt pass: at 8K tokens the unread bf16 copies were ~4 GB of writes per pass). h16_out: h in
    f16 too, for weight-only linears (`linear`'s x16)."""
    assert h_out is not None or q_out is not None
    M, N = x.shape
    block = triton.next_power_of_2(N)
    _add_rmsnorm_kernel[(M,)](x, delta if delta is not None else x, weight, h_out if h_out is not None else x,
                              scale_out if scale_out is not None else x, q_out if q_out is not None else x,
                              h16_out if h16_out is not None else x, N, eps, HAS_DELTA=delta is not None,
                              WANT_H=h_out is not None, WANT_SCALE=scale_out is not None,
                              WANT_H16=h16_out is not None, BLOCK=block, num_warps=_row_warps(block),
                              **launch_options())
    return h_out


def silu_mul(gu, a_out, scale_out=None, q_out=None, a16_out=None):
    """a_out = SiLU(gate) * up of the [M, 2I] gate/up output; with scale_out and q_out also a quantized per row to
    E4M3; a_out may be None when only that copy is read. a16_out: a in f16 too (`linear`'s x16)."""
    assert a_out is not None or q_out is not None
    M, two_i = gu.shape
    block = triton.next_power_of_2(two_i // 2)
    a = a_out if a_out is not None else gu
    _silu_mul_kernel[(M,)](gu, a, scale_out if scale_out is not None else a, q_out if q_out is not None else a,
                           a16_out if a16_out is not None else a, two_i // 2, WANT_A=a_out is not None,
                           WANT_SCALE=scale_out is not None, WANT_A16=a16_out is not None, BLOCK=block,
                           num_warps=_row_warps(block), **launch_options())
    return a_out


def row_quant(x, scale_out, q_out):
    M, N = x.shape
    block = triton.next_power_of_2(N)
    _row_quant_kernel[(M,)](x, scale_out, q_out, N, BLOCK=block, num_warps=_row_warps(block), **launch_options())
    return q_out
