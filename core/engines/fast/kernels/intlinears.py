"""The integer linears of the fast engine: INT4 weight-only (g128 asymmetric, optionally AWQ-scaled) and INT8
(weight-only, and W8A8 on the INT8 tensor cores), for the decode step (1-64 rows) and, through `dequantize`, the
prompt pass. The torch engine (core/engines/torch/quant.py) is the reference; the numerics here are its own:

- weight-only: every weight is dequantized in registers to exactly the bf16 value `Int4Linear.dequantized(bf16)` /
  `Int8Linear.dequantized(bf16)` gives ((q - zero) * scale in float32, for AWQ divided by the float16 input scale,
  correctly rounded, then rounded to bf16), and multiplied with the bf16 activations on the tensor cores with float32
  accumulation, as the reference's bf16 GEMM does (only the order of the float32 additions differs);
- W8A8: the activations are quantized per token exactly as `int8_rows` does (row amax / 127, x / scale rounded half
  to even, clamped to +-127), the int8 x int8 products summed in int32 (exact: `torch._int_mm`'s result bit for bit)
  and scaled as the reference scales them ((acc * x_scale) * w_scale in float32, then bf16).

The kernels take the weight tile as the wide operand of `tl.dot` and the few activation rows as the narrow one
("swap AB", as linears.py), so each weight byte streams from HBM once per step. INT4 tiles are one group (128 inputs,
64 bytes a row) along K: the low nibbles multiply the even inputs and the high nibbles the odd ones (two dots), so the
codes are never interleaved in registers. With SPLIT_K > 1 several programs share an output tile (narrow outputs
would otherwise leave SMs idle); the tile's last program adds the slices in slice order (deterministic), as
linears.py does.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from core.engines.fast.kernels.launch import launch_options, pdl_enter
from core.engines.fast.kernels.linears import _EAGER_SCRATCH, _SPLIT_SCRATCH, block_m_for

MODE_INT4, MODE_INT4_AWQ, MODE_INT8_WO, MODE_INT8 = 3, 4, 5, 6
INT_MODES = {"int4": MODE_INT4, "int4-awq": MODE_INT4_AWQ, "int8-wo": MODE_INT8_WO, "int8": MODE_INT8}
GROUP = 128  # core.engines.torch.quant.GROUP: one INT4 tile along K
ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: (v + M) - M rounds |v| < 2^22 to the nearest integer, ties to even


# Triton's CPU interpreter truncates float32 -> bf16 casts (its "rtne" rounds ties up): there the kernels round
# with integer operations instead, so the CPU tests check the GPU's numerics bit for bit.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _bf16(x):
    """float32 -> bf16, round to nearest even (finite values). Interpreted: the rounded value as a float32 (the
    interpreter's bf16 tensors do not enter its dots as numbers), which stores to bf16 exactly."""
    if _INTERPRETED:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _mma(w, x, acc):
    """acc += w @ x: bf16 operands on the tensor cores (float32 accumulation); interpreted, in float32."""
    if _INTERPRETED:
        return tl.dot(w.to(tl.float32), x.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(w, x, acc)


@triton.jit
def _load_x(x_ptr, offs_m, offs_k, M, K, stride_xm, SILU_X: tl.constexpr):
    """linears._load_x for bf16 activations (the tile [BLOCK_K, BLOCK_M]), its roundings through `_bf16`."""
    mask = (offs_m[None, :] < M) & (offs_k[:, None] < K)
    ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
    if SILU_X:
        # x is the [M, 2K] gate/up output; SiLU(gate) * up rounded as the reference (HF's bf16 ops) rounds it
        g = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        x = _bf16(_bf16(g / (1.0 + tl.exp(-g))).to(tl.float32) * u)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x


@triton.jit
def _div_rn(a, b, r):
    """a / b correctly rounded, given r = 1 / b correctly rounded: one Markstein correction of a * r (exact for
    normal operands; `/` in Triton is an approximate division, and div_rn's full sequence costs ~10 operations a
    weight). Checked against torch's division bit for bit in tests/gpu/test_int_kernels_gpu.py. Interpreted: the
    interpreter's fma rounds twice, so its true division stands in."""
    if _INTERPRETED:
        return tl.math.div_rn(a, b + 0.0 * r)
    else:
        q = a * r
        rem = tl.fma(-q, b, a)
        return tl.fma(rem, r, q)


@triton.jit
def _int4_half(p, s, z, isc_ptr, irc_ptr, offs_k, K, AWQ: tl.constexpr):
    """bf16 weights [BLOCK_N, 64] from the 4-bit codes p (uint8, one nibble already selected), per-row group scale s
    and zero point z (float32): Int4Linear.dequantized's arithmetic."""
    # a conversion per code: ORing unpacked codes into 2^23's mantissa was slower (docs/fast-engine.md#int-decode)
    w = (p.to(tl.float32) - z[:, None]) * s[:, None]  # exact: a 5-bit integer times an 11-bit float16 scale
    if AWQ:
        b = tl.load(isc_ptr + offs_k, mask=offs_k < K, other=1.0)  # a slice's tiles past K: codes 0, x 0
        r = tl.load(irc_ptr + offs_k, mask=offs_k < K, other=1.0)
        w = _div_rn(w, b[None, :], r[None, :])
    return _bf16(w)


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
            x_even = _load_x(x_ptr, offs_m, k_even, M, K, stride_xm, SILU_X)
            x_odd = _load_x(x_ptr, offs_m, k_even + 1, M, K, stride_xm, SILU_X)
            acc = _mma(w_lo, x_even, acc)
            acc = _mma(w_hi, x_odd, acc)
    else:
        offs_k = tl.arange(0, BLOCK_K)
        if MODE == 5:
            ws = tl.load(ws_ptr + offs_n, mask=nmask, other=0.0)
        for kk in range(0, K_PER, BLOCK_K):
            k = k_lo + kk + offs_k
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :], mask=nmask[:, None] & (k[None, :] < K),
                        other=0)
            if MODE == 5:
                wb = _bf16(w.to(tl.float32) * ws[:, None])  # Int8Linear.dequantized(bf16)
                acc = _mma(wb, _load_x(x_ptr, offs_m, k, M, K, stride_xm, SILU_X), acc)
            else:
                xq = tl.load(x_ptr + offs_m[None, :] * stride_xm + k[:, None],
                             mask=(offs_m[None, :] < M) & (k[:, None] < K), other=0)
                acc = tl.dot(w, xq, acc, out_dtype=tl.int32)
    mask = (offs_m[None, :] < M) & nmask[:, None]
    _int_finish(acc, ws_ptr, xs_ptr, out_ptr, part_ptr, count_ptr + pid_m * tl.num_programs(0) + pid_n,
                tl.program_id(2), offs_m, offs_n, M, N, stride_om, mask, MODE, SPLIT_K)


