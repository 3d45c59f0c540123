"""The row kernels of a decode step and a prompt pass: residual add + RMSNorm, SiLU(gate) * up, and W8A8's per-token
E4M3 quantization written by the kernel that produces the row.

A linear's output read here (the residual's delta, gate|up) may be a library kernel's own float32 output rather than
the step's bf16 buffer (kernels/library.py: gemlite adds split-K partial sums in float32): each value is rounded to
bf16 as it is loaded, which is what copying it into the bf16 buffer did, one launch and one pass fewer. For INT4 AWQ
the producers also write their row divided by the next linear's input scales (`div`), so that linear's kernel reads
x / s without a division launch of its own."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.engines.fast.kernels.launch import launch_options, pdl_enter


@triton.jit
def _add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, h_ptr, s_ptr, q_ptr, h16_ptr, div_ptr, hd_ptr, M, N, eps,
                        HAS_DELTA: tl.constexpr, WANT_H: tl.constexpr, WANT_SCALE: tl.constexpr,
                        WANT_H16: tl.constexpr, DIVS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        pdl_enter()
    row = tl.program_id(0).to(tl.int64)  # row * N passes 2^31 in a long prefill (125K tokens x 28,672)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=0.0)
    if HAS_DELTA:
        # bf16 + bf16 rounded to bf16, as `residual + hidden_states` does in the reference (a float32 delta rounded
        # to bf16 first, as its copy into a bf16 buffer would)
        d = tl.load(d_ptr + row * N + offs, mask=mask, other=0.0).to(tl.bfloat16)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(tl.bfloat16)
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
    _divided_rows(h, div_ptr, hd_ptr, row, M, N, offs, mask, DIVS)


@triton.jit
def _divided_rows(v, div_ptr, out_ptr, row, M, N, offs, mask, DIVS: tl.constexpr):
    """INT4 AWQ: out[j * M + row] = bf16(v / s_j) for each of the next linear's DIVS projections (div [DIVS, N]
    float32), the division correctly rounded as kernels/library.py's division launch and torch do it."""
    vf = v.to(tl.float32)
    for j in tl.static_range(DIVS):
        s = tl.load(div_ptr + j * N + offs, mask=mask, other=1.0)
        tl.store(out_ptr + (j * M + row) * N + offs, tl.math.div_rn(vf, s).to(tl.bfloat16), mask=mask)


