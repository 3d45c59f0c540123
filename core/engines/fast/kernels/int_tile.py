"""The integer linears' tile kernel: out[M, N] = x[M, K] @ dequant(w)[N, K]^T for the decode step (1-64 rows) on
the tensor cores, INT4 g128 (optionally AWQ-scaled), INT8 weight-only, and INT8 W8A8 (int8 x int8 dots, int32 sums).

Weight-only: every weight is dequantized in registers to exactly the bf16 value the torch engine's
`Int4Linear.dequantized(bf16)` / `Int8Linear.dequantized(bf16)` gives ((q - zero) * scale in float32, for AWQ divided
by the float16 input scale, correctly rounded, then rounded to bf16), and multiplied with the bf16 activations with
float32 accumulation, as the reference's bf16 GEMM does (only the order of the float32 additions differs). W8A8: the
activations quantized per token by int_prompt.int8_rows, the int8 products summed in int32 (exact: `torch._int_mm`'s
result bit for bit) and scaled as the reference scales them ((acc * x_scale) * w_scale in float32, then bf16).

The weight tile is the wide operand of `tl.dot` and the few activation rows the narrow one ("swap AB", as
linears.py), so each weight byte streams from HBM once per step. INT4 tiles are one group (128 inputs, 64 bytes a
row) along K: the low nibbles multiply the even inputs and the high nibbles the odd ones (two dots), so the codes are
never interleaved in registers. With SPLIT_K > 1 several programs share an output tile; the tile's last program adds
the slices in slice order (deterministic), as linears.py does. `int_finish` is shared with int_gemv.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.engines.fast.int_weight import GROUP, INT4_MODES, MODE_INT8, IntWeight, scale_args
from core.engines.fast.kernels.launch import launch_options, pdl_enter
from core.engines.fast.kernels.linears import block_m_for
from core.engines.fast.kernels.rounding import div_rn, load_x, mma, to_bf16
from core.engines.fast.kernels.scratch import split_k_total, split_parts


@triton.jit
def _int4_half(p, s, z, isc_ptr, irc_ptr, offs_k, K, AWQ: tl.constexpr):
    """bf16 weights [BLOCK_N, 64] from the 4-bit codes p (uint8, one nibble already selected), per-row group scale s
    and zero point z (float32): Int4Linear.dequantized's arithmetic."""
    # a conversion per code: ORing unpacked codes into 2^23's mantissa was slower (docs/fast-engine.md#int-decode)
    w = (p.to(tl.float32) - z[:, None]) * s[:, None]  # exact: a 5-bit integer times an 11-bit float16 scale
    if AWQ:
        b = tl.load(isc_ptr + offs_k, mask=offs_k < K, other=1.0)  # a slice's tiles past K: codes 0, x 0
        r = tl.load(irc_ptr + offs_k, mask=offs_k < K, other=1.0)
        w = div_rn(w, b[None, :], r[None, :])
    return to_bf16(w)


# M is not specialized so that batch 1 and batch 8 share one compiled kernel per configuration
@triton.jit(do_not_specialize=["M"])
def _int_linear_kernel(x_ptr, w_ptr, ws_ptr, wz_ptr, isc_ptr, irc_ptr, seg_ptr, xs_ptr, out_ptr, part_ptr,
                       count_ptr, M, N, stride_xm, stride_wn, stride_sn, stride_isc, stride_om,
                       K: tl.constexpr, K_PER: tl.constexpr, MODE: tl.constexpr, SILU_X: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr):
    """out[M, N] = x[M, K] @ dequant(w)[N, K]^T for one [BLOCK_N, BLOCK_M] tile (or one K slice of it)."""
    if PDL:
        pdl_enter()
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    nmask = offs_n < N
    # K and the slice length K_PER are constexprs: the loops' bounds are then plain numbers (one compile per model
    # width; Triton's CPU interpreter also needs that with numpy >= 2.4)
    k_lo = 0
    if SPLIT_K > 1:
        k_lo = tl.program_id(2) * K_PER
    if MODE == 6:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if MODE == 3 or MODE == 4:
        HALF: tl.constexpr = BLOCK_K // 2
        offs_h = tl.arange(0, HALF)
        if MODE == 4:
            # AWQ: the tile's rows share one projection's input scales (q, k or v; gate or up)
            seg = tl.load(seg_ptr + pid_n * BLOCK_N)
            isc = isc_ptr + seg * stride_isc
            irc = irc_ptr + seg * stride_isc
        else:
            isc = isc_ptr
            irc = irc_ptr
        for kk in range(0, K_PER, BLOCK_K):
            k0 = k_lo + kk
            t = k0 // BLOCK_K
            live = k0 < K  # the last slice may end past K
            p = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k0 // 2) + offs_h[None, :],
                        mask=nmask[:, None] & live, other=0)
            s = tl.load(ws_ptr + offs_n * stride_sn + t, mask=nmask & live, other=0.0).to(tl.float32)
            z = tl.load(wz_ptr + offs_n * stride_sn + t, mask=nmask & live, other=0).to(tl.float32)
            k_even = k0 + 2 * offs_h
            w_lo = _int4_half(p & 0xF, s, z, isc, irc, k_even, K, MODE == 4)
            w_hi = _int4_half(p >> 4, s, z, isc, irc, k_even + 1, K, MODE == 4)
            x_even = load_x(x_ptr, offs_m, k_even, M, K, stride_xm, SILU_X)
            x_odd = load_x(x_ptr, offs_m, k_even + 1, M, K, stride_xm, SILU_X)
            acc = mma(w_lo, x_even, acc)
            acc = mma(w_hi, x_odd, acc)
    else:
        offs_k = tl.arange(0, BLOCK_K)
        if MODE == 5:
            ws = tl.load(ws_ptr + offs_n, mask=nmask, other=0.0)
        for kk in range(0, K_PER, BLOCK_K):
            k = k_lo + kk + offs_k
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :], mask=nmask[:, None] & (k[None, :] < K),
                        other=0)
            if MODE == 5:
                wb = to_bf16(w.to(tl.float32) * ws[:, None])  # Int8Linear.dequantized(bf16)
                acc = mma(wb, load_x(x_ptr, offs_m, k, M, K, stride_xm, SILU_X), acc)
            else:
                xq = tl.load(x_ptr + offs_m[None, :] * stride_xm + k[:, None],
                             mask=(offs_m[None, :] < M) & (k[:, None] < K), other=0)
                acc = tl.dot(w, xq, acc, out_dtype=tl.int32)
    mask = (offs_m[None, :] < M) & nmask[:, None]
    int_finish(acc, ws_ptr, xs_ptr, out_ptr, part_ptr, count_ptr + pid_m * tl.num_programs(0) + pid_n,
                tl.program_id(2), offs_m, offs_n, M, N, stride_om, mask, MODE, SPLIT_K)