@triton.jit
def _int_finish(acc, ws_ptr, xs_ptr, out_ptr, part_ptr, counter, slice_id, offs_m, offs_n, M, N, stride_om, mask,
                MODE: tl.constexpr, SPLIT_K: tl.constexpr):
    """Store a tile's result; with SPLIT_K > 1 store this K slice's partial sums, and the tile's last program adds
    the slices in slice order (deterministic) and stores the result."""
    if SPLIT_K == 1:
        _int_store(acc, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE)
    else:
        part = part_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.store(part + slice_id * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's slice is written before the counter says so (release below)
        if tl.atomic_add(counter, 1, sem="acq_rel") == SPLIT_K - 1:
            total = tl.zeros_like(acc)
            for sl in range(SPLIT_K):
                total += tl.load(part + sl * M * N, mask=mask, other=0, cache_modifier=".cg")  # from L2, not L1
            tl.atomic_xchg(counter, 0)
            _int_store(total, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE)


@triton.jit
def _lop_or(c, MASK: tl.constexpr, FLOAT_BITS: tl.constexpr):
    """(c & MASK) | FLOAT_BITS, the masked code placed in a float's mantissa, in one LOP3: written as two operations
    with both constants immediate, the compiler spends two instructions (one immediate fits in a LOP3)."""
    if _INTERPRETED:
        return (c & MASK) | FLOAT_BITS
    else:
        return tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0xEA;", "=r,r,r,r",  # 0xEA: (a & b) | c
                                         [c, tl.full(c.shape, MASK, tl.int32), tl.full(c.shape, FLOAT_BITS, tl.int32)],
                                         dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _code_floats(wd, j: tl.constexpr, BITS: tl.constexpr, SHIFT: tl.constexpr):
    """2^23 + c * 2^(BITS * e) as float32 for code j of each int32 word (codes of BITS bits, the first in the low
    bits; INT8 codes already offset to unsigned): the code is masked in place and ORed into the mantissa of 2^23,
    one LOP3 a weight. Codes reaching bit 23 are read from the word shifted right by SHIFT, so e = j, or j - SHIFT /
    BITS for those."""
    if (j + 1) * BITS <= 23:
        c = _lop_or(wd, ((1 << BITS) - 1) << (BITS * j), 0x4B000000)
    else:
        c = _lop_or(wd >> SHIFT, ((1 << BITS) - 1) << (BITS * j - SHIFT), 0x4B000000)
    return c.to(tl.float32, bitcast=True)


@triton.jit
def _nibble_near_one(wd, j: tl.constexpr):
    """1 + q * 2^(B - 23) as float32 for nibble j of each int32 word: the nibble moved to bits B..B+3 (B = 16 for
    nibbles 2, 4 and 6, else 12; four shifts a word, shared by two nibbles each) and ORed into the mantissa of 1.0.
    With B >= 12 such a float has at most 12 significant bits, so its product with a float16 scale (11 bits) is exact
    and one FMA dequantizes it (`_gemv_weight`)."""
    if j == 0:
        c = _lop_or(wd << 12, 0xF000, 0x3F800000)
    elif j == 1:
        c = _lop_or(wd << 8, 0xF000, 0x3F800000)
    elif j == 2:
        c = _lop_or(wd << 8, 0xF0000, 0x3F800000)
    elif j == 3:
        c = _lop_or(wd, 0xF000, 0x3F800000)
    elif j == 4:
        c = _lop_or(wd, 0xF0000, 0x3F800000)
    elif j == 5:
        c = _lop_or(wd >> 8, 0xF000, 0x3F800000)
    elif j == 6:
        c = _lop_or(wd >> 8, 0xF0000, 0x3F800000)
    else:
        c = _lop_or(wd >> 16, 0xF000, 0x3F800000)
    return c.to(tl.float32, bitcast=True)


@triton.jit
def _bf16_pair(a, b):
    """a and b rounded to bf16 (nearest even) and back to float32: one cvt.rn.bf16x2.f32 for the two, the halves
    moved back with an AND and a shift (two single conversions and their widenings cost four operations)."""
    if _INTERPRETED:
        return _bf16(a), _bf16(b)
    else:
        ra, rb = tl.inline_asm_elementwise(
            "{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $2, $3; and.b32 $0, t, 0xffff0000; shl.b32 $1, t, 16; }",
            "=r,=r,r,r", [a.to(tl.int32, bitcast=True), b.to(tl.int32, bitcast=True)],
            dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
        return ra.to(tl.float32, bitcast=True), rb.to(tl.float32, bitcast=True)


@triton.jit
def _gemv_x_pair(x_ptr, offs_m, M, stride_xm, k0, offs_w, j: tl.constexpr, K, SILU_X: tl.constexpr,
                 EVEN: tl.constexpr, CODES: tl.constexpr, BLOCK_M: tl.constexpr):
    """The activations of codes j and j + 1 of each word, as float32 [1, WORDS] each for one row, [1, BLOCK_M, WORDS]
    for several. Plain bf16 rows without masks are read as one int32 a pair (inputs k and k + 1 side by side) and
    widened by a shift and an AND: half the loads and no conversion. One row keeps its own 2-D shapes: the 3-D ones
    cost it a trip through shared memory a step (SASS, bench.fast.int_gemv_compile)."""
    offs_k = k0 + CODES * offs_w + j
    if EVEN and not SILU_X:
        x32 = x_ptr.to(tl.pointer_type(tl.int32))
        if BLOCK_M == 1:
            xp = tl.load(x32 + offs_k // 2)[None, :]
        else:
            xp = tl.load(x32 + offs_m[:, None] * (stride_xm // 2) + (offs_k // 2)[None, :])[None, :, :]
        xa = (xp << 16).to(tl.float32, bitcast=True)
        xb = (xp & -0x10000).to(tl.float32, bitcast=True)  # 0xFFFF0000 as an int32
    else:
        xa = tl.trans(_load_x(x_ptr, offs_m, offs_k, M, K, stride_xm, SILU_X)).to(tl.float32)
        xb = tl.trans(_load_x(x_ptr, offs_m, offs_k + 1, M, K, stride_xm, SILU_X)).to(tl.float32)
        if BLOCK_M > 1:
            xa = xa[None, :, :]
            xb = xb[None, :, :]
    return xa, xb


@triton.jit
def _gemv_weight(wd, j: tl.constexpr, s, z, s12, c12, s16, c16, ws, isc, irc, k0, offs_w, K, MODE: tl.constexpr,
                 DECODE: tl.constexpr, CODES: tl.constexpr, BITS: tl.constexpr, SHIFT: tl.constexpr):
    """Code j of each word dequantized to the float32 weight the reference rounds to bf16, (q - z) * s exactly.
    DECODE 1 (INT4): fma(1 + q * 2^(B-23), s * 2^(23-B), -(2^(23-B) + z) * s), one FMA, its product exact
    (`_nibble_near_one`); else the code from `_code_floats` less (2^23 + zero), times the scale."""
    P: tl.constexpr = 1 << (BITS * (j - ((j + 1) * BITS > 23) * (SHIFT // BITS)))  # _code_floats's code j times P
    if MODE == 5:
        w = (_code_floats(wd, j, BITS, SHIFT) - (8388608.0 + 128.0 * P)) * (ws * (1.0 / P))[:, None]
    elif DECODE == 1:
        f = _nibble_near_one(wd, j)
        if j % 2 == 0 and j > 0:
            w = tl.fma(f, s16[:, None], c16[:, None])
        else:
            w = tl.fma(f, s12[:, None], c12[:, None])
    else:
        w = (_code_floats(wd, j, BITS, SHIFT) - (8388608.0 + z * P)[:, None]) * (s * (1.0 / P))[:, None]
    if MODE == 4:
        offs_k = k0 + CODES * offs_w + j
        b = tl.load(isc + offs_k, mask=offs_k < K, other=1.0)
        r = tl.load(irc + offs_k, mask=offs_k < K, other=1.0)
        w = _div_rn(w, b[None, :], r[None, :])
    return w


# N is not specialized so that every projection of one width shares a compiled kernel
@triton.jit(do_not_specialize=["N"])
def _int_gemv_kernel(x_ptr, w_ptr, ws_ptr, wz_ptr, isc_ptr, irc_ptr, seg_ptr, out_ptr, part_ptr, count_ptr,
                     M, N, stride_xm, stride_wn, stride_sn, stride_isc, stride_om,
                     K: tl.constexpr, K_PER: tl.constexpr, MODE: tl.constexpr, SILU_X: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                     EVEN: tl.constexpr, DECODE: tl.constexpr, PDL: tl.constexpr):
    """A few activation rows (the decode step at batch 1-8): out[m, n] = sum_k w[n, k] * x[m, k] with plain float32
    FMAs on the weights dequantized in registers to the reference's bf16 values (as _int_linear_kernel's), each weight
    dequantized once for all BLOCK_M rows, reduced over k at the end. The codes are read as int32 words (w_ptr: the storage viewed as int32) and never unpacked into bytes;
    `_gemv_weight` makes each code a float with integer bit operations, no conversion instruction.
    INT4: word i of a row holds inputs 8i..8i+7 (input 2j in a byte's low nibble), BLOCK_K = one group;
    INT8 weight-only: word i holds inputs 4i..4i+3. EVEN: the tiles cover N and every slice's K exactly (no masks).
    DECODE (A/B on the GPU): 0 codes through 2^23 and one bf16 conversion a weight; 1 INT4 codes through one FMA and
    bf16 conversions in pairs; 2 codes through 2^23, conversions in pairs."""
    if PDL:
        pdl_enter()
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    k_lo = 0
    if SPLIT_K > 1:
        k_lo = tl.program_id(1) * K_PER
    BITS: tl.constexpr = 8 if MODE == 5 else 4
    CODES: tl.constexpr = 32 // BITS
    SHIFT: tl.constexpr = 12 if BITS == 4 else 16  # INT4 codes 5-7, INT8 codes 2-3 are read from the word >> SHIFT
    WORDS: tl.constexpr = BLOCK_K // CODES
    offs_w = tl.arange(0, WORDS)
    offs_m = tl.arange(0, BLOCK_M)
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, WORDS], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_M, WORDS], dtype=tl.float32)
    isc = isc_ptr
    irc = irc_ptr
    if MODE == 4:
        seg = tl.load(seg_ptr + pid_n * BLOCK_N)  # the tile's rows share one projection's input scales
        isc = isc_ptr + seg * stride_isc
        irc = irc_ptr + seg * stride_isc
    ws = tl.zeros([BLOCK_N], dtype=tl.float32)
    s = ws
    z = ws
    s12 = ws
    c12 = ws
    s16 = ws
    c16 = ws
    if MODE == 5:
        ws = tl.load(ws_ptr + offs_n, mask=nmask, other=0.0)
    for kk in range(0, K_PER, BLOCK_K):
        k0 = k_lo + kk
        live = k0 < K  # the last slice may end past K
        w_ptrs = w_ptr + offs_n[:, None] * stride_wn + k0 // CODES + offs_w[None, :]
        if EVEN:
            wd = tl.load(w_ptrs)
        else:
            wd = tl.load(w_ptrs, mask=nmask[:, None] & (k0 + CODES * offs_w[None, :] < K), other=0)
        if MODE == 5:
            wd = wd ^ -0x7F7F7F80  # 0x80808080 as an int32: each int8 code + 128, unsigned
        else:
            t = k0 // BLOCK_K  # INT4 tiles are one group
            s = tl.load(ws_ptr + offs_n * stride_sn + t, mask=nmask & live, other=0.0).to(tl.float32)
            z = tl.load(wz_ptr + offs_n * stride_sn + t, mask=nmask & live, other=0).to(tl.float32)
            if DECODE == 1:
                s12 = s * 2048.0
                c12 = (-2048.0 - z) * s  # exact: 12 bits times 11
                s16 = s * 128.0
                c16 = (-128.0 - z) * s
        for jp in tl.static_range(CODES // 2):
            xa, xb = _gemv_x_pair(x_ptr, offs_m, M, stride_xm, k0, offs_w, 2 * jp, K, SILU_X, EVEN, CODES, BLOCK_M)
            wa = _gemv_weight(wd, 2 * jp, s, z, s12, c12, s16, c16, ws, isc, irc, k0, offs_w, K, MODE, DECODE, CODES,
                              BITS, SHIFT)
            wb = _gemv_weight(wd, 2 * jp + 1, s, z, s12, c12, s16, c16, ws, isc, irc, k0, offs_w, K, MODE, DECODE,
                              CODES, BITS, SHIFT)
            if DECODE == 0:
                ra = _bf16(wa).to(tl.float32)
                rb = _bf16(wb).to(tl.float32)
            else:
                ra, rb = _bf16_pair(wa, wb)
            if BLOCK_M == 1:
                acc += ra * xa
                acc += rb * xb
            else:
                acc += ra[:, None, :] * xa
                acc += rb[:, None, :] * xb
    if BLOCK_M == 1:
        res = tl.reshape(tl.sum(acc, axis=1), (BLOCK_N, 1))
    else:
        res = tl.sum(acc, axis=2)
    _int_finish(res, ws_ptr, ws_ptr, out_ptr, part_ptr, count_ptr + pid_n, tl.program_id(1), offs_m, offs_n, M, N,
                stride_om, nmask[:, None] & (offs_m[None, :] < M), MODE, SPLIT_K)


@triton.jit
def _int_store(acc, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE: tl.constexpr):
    if MODE == 6:
        # Int8Linear.forward: (acc * x_scale) * w_scale in float32, then bf16
        out = acc.to(tl.float32) * tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)[None, :]
        out = out * tl.load(ws_ptr + offs_n, mask=offs_n < N, other=0.0)[:, None]
    else:
        out = acc
    tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], _bf16(out),
             mask=mask)


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
        x = _load_x(x_ptr + row * stride_xm, zero, k0 + offs, 1, K, 0, SILU_X)  # [BLOCK, 1]
        amax = tl.maximum(amax, tl.abs(tl.reshape(x.to(tl.float32), (BLOCK,))))
    amax = tl.maximum(tl.max(amax, axis=0), 1e-12)
    scale = tl.math.div_rn(amax, 127.0)
    inv = tl.math.div_rn(1.0, scale)
    for k0 in range(0, K, BLOCK):
        x = tl.reshape(_load_x(x_ptr + row * stride_xm, zero, k0 + offs, 1, K, 0, SILU_X).to(tl.float32), (BLOCK,))
        v = _div_rn(x, scale, inv)
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
        tl.store(out_ptr + offs_n[:, None] * K + k[None, :], _bf16(w.to(tl.float32) * ws[:, None]),
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
                w = _div_rn(w, tl.load(isc + k_even[None, :] + j), tl.load(irc + k_even[None, :] + j))
            k = k_even + j
            tl.store(out_ptr + offs_n[:, None] * K + k[None, :], _bf16(w),
                     mask=nmask[:, None] & (k[None, :] < K))


@triton.jit
def _int8_epilogue_kernel(acc_ptr, xs_ptr, ws_ptr, out_ptr, N, BLOCK: tl.constexpr):
    """The prompt pass's W8A8 scaling in one pass over torch._int_mm's int32 result: (acc * x_scale) * w_scale."""
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    acc = tl.load(acc_ptr + row * N + offs, mask=m, other=0).to(tl.float32)
    out = acc * tl.load(xs_ptr + row) * tl.load(ws_ptr + offs, mask=m, other=0.0)
    tl.store(out_ptr + row * N + offs, _bf16(out), mask=m)


# ---- launchers ----------------------------------------------------------------------------------------------------

class IntWeight:
    """One fused projection's integer storage, in the reference's layout (core/engines/torch/quant.py).

    INT4: `w` packed codes uint8 [N, Kp / 2] (input 2j in the low nibble, 2j + 1 in the high one), `scale` float16
    [N, groups], `zero` uint8 [N, groups]; AWQ adds `in_scale` float32 [segments, Kp] (each projection's float16
    input scale, the divisor), `in_recip` (its correctly rounded reciprocal) and `row_seg` int32 [N] (which
    projection a row belongs to). INT8: `w` int8 [N, K], `scale` float32 [N]."""

    def __init__(self, mode: int, n: int, k: int, w, scale, zero=None, in_scale=None, in_recip=None, row_seg=None):
        self.mode, self.n, self.k = mode, n, k
        self.w, self.scale, self.zero = w, scale, zero
        self.in_scale, self.in_recip, self.row_seg = in_scale, in_recip, row_seg
        # the widest output tile that never straddles two projections' AWQ scales
        self.max_block_n = _largest_pow2_dividing(_segment_sizes(row_seg)) if row_seg is not None else 256

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.w, self.scale, self.zero, self.in_scale, self.in_recip, self.row_seg)
                if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def _segment_sizes(row_seg: torch.Tensor) -> list[int]:
    _, counts = torch.unique_consecutive(row_seg.cpu(), return_counts=True)
    return [int(c) for c in counts]


def _largest_pow2_dividing(sizes: list[int]) -> int:
    b = 256
    while b > 1 and any(s % b for s in sizes):
        b //= 2
    return b


def quantize(weight: torch.Tensor, mode: str, awq_scales: list[torch.Tensor] | None = None,
             awq_rows: list[int] | None = None) -> IntWeight:
    """A fused bf16 weight [N, K] quantized as the torch engine quantizes each of its projections: every scale is per
    output row (INT8) or per row and group (INT4), so the fused matrix gets exactly the per-projection codes. AWQ:
    `awq_scales[i]` (float32 [K], the searched s) applies to the next `awq_rows[i]` rows, as Int4Linear(linear, s)."""
    from core.engines.torch import quant

    n, k = weight.shape
    if mode in ("int8", "int8-wo"):
        q, s = quant.int8_rows(weight)
        return IntWeight(INT_MODES[mode], n, k, q.contiguous(), s.reshape(-1).contiguous())
    if mode == "int4":
        packed, scale, zero = quant.quantize_int4(weight.float())
        return IntWeight(MODE_INT4, n, k, packed, scale.contiguous(), zero.contiguous())
    if mode != "int4-awq":
        raise ValueError(f"Unknown integer mode {mode!r}")
    assert awq_scales is not None and awq_rows is not None and sum(awq_rows) == n
    parts, divisors = [], []
    start = 0
    for s, rows in zip(awq_scales, awq_rows):
        s = s.float().to(weight.device)
        parts.append(quant.quantize_int4(weight[start:start + rows].float() * s[None, :]))
        divisors.append(s.half().float())  # Int4Linear stores input_scale in float16 and divides by that
        start += rows
    packed = torch.cat([p[0] for p in parts])
    scale = torch.cat([p[1] for p in parts]).contiguous()
    zero = torch.cat([p[2] for p in parts]).contiguous()
    kp = packed.shape[1] * 2
    isc = torch.ones(len(divisors), kp, dtype=torch.float32, device=weight.device)
    isc[:, :k] = torch.stack(divisors)
    irc = (1.0 / isc.double()).float()  # correctly rounded reciprocals
    row_seg = torch.repeat_interleave(torch.arange(len(awq_rows), dtype=torch.int32),
                                      torch.tensor(awq_rows)).to(weight.device)
    return IntWeight(MODE_INT4_AWQ, n, k, packed, scale, zero, isc.contiguous(), irc.contiguous(), row_seg)


def reference_dequantized(iw: IntWeight, dtype=torch.bfloat16) -> torch.Tensor:
    """The torch engine's own dequantization of this storage (quant.py's ops): what the kernels must reproduce."""
    from core.engines.torch import quant

    if iw.mode in (MODE_INT8, MODE_INT8_WO):
        return (iw.w.float() * iw.scale[:, None]).to(dtype)
    w = quant.dequantize_int4(iw.w, iw.scale, iw.zero, iw.k)
    if iw.mode == MODE_INT4_AWQ:
        w = w / iw.in_scale[iw.row_seg.long(), :iw.k]
    return w.to(dtype)


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


def kernel_label(mode: str) -> str:
    """What the integer linears of `mode` run, for the engine's `ran` line."""
    if mode == "int8":
        return ("INT8 W8A8 linears in Triton (activations quantized per token, int8 tensor-core dots with int32 "
                "accumulation; prompt GEMMs through torch._int_mm)")
    what = {"int4": "INT4 g128", "int4-awq": "INT4 g128 AWQ", "int8-wo": "INT8 weight-only"}[mode]
    gemv_rows = {m for (mo, m, _, _), cfg in INT_TUNED.items()
                 if mo == INT_MODES[mode] and cfg.get("kernel") == "gemv"}
    where = "" if not gemv_rows else (" or, at one row" if gemv_rows == {1} else " or, at 1-8 rows") + \
        ", float32-FMA GEMVs where the tuning table picks them"
    return (f"{what} linears in Triton (weights dequantized in registers into bf16 tensor-core dots{where}; prompt "
            "GEMMs on weights dequantized once, through cuBLAS)")


# Launch configurations keyed by (mode, m_key, N, K): bench/fast/int_speed.py fills them on the GPU; the shipped
# H200 table (tuned_int_h200.json) is loaded on Hopper; else `int_default_config`.
INT_TUNED: dict[tuple[int, int, int, int], dict] = {}


def int_m_key(m: int) -> int:
    """Tuning bucket of a batch size: one row on its own, then by the tile kernel's BLOCK_M (2-16 rows share one:
    the GEMV takes up to GEMV_MAX_ROWS of them, more fall back to the tile kernel)."""
    return 1 if m == 1 else block_m_for(m)


def int_default_config(mode: int, m: int, n: int, k: int) -> dict:
    bk = GROUP if mode in (MODE_INT4, MODE_INT4_AWQ) else 256 if mode == MODE_INT8_WO else 256
    bn = 64 if block_m_for(m) >= 64 else 32
    split = 1
    # narrow outputs: fewer than ~2 programs an SM leave HBM idle; cut K instead
    while triton.cdiv(n, bn) * split < 264 and triton.cdiv(triton.cdiv(k, bk), split * 2) >= 4 and split < 8:
        split *= 2
    return dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=4, num_stages=4)


def int_config_for(mode: int, m: int, n: int, k: int) -> dict:
    return INT_TUNED.get((mode, int_m_key(m), n, k)) or int_default_config(mode, m, n, k)


def int_linear(x: torch.Tensor, iw: IntWeight, out: torch.Tensor, silu_x: bool = False, cfg: dict | None = None,
               xq: torch.Tensor | None = None, xs: torch.Tensor | None = None) -> torch.Tensor:
    """out[M, N] = x[M, K] @ W^T for the integer weight `iw`. W8A8: x is quantized per token first (into xq, xs when
    given: a graph's own buffers; else scratch made before capture); with silu_x x is [M, 2K] gate|up and the input
    is SiLU(gate) * up."""
    M = x.shape[0]
    N, K = iw.n, iw.k
    cfg = dict(cfg or int_config_for(iw.mode, M, N, K))
    if iw.mode == MODE_INT8:
        if xq is None:
            xq, xs = _quant_scratch(x.device, M, K)
        int8_rows(x, xq, xs, silu_x)
        x, silu_x = xq, False
    if iw.mode in (MODE_INT4, MODE_INT4_AWQ):
        cfg["BLOCK_K"] = GROUP
        cfg["BLOCK_N"] = min(cfg["BLOCK_N"], iw.max_block_n)
    if cfg.get("kernel") == "gemv" and gemv_takes(iw, M):
        return _int_gemv(x, iw, out, silu_x, cfg)
    bn, bk, bm = cfg["BLOCK_N"], cfg["BLOCK_K"], block_m_for(M)
    split = cfg.get("SPLIT_K", 1)
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm), split)
    part, counts = _split_parts(out.device, split, M, N, grid[0] * grid[1]) if split > 1 else (out, out)
    if split > 1 and iw.mode == MODE_INT8:
        part = part.view(torch.int32)  # int32 partial sums: exact, as the reference's
    _int_linear_kernel[grid](
        x, iw.w, *_scale_args(iw), xs if xs is not None else iw.scale, out, part, counts,
        M, N, x.stride(0), iw.w.stride(0), iw.scale.stride(0),
        iw.in_scale.stride(0) if iw.in_scale is not None else 0, out.stride(0),
        K=K, K_PER=triton.cdiv(triton.cdiv(K, bk), split) * bk, MODE=iw.mode, SILU_X=silu_x, BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=bk, SPLIT_K=split,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_options())
    return out