@triton.jit
def _quantize_row(v, s_ptr, q_ptr, row, N, offs, mask):
    """core.engines.torch.fp8.quantize_rows of one bf16 row: scale = max(amax, 1e-12) / 448, q = (v / scale) -> E4M3 (RNE).
    Done where the row is produced, so W8A8 linears read E4M3 activations (half the bytes, no work in their loop)."""
    vf = v.to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(vf), axis=0), 1e-12) / 448.0
    tl.store(s_ptr + row, scale)
    tl.store(q_ptr + row * N + offs, tl.clamp(vf / scale, -448.0, 448.0).to(tl.float8e4nv), mask=mask)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, a_ptr, s_ptr, q_ptr, a16_ptr, div_ptr, ad_ptr, M, I, stride_g, stride_u,
                     WANT_A: tl.constexpr, WANT_SCALE: tl.constexpr, WANT_A16: tl.constexpr, DIVS: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        pdl_enter()
    row = tl.program_id(0).to(tl.int64)  # row * N passes 2^31 in a long prefill (125K tokens x 28,672)
    offs = tl.arange(0, BLOCK)
    mask = offs < I
    # gate and up rounded to bf16 as loaded (a float32 library output), each from its own source (gate_up_sources)
    g = tl.load(g_ptr + row * stride_g + offs, mask=mask, other=0.0).to(tl.bfloat16).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + offs, mask=mask, other=0.0).to(tl.bfloat16).to(tl.float32)
    a = ((g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * u).to(tl.bfloat16)
    if WANT_A:
        tl.store(a_ptr + row * I + offs, a, mask=mask)
    if WANT_A16:
        tl.store(a16_ptr + row * I + offs, a.to(tl.float16), mask=mask)
    if WANT_SCALE:
        _quantize_row(a, s_ptr, q_ptr, row, I, offs, mask)
    _divided_rows(a, div_ptr, ad_ptr, row, M, I, offs, mask, DIVS)


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


def _divided_out(div, div_out, rows: int, n: int):
    """Checked (div [S, n] float32, div_out [S * rows, n] bf16) of a producer's AWQ-divided rows, or none."""
    if div is None:
        return 0
    assert div.dtype == torch.float32 and div.is_contiguous() and div.shape[1] == n, "div: [S, n] float32"
    assert div_out is not None and div_out.is_contiguous() and div_out.shape == (div.shape[0] * rows, n)
    return div.shape[0]


def add_rmsnorm(x, delta, weight, eps, h_out, scale_out=None, q_out=None, h16_out=None, div=None, div_out=None):
    """x += delta (in place, when delta is given; bf16, or a library's float32 output rounded as loaded);
    h_out = RMSNorm(x) * weight; with scale_out and q_out also h quantized per row to E4M3 (W8A8's activation
    quantization). h_out may be None when only the E4M3 copy is read (W8A8's prompt pass: at 8K tokens the unread
    bf16 copies were ~4 GB of writes per pass). h16_out: h in f16 too, for weight-only linears (`linear`'s x16).
    div [S, N] float32 with div_out [S * M, N]: h divided by each of S input scales too (INT4 AWQ's next linear)."""
    assert h_out is not None or q_out is not None
    M, N = x.shape
    assert delta is None or (delta.shape == x.shape and delta.is_contiguous()), "delta: [M, N] contiguous"
    divs = _divided_out(div, div_out, M, N)
    block = triton.next_power_of_2(N)
    _add_rmsnorm_kernel[(M,)](x, delta if delta is not None else x, weight, h_out if h_out is not None else x,
                              scale_out if scale_out is not None else x, q_out if q_out is not None else x,
                              h16_out if h16_out is not None else x, div if divs else x, div_out if divs else x,
                              M, N, eps, HAS_DELTA=delta is not None, WANT_H=h_out is not None,
                              WANT_SCALE=scale_out is not None, WANT_H16=h16_out is not None, DIVS=divs,
                              BLOCK=block, num_warps=_row_warps(block), **launch_options())
    return h_out


def gate_up_sources(gu, rows: int) -> tuple:
    """(gate, up) views [rows, I] of the gate|up output: one [rows, 2I] tensor, the same in two row blocks
    [2 rows, 2I] (gate valid in the first block's first half, up in the second's second half: INT4 AWQ's one
    kernel over both projections' divided rows), or two tensors already (one kernel per projection)."""
    if isinstance(gu, (tuple, list)):
        g, u = gu
    else:
        assert gu.shape[0] in (rows, 2 * rows), f"gate|up has {gu.shape[0]} rows for {rows}"
        half = gu.shape[1] // 2
        g, u = gu[:rows, :half], gu[gu.shape[0] - rows:, half:]
    assert g.shape == u.shape and g.shape[0] == rows and g.stride(1) == 1 and u.stride(1) == 1
    return g, u


def silu_mul(gu, a_out, scale_out=None, q_out=None, a16_out=None, div=None, div_out=None):
    """a_out = SiLU(gate) * up of the gate|up output (`gate_up_sources`: bf16, or a library's float32 output, maybe
    in row blocks or two tensors). With scale_out and q_out also a quantized per row to E4M3; a_out may be None
    when only that copy is read. a16_out: a in f16 too (`linear`'s x16). div [S, I] float32 with div_out
    [S * M, I]: a divided by the down projection's AWQ input scales too."""
    assert a_out is not None or q_out is not None or div_out is not None
    M = a_out.shape[0] if a_out is not None else q_out.shape[0] if q_out is not None else \
        div_out.shape[0] // div.shape[0]
    g, u = gate_up_sources(gu, M)
    inter = g.shape[1]
    divs = _divided_out(div, div_out, M, inter)
    block = triton.next_power_of_2(inter)
    a = next(t for t in (a_out, q_out, div_out) if t is not None)
    _silu_mul_kernel[(M,)](g, u, a, scale_out if scale_out is not None else a, q_out if q_out is not None else a,
                           a16_out if a16_out is not None else a, div if divs else a, div_out if divs else a,
                           M, inter, g.stride(0), u.stride(0), WANT_A=a_out is not None,
                           WANT_SCALE=scale_out is not None, WANT_A16=a16_out is not None, DIVS=divs, BLOCK=block,
                           num_warps=_row_warps(block), **launch_options())
    return a_out


def row_quant(x, scale_out, q_out):
    M, N = x.shape
    block = triton.next_power_of_2(N)
    _row_quant_kernel[(M,)](x, scale_out, q_out, N, BLOCK=block, num_warps=_row_warps(block), **launch_options())
    return q_out
