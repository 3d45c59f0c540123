"""Triton kernels for one decode step of a Llama-family model on CUDA.

Each kernel reproduces, rounding for rounding where it matters, what the eager reference does (HF LlamaRMSNorm, the
FP8Linear of core/fp8.py, quantize_rows for FP8 KV), so the fast path computes the same function as the eager path
at the same precision. What is fused, and why:

- `add_rmsnorm`: residual add + RMSNorm (+ for W8A8 the per-token E4M3 quantization of its output): one pass.
- `linear`: a skinny GEMM in "swap AB" form (W tile is the wide operand of tl.dot, the few activation rows the
  narrow one), so weights stream from HBM once with the loads software-pipelined; bf16, FP8 weight-only (E4M3
  and the bf16 activations converted to f16 in registers, f16 dot) and FP8 W8A8 (E4M3 activations from the
  producing kernel, fp8 x fp8 dot).
  An optional SiLU(gate) * up prologue lets the down projection read the gate/up output directly (used at batch 1;
  with several rows the computed dot operand stalled the tensor-core pipeline, ~3x slower on the H200).
  With SPLIT_K (several rows, narrow outputs) K is cut into slices whose float32 sums the tile's last program adds
  in slice order.
- `gemv`: the same for one activation row without tensor cores (plain FMA reduction), kept if it measures faster.
- `gemv_prologue`: one row with the whole of K in one tile and the kernel before it folded in (add + RMSNorm, W8A8's
  activation quantization): the batch-1 step's q|k|v, o, gate|up and lm_head; for gate|up optionally silu_mul
  folded in behind too (gate and up rows taken in pairs, SiLU(gate) * up written).
- `rope_store`: RoPE on q and k, and the K/V write into the static cache (quantized per token and head for FP8 KV);
  `rope_store_prompt` runs the same kernel over a prompt's tokens in the prompt pass.
- `decode_attention`: split-KV ("flash-decoding") attention that reads only the valid length of the static cache,
  bf16 or E4M3 K/V with their scales, then a combine kernel over the splits; launched per K/V dtype
  (`AttnWorkspace.CONFIG`). Over an E4M3 cache the split runs as attn_e4m3.py's CUDA C++ kernel where it can.

Importing this module needs triton; core/engines/fast/model.py imports it only on CUDA.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings

import torch
import triton
import triton.language as tl

from core.engines.fast import attn_e4m3
from core.engines.fast.options import options
from core.engines.fast.tuned_table import read_tuned_table

try:  # grid dependency control (programmatic dependent launch), Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAVE_GDC = True
except ImportError:
    HAVE_GDC = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

E4M3_MAX = 448.0
MODE_BF16, MODE_WO, MODE_W8A8 = 0, 1, 2
MODES = {"bf16": MODE_BF16, "fp8-wo": MODE_WO, "fp8": MODE_W8A8}


@functools.lru_cache(maxsize=None)
def _hopper_or_later(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def pdl_available() -> bool:
    """Programmatic dependent launch: a kernel is scheduled while the one before it drains, instead of after it ends,
    and waits (griddepcontrol.wait, `_pdl_enter`) before it touches memory. Hopper and later; TRIAGE_PDL=0 turns
    it off."""
    return HAVE_GDC and options().pdl and _hopper_or_later(torch.cuda.current_device())


_PDL_SCOPE = contextvars.ContextVar("pdl_scope", default=False)


@contextlib.contextmanager
def pdl_scope(on: bool):
    """Launches inside use programmatic dependent launch where available. Decode graphs of one row turn it on:
    on the H200 (2026-12-01, bench/fp8_speed.py) it took a batch-1 step from 4.53 to 4.40 ms (BF16) and 3.03 to
    2.80 ms (FP8 W8A8), but made batch 8 slower for BF16 (4.78 -> 5.08 ms) and weight-only FP8 (5.74 -> 6.73)."""
    token = _PDL_SCOPE.set(on)
    try:
        yield
    finally:
        _PDL_SCOPE.reset(token)


def _launch(allowed: bool = True) -> dict:
    """Launch options every kernel here takes: PDL (the constexpr that compiles `_pdl_enter` in) and launch_pdl."""
    on = allowed and _PDL_SCOPE.get() and pdl_available()
    return dict(PDL=True, launch_pdl=True) if on else dict(PDL=False)


@triton.jit
def _pdl_enter():
    """First thing in every kernel: wait until the kernel before has finished and its writes are visible (nothing
    is read or written before that), then let the next kernel be scheduled."""
    gdc_wait()
    gdc_launch_dependents()


# --------------------------------------------------------------------------------------------- norm, activation
@triton.jit
def _add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, h_ptr, s_ptr, q_ptr, h16_ptr, N, eps, HAS_DELTA: tl.constexpr,
                        WANT_H: tl.constexpr, WANT_SCALE: tl.constexpr, WANT_H16: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    if PDL:
        _pdl_enter()
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
    """core.fp8.quantize_rows of one bf16 row: scale = max(amax, 1e-12) / 448, q = (v / scale) -> E4M3 (RNE).
    Done where the row is produced, so W8A8 linears read E4M3 activations (half the bytes, no work in their loop)."""
    vf = v.to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(vf), axis=0), 1e-12) / 448.0
    tl.store(s_ptr + row, scale)
    tl.store(q_ptr + row * N + offs, tl.clamp(vf / scale, -448.0, 448.0).to(tl.float8e4nv), mask=mask)


@triton.jit
def _silu_mul_kernel(gu_ptr, a_ptr, s_ptr, q_ptr, a16_ptr, I, WANT_A: tl.constexpr, WANT_SCALE: tl.constexpr,
                     WANT_A16: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        _pdl_enter()
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
        _pdl_enter()
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
                              WANT_H16=h16_out is not None, BLOCK=block, num_warps=_row_warps(block), **_launch())
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
                           num_warps=_row_warps(block), **_launch())
    return a_out


def row_quant(x, scale_out, q_out):
    M, N = x.shape
    block = triton.next_power_of_2(N)
    _row_quant_kernel[(M,)](x, scale_out, q_out, N, BLOCK=block, num_warps=_row_warps(block), **_launch())
    return q_out


# ----------------------------------------------------------------------------------------------------- linear
@triton.jit
def _load_x(x_ptr, offs_m, offs_k, M, K, stride_xm, SILU_X: tl.constexpr):
    """The activation tile [BLOCK_K, BLOCK_M] (transposed view of x), ready for the dot."""
    mask = (offs_m[None, :] < M) & (offs_k[:, None] < K)
    ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
    if SILU_X:
        # x is the [M, 2K] gate/up output; SiLU(gate) * up rounded as the reference rounds it
        g = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        x = ((g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * u).to(tl.bfloat16)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)  # W8A8: already E4M3 (quantized by the kernel that made it)
    return x


@triton.jit
def _linear_tile(x_ptr, x16_ptr, w_ptr, offs_m, offs_n, M, N, K, k_lo, k_hi, stride_xm, stride_wn,
                 MODE: tl.constexpr, SILU_X: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr, EVEN: tl.constexpr, F16_DOT: tl.constexpr, X16: tl.constexpr):
    """The [BLOCK_N, BLOCK_M] float32 sum over k in [k_lo, k_hi) (k_lo a multiple of BLOCK_K) of one program of
    `_linear_kernel`, before any scale. With X16 the f16 dot reads x16_ptr, the activations already in f16."""
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + k_lo + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=(offs_n[:, None] < N) & (k0 + offs_k[None, :] < K), other=0.0)
        if F16_DOT and X16:
            x = _load_x(x16_ptr, offs_m, k0 + offs_k, M, K, stride_xm, False)
        else:
            x = _load_x(x_ptr, offs_m, k0 + offs_k, M, K, stride_xm, SILU_X)
        if MODE == 1:
            if F16_DOT:
                # E4M3 -> f16 is exact and one hardware conversion per two values (-> bf16 was the limit:
                # 2026-12-02 on the H200, 6144x4096 at 8 rows 20.6 us against 12.5); bf16 -> f16 is exact inside
                # f16's range (below 6.1e-5 it keeps 2^-24 steps; past 65504 it overflows: see _linear_kernel)
                acc = tl.dot(w.to(tl.float16), x.to(tl.float16), acc)
            else:
                acc = tl.dot(w.to(tl.bfloat16), x, acc)  # exact for any bf16 input
        else:
            acc = tl.dot(w, x, acc)
        w_ptrs += BLOCK_K
    return acc


# M is not specialized so that batch 1 and batch 8 share one compiled kernel per configuration
@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x_ptr, x16_ptr, w_ptr, ws_ptr, xs_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm,
                   stride_wn, stride_om, MODE: tl.constexpr, SILU_X: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, X16: tl.constexpr,
                   EVEN: tl.constexpr, PDL: tl.constexpr):
    """out = x @ w^T for a [BLOCK_N, BLOCK_M] tile. With SPLIT_K > 1 the program computes one of SPLIT_K slices of
    K: several programs per output tile keep more weight bytes in flight where N / BLOCK_N programs alone would
    leave SMs idle (a 4096-wide output at 64 rows). Each writes its float32 sum to part_ptr; the last of a tile to
    finish (a counter per tile) adds the slices in slice order, so the result does not depend on which finished
    first, and sets the counter back to 0 for the next call."""
    if PDL:
        _pdl_enter()
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    k_lo = 0
    k_hi = K
    if SPLIT_K > 1:
        k_per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        k_lo = tl.program_id(2) * k_per
        k_hi = tl.minimum(k_lo + k_per, K)
    # weight-only takes its dot in float16; the per-channel scale is applied to the f32 sum
    acc = _linear_tile(x_ptr, x16_ptr, w_ptr, offs_m, offs_n, M, N, K, k_lo, k_hi, stride_xm, stride_wn, MODE,
                       SILU_X, BLOCK_N, BLOCK_M, BLOCK_K, EVEN, MODE == 1, X16)
    if MODE == 1:
        if tl.min((tl.abs(acc) < float("inf")).to(tl.int32)) == 0:
            # an activation past f16's range (or a non-finite input): this tile again with the bf16 dot
            acc = _linear_tile(x_ptr, x16_ptr, w_ptr, offs_m, offs_n, M, N, K, k_lo, k_hi, stride_xm, stride_wn,
                               MODE, SILU_X, BLOCK_N, BLOCK_M, BLOCK_K, EVEN, False, X16)
    mask = (offs_m[None, :] < M) & (offs_n[:, None] < N)
    if SPLIT_K == 1:
        _linear_store(acc, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE)
    else:
        # part_ptr is [SPLIT_K, M, N] float32
        part = part_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.store(part + tl.program_id(2) * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's slice is written before the counter says so (release below)
        counter = count_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(counter, 1, sem="acq_rel") == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(part + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")  # from L2, not L1
            tl.atomic_xchg(counter, 0)
            _linear_store(acc, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE)


@triton.jit
def _linear_store(acc, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE: tl.constexpr):
    """The scales (per channel, and per token for W8A8) on the float32 sum, then the bf16 result."""
    if MODE != 0:
        acc = acc * tl.load(ws_ptr + offs_n, mask=offs_n < N, other=0.0)[:, None]
    if MODE == 2:
        acc = acc * tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)[None, :]
    tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc.to(tl.bfloat16), mask=mask)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, ws_ptr, xs_ptr, out_ptr, N, K, stride_wn,
                 MODE: tl.constexpr, SILU_X: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr):
    """One activation row: acc[n, k] += w[n, k] * x[k] with plain FMAs, reduced over k at the end. With PREFETCH
    (under programmatic dependent launch) the first weight tile is loaded before waiting on the previous kernel:
    weights do not change within a step, so those HBM reads overlap the previous kernel's tail."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, 1)
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    k_start = 0
    if PREFETCH:
        w0 = tl.load(w_ptrs, mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0)
    if PDL:
        _pdl_enter()
    if PREFETCH:
        x0 = _load_x(x_ptr, offs_m, offs_k, 1, K, 0, SILU_X)
        acc += w0.to(tl.float32) * tl.reshape(x0.to(tl.float32), (1, BLOCK_K))
        w_ptrs += BLOCK_K
        k_start = BLOCK_K
    for k0 in range(k_start, K, BLOCK_K):
        if EVEN:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=(offs_n[:, None] < N) & (k0 + offs_k[None, :] < K), other=0.0)
        x = _load_x(x_ptr, offs_m, k0 + offs_k, 1, K, 0, SILU_X)  # [BLOCK_K, 1]
        acc += w.to(tl.float32) * tl.reshape(x.to(tl.float32), (1, BLOCK_K))
        w_ptrs += BLOCK_K
    out = tl.sum(acc, axis=1)
    if MODE != 0:
        out = out * tl.load(ws_ptr + offs_n, mask=offs_n < N, other=0.0)
    if MODE == 2:
        out = out * tl.load(xs_ptr)
    tl.store(out_ptr + offs_n, out.to(tl.bfloat16), mask=offs_n < N)