def _scale_args(iw: IntWeight) -> tuple:
    """The weight's scale, zero point, AWQ input scales and their reciprocals, and row segments, as both kernels take
    them: a mode without one gets the scale in its place (never read)."""
    return tuple(t if t is not None else iw.scale for t in (iw.scale, iw.zero, iw.in_scale, iw.in_recip, iw.row_seg))


GEMV_MAX_ROWS = 8  # past it each thread's accumulators (BLOCK_N x rows x words) crowd out the weights


def gemv_takes(iw: IntWeight, m: int) -> bool:
    """Whether `_int_gemv_kernel` takes m rows of this weight: weight-only, rows a whole number of int32 words."""
    return (m <= GEMV_MAX_ROWS and iw.mode != MODE_INT8 and iw.w.shape[1] % 4 == 0
            and iw.w.stride(0) % 4 == 0)


def _int_gemv(x: torch.Tensor, iw: IntWeight, out: torch.Tensor, silu_x: bool, cfg: dict) -> torch.Tensor:
    """int_linear for a few rows through _int_gemv_kernel (cfg: BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages and
    DECODE, default 1)."""
    M, (N, K) = x.shape[0], (iw.n, iw.k)
    words = iw.w.view(torch.int32)
    bn, bk, split, bm = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg.get("SPLIT_K", 1), triton.next_power_of_2(M)
    grid = (triton.cdiv(N, bn), split)
    part, counts = _split_parts(out.device, split, M, N, grid[0]) if split > 1 else (out, out)
    # EVEN: no masks at all, and the activations read as int32 pairs (4-byte aligned rows)
    even = (N % bn == 0 and K % (bk * split) == 0 and M == bm and x.data_ptr() % 4 == 0
            and (M == 1 or x.stride(0) % 2 == 0))
    _int_gemv_kernel[grid](
        x, words, *_scale_args(iw), out, part, counts, M, N, x.stride(0), words.stride(0),
        iw.scale.stride(0), iw.in_scale.stride(0) if iw.in_scale is not None else 0, out.stride(0),
        K=K, K_PER=triton.cdiv(triton.cdiv(K, bk), split) * bk, MODE=iw.mode, SILU_X=silu_x, BLOCK_N=bn, BLOCK_M=bm,
        BLOCK_K=bk, SPLIT_K=split, EVEN=even, DECODE=cfg.get("DECODE", 1), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **launch_options())
    return out


