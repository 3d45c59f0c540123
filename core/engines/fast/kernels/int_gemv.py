"""The integer linears' GEMV for the decode step at 1-8 rows: plain float32 FMAs on weights dequantized in registers
to the reference's bf16 values (the tile kernel's, int_tile.py), each weight dequantized once for all rows. The codes
are read as int32 words and turned into floats with integer bit operations (one LOP3 a code, `_code_floats`,
`_nibble_near_one`), no conversion instruction: INT4 16.2 instructions a weight at 8 rows in SASS
(docs/fast-engine.md#int-decode, bench.fast.int_gemv_compile)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.engines.fast.kernels.int_tile import int_finish
from core.engines.fast.int_weight import MODE_INT8, IntWeight, scale_args
from core.engines.fast.kernels.launch import launch_options, pdl_enter
from core.engines.fast.kernels.rounding import INTERPRETED, div_rn, load_x, to_bf16
from core.engines.fast.kernels.scratch import split_parts


@triton.jit
def _lop_or(c, MASK: tl.constexpr, FLOAT_BITS: tl.constexpr):
    """(c & MASK) | FLOAT_BITS, the masked code placed in a float's mantissa, in one LOP3: written as two operations
    with both constants immediate, the compiler spends two instructions (one immediate fits in a LOP3)."""
    if INTERPRETED:
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
    if INTERPRETED:
        return to_bf16(a), to_bf16(b)
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
        xa = tl.trans(load_x(x_ptr, offs_m, offs_k, M, K, stride_xm, SILU_X)).to(tl.float32)
        xb = tl.trans(load_x(x_ptr, offs_m, offs_k + 1, M, K, stride_xm, SILU_X)).to(tl.float32)
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
        w = div_rn(w, b[None, :], r[None, :])
    return w


@triton.jit
def _gemv_accumulate(acc, wa, wb, xa, xb, DECODE: tl.constexpr, BLOCK_M: tl.constexpr):
    """acc + wa * xa + wb * xb, the two weights rounded to the reference's bf16 first (one conversion each with
    DECODE 0, one for the pair otherwise); the rows' axis broadcast where there are several."""
    if DECODE == 0:
        ra = to_bf16(wa).to(tl.float32)
        rb = to_bf16(wb).to(tl.float32)
    else:
        ra, rb = _bf16_pair(wa, wb)
    if BLOCK_M == 1:
        acc += ra * xa
        acc += rb * xb
    else:
        acc += ra[:, None, :] * xa
        acc += rb[:, None, :] * xb
    return acc


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
            acc = _gemv_accumulate(acc, wa, wb, xa, xb, DECODE, BLOCK_M)
    if BLOCK_M == 1:
        res = tl.reshape(tl.sum(acc, axis=1), (BLOCK_N, 1))
    else:
        res = tl.sum(acc, axis=2)
    int_finish(res, ws_ptr, ws_ptr, out_ptr, part_ptr, count_ptr + pid_n, tl.program_id(1), offs_m, offs_n, M, N,
                stride_om, nmask[:, None] & (offs_m[None, :] < M), MODE, SPLIT_K)



GEMV_MAX_ROWS = 8  # past it each thread's accumulators (BLOCK_N x rows x words) crowd out the weights


def gemv_takes(iw: IntWeight, m: int) -> bool:
    """Whether `_int_gemv_kernel` takes m rows of this weight: weight-only, rows a whole number of int32 words."""
    return (m <= GEMV_MAX_ROWS and iw.mode != MODE_INT8 and iw.w.shape[1] % 4 == 0
            and iw.w.stride(0) % 4 == 0)


def gemv_linear(x: torch.Tensor, iw: IntWeight, out: torch.Tensor, silu_x: bool, cfg: dict) -> torch.Tensor:
    """A few rows through _int_gemv_kernel (cfg: BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages and
    DECODE, default 1)."""
    M, (N, K) = x.shape[0], (iw.n, iw.k)
    words = iw.w.view(torch.int32)
    bn, bk, split, bm = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg.get("SPLIT_K", 1), triton.next_power_of_2(M)
    grid = (triton.cdiv(N, bn), split)
    part, counts = split_parts(out.device, ("int split",), split, M, N, grid[0]) if split > 1 else (out, out)
    # EVEN: no masks at all, and the activations read as int32 pairs (4-byte aligned rows)
    even = (N % bn == 0 and K % (bk * split) == 0 and M == bm and x.data_ptr() % 4 == 0
            and (M == 1 or x.stride(0) % 2 == 0))
    _int_gemv_kernel[grid](
        x, words, *scale_args(iw), out, part, counts, M, N, x.stride(0), words.stride(0),
        iw.scale.stride(0), iw.in_scale.stride(0) if iw.in_scale is not None else 0, out.stride(0),
        K=K, K_PER=triton.cdiv(triton.cdiv(K, bk), split) * bk, MODE=iw.mode, SILU_X=silu_x, BLOCK_N=bn, BLOCK_M=bm,
        BLOCK_K=bk, SPLIT_K=split, EVEN=even, DECODE=cfg.get("DECODE", 1), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **launch_options())
    return out