@triton.jit
def int_finish(acc, ws_ptr, xs_ptr, out_ptr, part_ptr, counter, slice_id, offs_m, offs_n, M, N, stride_om, mask,
                MODE: tl.constexpr, SPLIT_K: tl.constexpr):
    """Store a tile's result; with SPLIT_K > 1 store this K slice's partial sums, and the tile's last program adds
    the slices in slice order (deterministic) and stores the result."""
    if SPLIT_K == 1:
        _int_store(acc, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE)
    else:
        last, total = split_k_total(acc, part_ptr, counter, slice_id, offs_m, offs_n, M, N, mask, SPLIT_K)
        if last:
            _int_store(total, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE)



@triton.jit
def _int_store(acc, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE: tl.constexpr):
    if MODE == 6:
        # Int8Linear.forward: (acc * x_scale) * w_scale in float32, then bf16
        out = acc.to(tl.float32) * tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)[None, :]
        out = out * tl.load(ws_ptr + offs_n, mask=offs_n < N, other=0.0)[:, None]
    else:
        out = acc
    tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], to_bf16(out),
             mask=mask)



def default_config(mode: int, m: int, n: int, k: int) -> dict:
    """The tile kernel's launch where the tuning table has no entry."""
    bk = GROUP if mode in INT4_MODES else 256
    bn = 64 if block_m_for(m) >= 64 else 32
    split = 1
    # narrow outputs: fewer than ~2 programs an SM leave HBM idle; cut K instead
    while triton.cdiv(n, bn) * split < 264 and triton.cdiv(triton.cdiv(k, bk), split * 2) >= 4 and split < 8:
        split *= 2
    return dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=4, num_stages=4)



def tile_linear(x: torch.Tensor, iw: IntWeight, out: torch.Tensor, silu_x: bool, cfg: dict,
                xs: torch.Tensor | None = None) -> torch.Tensor:
    """One launch of the tile kernel (cfg: BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages, already fitted to the
    weight: int_weight.fit_config). W8A8: x is the int8 rows and xs their scales (int_prompt.int8_rows)."""
    M = x.shape[0]
    N, K = iw.n, iw.k
    bn, bk, bm = cfg["BLOCK_N"], cfg["BLOCK_K"], block_m_for(M)
    split = cfg.get("SPLIT_K", 1)
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm), split)
    part, counts = split_parts(out.device, ("int split",), split, M, N, grid[0] * grid[1]) if split > 1 else (out, out)
    if split > 1 and iw.mode == MODE_INT8:
        part = part.view(torch.int32)  # int32 partial sums: exact, as the reference's
    _int_linear_kernel[grid](
        x, iw.w, *scale_args(iw), xs if xs is not None else iw.scale, out, part, counts,
        M, N, x.stride(0), iw.w.stride(0), iw.scale.stride(0),
        iw.in_scale.stride(0) if iw.in_scale is not None else 0, out.stride(0),
        K=K, K_PER=triton.cdiv(triton.cdiv(K, bk), split) * bk, MODE=iw.mode, SILU_X=silu_x, BLOCK_N=bn, BLOCK_M=bm,
        BLOCK_K=bk, SPLIT_K=split, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_options())
    return out