def _scratch(device, key: tuple, make):
    """A launch's scratch, kept in the split-K scratch table (linears.split_scratch_scope: a graph's own inside a
    DecodeGraph, so two graphs never share it); made on the warm-up run, never inside a capture."""
    table = _SPLIT_SCRATCH.get()
    table = _EAGER_SCRATCH if table is None else table
    key = (device, *key)
    if key not in table:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("integer-linear scratch must be made before graph capture: run the step once first")
        table[key] = make()
    return table[key]


def _split_parts(device, split: int, m: int, n: int, tiles: int):
    """Split-K's partial sums [split, m, n] (float32, or int32 for W8A8) and one counter per output tile (zero
    between calls: the last program of a tile resets it)."""
    return _scratch(device, ("int split", split, m, n, tiles), lambda: (
        torch.empty(split, m, n, dtype=torch.float32, device=device),
        torch.zeros(tiles, dtype=torch.int32, device=device)))


def _quant_scratch(device, m: int, k: int):
    """W8A8's int8 activations [m, k] and their float32 scales [m]."""
    return _scratch(device, ("int8 rows", m, k), lambda: (torch.empty(m, k, dtype=torch.int8, device=device),
                                                           torch.empty(m, dtype=torch.float32, device=device)))


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


def reference_linear(x: torch.Tensor, iw: IntWeight) -> torch.Tensor:
    """The torch engine's forward for this storage (Int4Linear / Int8Linear.forward on CUDA), for tests and the
    prompt pass of W8A8."""
    from core.engines.torch import quant

    if iw.mode != MODE_INT8:
        return torch.nn.functional.linear(x, reference_dequantized(iw, x.dtype))
    shape = x.shape
    xq, xs = quant.int8_rows(x.reshape(-1, shape[-1]))
    acc, _ = quant.int_mm(xq, iw.w.t())
    out = (acc.float() * xs * iw.scale[None, :]).to(x.dtype)
    return out.reshape(*shape[:-1], iw.n)