@triton.jit
def _gemv_prologue_kernel(w_ptr, ws_ptr, x_ptr, d_ptr, xo_ptr, lnw_ptr, out_ptr, N, stride_wn, eps,
                          K: tl.constexpr, KP2: tl.constexpr, MODE: tl.constexpr, NORM: tl.constexpr,
                          HAS_DELTA: tl.constexpr, SILU_OUT: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """One activation row times a [N, K] weight, the whole of K in one tile, with the kernel that made the row's input
    folded in front: with NORM, add_rmsnorm's (x + delta, rounded to bf16; program 0 writes it to xo, the residual
    for later kernels, leaving x intact for the other programs) then RMSNorm * lnw; for W8A8 the row is then
    quantized to E4M3 as _quantize_row does, each program working out the row's scale itself. The weight tile is
    loaded before waiting on the previous kernel (weights do not change within a step), so under programmatic
    dependent launch its HBM reads overlap the previous kernel's tail and this kernel's prologue.
    With SILU_OUT the weight is gate|up ([2I, K], gate rows first) and silu_mul is folded in behind: each program
    takes gate and up rows in pairs (tile row 2j gate row c, 2j+1 up row I + c) and writes SiLU(gate) * up [I],
    rounded as silu_mul rounds it."""
    pid = tl.program_id(0)
    if SILU_OUT:
        half = N // 2
        offs_t = tl.arange(0, BLOCK_N)
        col = pid * (BLOCK_N // 2) + offs_t // 2
        offs_n = col + (offs_t % 2) * half
        nmask = col < half
    else:
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < N
    offs_k = tl.arange(0, KP2)
    kmask = offs_k < K
    w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=nmask[:, None] & kmask[None, :],
                other=0.0)
    if PDL:
        _pdl_enter()
    x = tl.load(x_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
    if NORM:
        if HAS_DELTA:
            xb = (x + tl.load(d_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)).to(tl.bfloat16)
            if pid == 0:
                tl.store(xo_ptr + offs_k, xb, mask=kmask)
            x = xb.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
        lw = tl.load(lnw_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        x = ((x * rstd).to(tl.bfloat16).to(tl.float32) * lw).to(tl.bfloat16).to(tl.float32)
    if MODE == 2:
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / 448.0
        x = tl.clamp(x / scale, -448.0, 448.0).to(tl.float8e4nv).to(tl.float32)
    out = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if MODE != 0:
        out = out * tl.load(ws_ptr + offs_n, mask=nmask, other=0.0)
    if MODE == 2:
        out = out * scale
    if SILU_OUT:
        g, u = tl.split(tl.reshape(out.to(tl.bfloat16).to(tl.float32), (BLOCK_N // 2, 2)))
        a = ((g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * u).to(tl.bfloat16)
        cols = pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out_ptr + cols, a, mask=cols < half)
    else:
        tl.store(out_ptr + offs_n, out.to(tl.bfloat16), mask=nmask)


# (BLOCK_N, num_warps) of gemv_prologue per mode: the best on the H200 for every Llama-3-8B batch-1 linear it folds
# into (2026-12-02, bench/fp8_speed.py --fold-ab; within 0.3 us of each shape's own best). PROLOGUE_CFG, keyed by
# (mode, N, K, silu_out), overrides them; --fold-ab fills it from its sweep.
PROLOGUE_DEFAULT = {MODE_BF16: (2, 4), MODE_WO: (8, 4), MODE_W8A8: (8, 4)}
PROLOGUE_CFG: dict[tuple[int, int, int, bool], tuple[int, int]] = {}
PROLOGUE_MAX_K = 8192  # the whole row is one tile: registers bound it


def gemv_prologue(x, w, w_scale, out, mode: int, delta=None, x_out=None, norm_weight=None, eps: float = 0.0,
                  cfg: tuple[int, int] | None = None, silu_out: bool = False):
    """out[1, N] = f(x)[1, K] @ w[N, K]^T for one row, where f is add_rmsnorm (norm_weight given; with delta the
    residual sum goes to x_out, x is only read) or nothing, then for W8A8 the per-row E4M3 quantization: the
    batch-1 decode step's norm and activation-quantization kernels folded into the linear that reads them.
    silu_out: w is gate|up and out [1, N/2] receives SiLU(gate) * up instead (silu_mul folded in behind)."""
    N, Kdim = w.shape
    bn, warps = cfg or PROLOGUE_CFG.get((mode, N, Kdim, silu_out)) or PROLOGUE_DEFAULT[mode]
    assert not silu_out or (bn % 2 == 0 and N % 2 == 0), "SiLU(gate) * up needs gate and up rows in pairs"
    norm = norm_weight is not None
    grid = (triton.cdiv(N // 2, bn // 2) if silu_out else triton.cdiv(N, bn),)
    _gemv_prologue_kernel[grid](
        w, w_scale if w_scale is not None else out, x, delta if delta is not None else x,
        x_out if x_out is not None else x, norm_weight if norm else x, out, N, w.stride(0), eps, K=Kdim,
        KP2=triton.next_power_of_2(Kdim), MODE=mode, NORM=norm, HAS_DELTA=delta is not None, SILU_OUT=silu_out,
        BLOCK_N=bn, num_warps=warps, num_stages=1, **_launch())
    return out


# The GEMV's first-tile prefetch, for weights of more than 4 tiles along K. H200, 2026-12-02 (bench/fp8_speed.py
# --fold-ab, which also measures the step without it): on the down projections (7-14 tiles) it took a BF16 batch-1
# step from 4.34 to 4.03 ms; on every GEMV, with 2-tile ones among them (K = 4096 in 2048-wide tiles: it leaves the
# pipelined loop a single tile), the step went from 4.40 to 4.46 ms.
GEMV_PREFETCH = True


# Launch configurations, keyed by (mode, m_key(M), N, K). bench/fp8_speed.py tunes them on the GPU and fills this
# table before capturing graphs; FastLlamaEngine loads the table measured on an H200 (tuned_h200.json) on Hopper;
# without a tuned entry, `default_config` is used.
TUNED: dict[tuple[int, int, int, int], dict] = {}


def load_tuned(path=None) -> int:
    """Add a saved tuning table (default: the H200 one shipped here) to TUNED; returns how many entries."""
    table = read_tuned_table(path)
    for key, cfg in table.items():
        TUNED.setdefault(key, cfg)
    return len(table)


def block_m_for(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


def m_key(m: int) -> int:
    """Tuning bucket of a batch size: one row is its own bucket (it may use the FMA GEMV), then by BLOCK_M."""
    return 1 if m == 1 else block_m_for(m)


def default_config(mode: int, m: int, n: int, k: int) -> dict:
    if block_m_for(m) >= 64:
        return dict(kernel="dot", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)
    return dict(kernel="dot", BLOCK_N=32, BLOCK_K=256 if mode != MODE_BF16 else 128, num_warps=4, num_stages=4)


def config_for(mode: int, m: int, n: int, k: int) -> dict:
    return TUNED.get((mode, m_key(m), n, k)) or default_config(mode, m, n, k)


def linear(x, w, w_scale, x_scale, out, mode: int, silu_x: bool = False, cfg: dict | None = None, x16=None):
    """out[M, N] = x[M, K] @ w[N, K]^T (* per-channel w_scale, * per-token x_scale for W8A8), bf16 out.

    W8A8: x is the E4M3 activation and x_scale its per-token scale (from add_rmsnorm / silu_mul / row_quant).
    With silu_x, x is [M, 2K] holding gate then up, and the kernel uses SiLU(gate) * up as its input.
    Weight-only: x16, when given, is x already in f16 (written beside x by the kernel that made it), which the f16
    dot then reads instead of converting x in every program; x itself is read only for a tile past f16's range.
    """
    N, K = w.shape
    M = x.shape[0]
    cfg = cfg or config_for(mode, M, N, K)
    if cfg.get("kernel") != "torch" and (mode, N, K, M) in _FAILED:
        return _linear_torch(x, w, w_scale, x_scale, out, mode, silu_x)
    try:
        return _linear_triton(x, w, w_scale, x_scale, out, mode, silu_x, cfg, x16)
    except Exception as exc:
        if cfg.get("kernel") == "torch" or not _is_compile_error(exc):
            raise
        # Say it once and keep going on the torch path: slower, same numerics
        _FAILED.add((mode, N, K, M))
        warnings.warn(f"Triton linear {cfg} failed for mode {mode}, {N}x{K}, M={M} ({type(exc).__name__}: "
                      f"{str(exc)[:200]}); using torch for it.")
        return _linear_torch(x, w, w_scale, x_scale, out, mode, silu_x)


_FAILED: set = set()


def _is_compile_error(exc: Exception) -> bool:
    name = type(exc).__name__
    compile_errors = ("CompilationError", "OutOfResources", "CompileTimeAssertionFailure")
    return name in compile_errors or "triton" in type(exc).__module__


def _linear_triton(x, w, w_scale, x_scale, out, mode, silu_x, cfg, x16=None):
    N, K = w.shape
    M = x.shape[0]
    dummy = w_scale if w_scale is not None else out
    xs = x_scale if x_scale is not None else dummy
    if cfg["kernel"] == "torch":
        return _linear_torch(x, w, w_scale, x_scale, out, mode, silu_x)
    if cfg["kernel"] == "gemv" and M == 1:
        bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
        launch = _launch()
        _gemv_kernel[(triton.cdiv(N, bn),)](
            x, w, dummy, xs, out, N, K, w.stride(0), MODE=mode, SILU_X=silu_x, BLOCK_N=bn, BLOCK_K=bk,
            EVEN=(N % bn == 0 and K % bk == 0), PREFETCH=launch["PDL"] and GEMV_PREFETCH and triton.cdiv(K, bk) > 4,
            num_warps=cfg["num_warps"], num_stages=cfg.get("num_stages", 2), **launch)
        return out
    if cfg["kernel"] == "gemv":
        cfg = default_config(mode, M, N, K)
    bn, bk, bm = cfg["BLOCK_N"], cfg["BLOCK_K"], block_m_for(M)
    split = cfg.get("SPLIT_K", 1)
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm), split)
    part, counts = _split_workspace(out.device, split, M, N, grid[0] * grid[1]) if split > 1 else (out, out)
    use_x16 = x16 is not None and mode == MODE_WO and not silu_x
    assert not use_x16 or x16.stride() == x.stride()
    _linear_kernel[grid](
        x, x16 if use_x16 else x, w, dummy, xs, out, part, counts, M, N, K, x.stride(0), w.stride(0), out.stride(0),
        MODE=mode, SILU_X=silu_x, BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=bk, SPLIT_K=split, X16=use_x16,
        EVEN=(N % bn == 0 and K % bk == 0),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_launch())
    return out


# Split-K scratch, per (device, SPLIT_K, M, N, tiles): the slices' float32 sums and one counter per output tile (0
# between calls: the last program of a tile resets it). A launch writes and reads its scratch within itself, so two
# launches may share one only if they cannot overlap: eager calls share the process's table and run on the default
# stream, one after another; a graph may replay on another stream while a second graph replays, so each DecodeGraph
# makes its scratch inside its own `split_scratch_scope` (the table then lives as long as the graph).
_SPLIT_SCRATCH = contextvars.ContextVar("split_scratch", default=None)
_EAGER_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


@contextlib.contextmanager
def split_scratch_scope(table: dict):
    """Split-K linears launched inside keep their scratch in `table` (a graph's own)."""
    token = _SPLIT_SCRATCH.set(table)
    try:
        yield
    finally:
        _SPLIT_SCRATCH.reset(token)


def _split_workspace(device, split: int, m: int, n: int, tiles: int):
    table = _SPLIT_SCRATCH.get()
    table = _EAGER_SCRATCH if table is None else table
    key = (device, split, m, n, tiles)
    if key not in table:
        if torch.cuda.is_current_stream_capturing():
            # the counters' zero-fill would only be recorded into the graph, never run before an eager call
            raise RuntimeError("split-K scratch must be made before graph capture: run the step once first")
        table[key] = (torch.empty(split, m, n, dtype=torch.float32, device=device),
                      torch.zeros(tiles, dtype=torch.int32, device=device))
    return table[key]


def _linear_torch(x, w, w_scale, x_scale, out, mode, silu_x):
    """cuBLAS / torch._scaled_mm, for shapes where they beat the Triton kernels (the tuner decides)."""
    if silu_x:
        g, u = x.chunk(2, dim=-1)
        x = torch.nn.functional.silu(g) * u
    if mode == MODE_BF16:
        return torch.matmul(x, w.t(), out=out)
    if mode == MODE_WO:
        deq = (w.float() * w_scale[:, None]).to(x.dtype)
        return torch.matmul(x, deq.t(), out=out)
    out.copy_(torch._scaled_mm(x, w.t(), scale_a=x_scale[:, None], scale_b=w_scale[None, :], out_dtype=out.dtype))
    return out


# ------------------------------------------------------------------------------------------ RoPE + cache write
@triton.jit
def _rotate(x1, x2, c, s):
    # HF's q * cos + rotate_half(q) * sin in bf16: each product rounded to bf16, then the sum (cos/sin are bf16 values)
    r1 = ((x1 * c).to(tl.bfloat16).to(tl.float32) - (x2 * s).to(tl.bfloat16).to(tl.float32)).to(tl.bfloat16)
    r2 = ((x2 * c).to(tl.bfloat16).to(tl.float32) + (x1 * s).to(tl.bfloat16).to(tl.float32)).to(tl.bfloat16)
    return r1, r2


@triton.jit
def _rope_store_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, R,
                       stride_qkv, stride_cb, stride_ch, stride_ct, stride_sb, stride_sh,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr,
                       BLOCK_R: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        _pdl_enter()
    # rows of qkv: the batch's rows in a decode step, the prompt's tokens in a prompt pass (int64: 125K tokens x
    # 6,144 is close to 2^31)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    h = tl.program_id(1)
    rmask = rows < R
    m2 = rmask[:, None]
    pos = tl.load(pos_ptr + rows, mask=rmask, other=0)
    half = tl.arange(0, D // 2)[None, :]
    c = tl.load(cos_ptr + pos[:, None] * (D // 2) + half, mask=m2, other=0.0)
    s = tl.load(sin_ptr + pos[:, None] * (D // 2) + half, mask=m2, other=0.0)
    row = qkv_ptr + rows[:, None] * stride_qkv
    if h < HQ:
        x1 = tl.load(row + h * D + half, mask=m2, other=0.0).to(tl.float32)
        x2 = tl.load(row + h * D + D // 2 + half, mask=m2, other=0.0).to(tl.float32)
        o1, o2 = _rotate(x1, x2, c, s)
        tl.store(q_ptr + (rows[:, None] * HQ + h) * D + half, o1, mask=m2)
        tl.store(q_ptr + (rows[:, None] * HQ + h) * D + D // 2 + half, o2, mask=m2)
    else:
        j = h - HQ
        x1 = tl.load(row + (HQ + j) * D + half, mask=m2, other=0.0).to(tl.float32)
        x2 = tl.load(row + (HQ + j) * D + D // 2 + half, mask=m2, other=0.0).to(tl.float32)
        k1, k2 = _rotate(x1, x2, c, s)
        v1 = tl.load(row + (HQ + HKV + j) * D + half, mask=m2, other=0.0)
        v2 = tl.load(row + (HQ + HKV + j) * D + D // 2 + half, mask=m2, other=0.0)
        dst = rows[:, None] * stride_cb + j * stride_ch + pos[:, None] * stride_ct
        if FP8:
            # quantize_rows over head_dim: one scale per (row, head, token)
            ksc = tl.maximum(tl.maximum(tl.max(tl.abs(k1.to(tl.float32)), 1), tl.max(tl.abs(k2.to(tl.float32)), 1)),
                             1e-12) / 448.0
            vsc = tl.maximum(tl.maximum(tl.max(tl.abs(v1.to(tl.float32)), 1), tl.max(tl.abs(v2.to(tl.float32)), 1)),
                             1e-12) / 448.0
            tl.store(k_ptr + dst + half, tl.clamp(k1.to(tl.float32) / ksc[:, None], -448.0, 448.0).to(tl.float8e4nv),
                     mask=m2)
            tl.store(k_ptr + dst + D // 2 + half,
                     tl.clamp(k2.to(tl.float32) / ksc[:, None], -448.0, 448.0).to(tl.float8e4nv), mask=m2)
            tl.store(v_ptr + dst + half, tl.clamp(v1.to(tl.float32) / vsc[:, None], -448.0, 448.0).to(tl.float8e4nv),
                     mask=m2)
            tl.store(v_ptr + dst + D // 2 + half,
                     tl.clamp(v2.to(tl.float32) / vsc[:, None], -448.0, 448.0).to(tl.float8e4nv), mask=m2)
            sdst = rows * stride_sb + j * stride_sh + pos
            tl.store(ks_ptr + sdst, ksc, mask=rmask)
            tl.store(vs_ptr + sdst, vsc, mask=rmask)
        else:
            tl.store(k_ptr + dst + half, k1, mask=m2)
            tl.store(k_ptr + dst + D // 2 + half, k2, mask=m2)
            tl.store(v_ptr + dst + half, v1, mask=m2)
            tl.store(v_ptr + dst + D // 2 + half, v2, mask=m2)


def rope_store(qkv, pos, cos, sin, q_out, k_cache, v_cache, k_scale, v_scale, hq, hkv, d):
    """qkv [B, (hq+2hkv)*d]; cos/sin [max_pos, d/2] f32 holding bf16 values; caches [B, hkv, T, d] (one layer);
    scales [B, hkv, T]."""
    B = qkv.shape[0]
    fp8 = k_scale is not None
    _rope_store_kernel[(B, hq + hkv)](
        qkv, pos, cos, sin, q_out, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache, B,
        qkv.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_scale.stride(0) if fp8 else 0, k_scale.stride(1) if fp8 else 0,
        HQ=hq, HKV=hkv, D=d, FP8=fp8, BLOCK_R=1, num_warps=1, **_launch())


def rope_store_prompt(qkv, cos, sin, q_out, k_cache, v_cache, k_scale, v_scale, hq, hkv, d, block_r: int = 16):
    """The prompt pass's RoPE and cache write for one row: qkv [T, (hq+2hkv)*d] of positions 0..T-1 -> q_out
    [T, hq, d]; K/V into k_cache/v_cache [hkv, max_len, d] (that row of one layer), E4M3 with scales [hkv, max_len]
    for an FP8 cache. The decode step's kernel with each token as a row of its own whose cache row stride is 0, so
    every token lands in the same cache row at its own position; block_r tokens per program."""
    T = qkv.shape[0]
    fp8 = k_scale is not None
    pos = torch.arange(T, device=qkv.device)
    _rope_store_kernel[(triton.cdiv(T, block_r), hq + hkv)](
        qkv, pos, cos, sin, q_out, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache, T,
        qkv.stride(0), 0, k_cache.stride(0), k_cache.stride(1), 0, k_scale.stride(0) if fp8 else 0,
        HQ=hq, HKV=hkv, D=d, FP8=fp8, BLOCK_R=block_r, num_warps=4, **_launch())
    return q_out


# --------------------------------------------------------------------------------------------- decode attention
@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, SPLIT_LEN,
                       S, stride_cb, stride_ch, stride_ct, stride_sb, stride_sh,
                       HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                       BLOCK_T: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        _pdl_enter()
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
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tmask = offs_t < end
        kv_off = base + offs_t[:, None] * stride_ct + offs_d[None, :]
        k = tl.load(k_ptr + kv_off, mask=tmask[:, None], other=0.0)
        v = tl.load(v_ptr + kv_off, mask=tmask[:, None], other=0.0)
        if FP8:
            # dequantize exactly as FP8KV.read(): (q.float() * scale).to(bf16). Folding the scales into the scores
            # and p instead, with the E4M3 bits moved into f16 (no conversion instructions), measured no faster
            # on the H200 (2026-11-29), so the version that rounds like the eager reference stays.
            ks = tl.load(ks_ptr + b * stride_sb + kvh * stride_sh + offs_t, mask=tmask, other=0.0)
            vs = tl.load(vs_ptr + b * stride_sb + kvh * stride_sh + offs_t, mask=tmask, other=0.0)
            k = (k.to(tl.float32) * ks[:, None]).to(tl.bfloat16)
            v = (v.to(tl.float32) * vs[:, None]).to(tl.bfloat16)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # log2 domain
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
def _attn_combine_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, out16_ptr, S, D: tl.constexpr, SP: tl.constexpr,
                         CH: tl.constexpr, WANT_OUT16: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        _pdl_enter()
    bh = tl.program_id(0)
    offs_s = tl.arange(0, SP)
    m_all = tl.load(m_ptr + bh * S + offs_s, mask=offs_s < S, other=float("-inf"))
    m_max = tl.max(m_all, axis=0)
    offs_d = tl.arange(0, D)
    out = tl.zeros([D], tl.float32)
    denom = tl.zeros([CH], tl.float32)
    for s0 in range(0, S, CH):
        offs_c = s0 + tl.arange(0, CH)
        cmask = offs_c < S
        mc = tl.load(m_ptr + bh * S + offs_c, mask=cmask, other=float("-inf"))
        lc = tl.load(l_ptr + bh * S + offs_c, mask=cmask, other=0.0)
        w = tl.where(cmask & (mc > float("-inf")), tl.exp2(mc - m_max), 0.0)
        a = tl.load(acc_ptr + (bh * S + offs_c[:, None]) * D + offs_d[None, :], mask=cmask[:, None], other=0.0)
        out += tl.sum(a * w[:, None], axis=0)
        denom += w * lc
    o = (out / tl.sum(denom, axis=0)).to(tl.bfloat16)
    tl.store(out_ptr + bh * D + offs_d, o)
    if WANT_OUT16:
        tl.store(out16_ptr + bh * D + offs_d, o.to(tl.float16))


class AttnWorkspace:
    """Partial results of the split-KV attention, sized once per (batch, max_len) so a graph can reuse them, and the
    launch configuration of the split kernel for the cache's K/V dtype."""

    # (BLOCK_T, num_warps, num_stages, programs per SM at the longest length), per K/V dtype
    # E4M3 K/V: two warps and three stages, 198 us against 290 us with the bf16 settings for one layer at 32K tokens x
    # batch 8 on the H200, same result bit for bit (bench/kernel_probe.py, 2026-12-01)
    CONFIG = {False: (64, 4, 2, 4), True: (64, 2, 3, 4)}

    # E4M3 K/V through the CUDA kernel (attn_e4m3): 4 warps, programs per SM at the longest length
    CUDA_E4M3_PER_SM = 2

    def __init__(self, batch: int, hq: int, hkv: int, d: int, max_len: int, device, sms: int | None = None,
                 fp8: bool = False, config: tuple | None = None, cuda_e4m3: bool | None = None):
        dev = torch.device(device)
        if sms is None:  # the CPU case is Triton's interpreter, used only to check indexing
            sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 8
        if cuda_e4m3 is None:
            cuda_e4m3 = fp8 and attn_e4m3.why_not(dev, hq, hkv, d) is None
        self.cuda_e4m3 = cuda_e4m3  # the E4M3 split runs as attn_e4m3's CUDA kernel, not the Triton one
        if config is None and cuda_e4m3:
            config = (64, attn_e4m3.WARPS, 1, self.CUDA_E4M3_PER_SM)
        self.block_t, self.num_warps, self.num_stages, per_sm = config or self.CONFIG[fp8]
        # enough programs to fill the chip per_sm times over at the longest length, splits a multiple of block_t
        want = max(1, (per_sm * sms) // max(1, batch * hkv))
        split_len = max(self.block_t, triton.cdiv(triton.cdiv(max_len, want), self.block_t) * self.block_t)
        self.split_len = split_len
        self.splits = triton.cdiv(max_len, split_len)
        self.m = torch.empty(batch * hq * self.splits, dtype=torch.float32, device=device)
        self.l = torch.empty_like(self.m)
        self.acc = torch.empty(batch * hq * self.splits * d, dtype=torch.float32, device=device)


def decode_attention(q, k_cache, v_cache, k_scale, v_scale, pos, out, ws: AttnWorkspace, hq, hkv, d, sm_scale,
                     out16=None):
    """q [B, hq, d] bf16 -> out [B, hq*d] bf16, attending to cache positions 0..pos[b] of row b; out16: the same in
    f16 too (`linear`'s x16)."""
    B = q.shape[0]
    if ws.cuda_e4m3:
        attn_e4m3.split_partials(q, k_cache, v_cache, k_scale, v_scale, pos, ws, hq, hkv, d, sm_scale)
    else:
        _attn_split(q, k_cache, v_cache, k_scale, v_scale, pos, ws, hq, hkv, d, sm_scale)
    _attn_combine_kernel[(B * hq,)](ws.m, ws.l, ws.acc, out, out16 if out16 is not None else out, ws.splits, D=d,
                                    SP=triton.next_power_of_2(ws.splits), CH=16, WANT_OUT16=out16 is not None,
                                    num_warps=4, **_launch())
    return out


def _attn_split(q, k_cache, v_cache, k_scale, v_scale, pos, ws, hq, hkv, d, sm_scale):
    B = q.shape[0]
    g = hq // hkv
    fp8 = k_scale is not None
    _attn_split_kernel[(B * hkv, ws.splits)](
        q, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache, pos, ws.m, ws.l, ws.acc,
        sm_scale * 1.4426950408889634, ws.split_len, ws.splits,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_scale.stride(0) if fp8 else 0, k_scale.stride(1) if fp8 else 0,
        HQ=hq, HKV=hkv, G=g, GP=max(16, triton.next_power_of_2(g)), D=d, BLOCK_T=ws.block_t, FP8=fp8,
        # the E4M3 split kernel runs without it: with it, a batch-1 step at 32K tokens got slower on the H200
        # (W8A8 4.01 -> 4.54 ms), where the bf16-cache one got faster (4.19 -> 4.07)
        num_warps=ws.num_warps, num_stages=ws.num_stages, **_launch(allowed=not fp8))
