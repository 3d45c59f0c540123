"""The linears of the fast engine: a skinny GEMM (`linear`, Triton tensor-core dots with optional split-K, or
cuBLAS / torch._scaled_mm where the tuner picks them), the one-row GEMV, and `gemv_prologue` (one row with the norm
and W8A8's quantization folded in). The launch configuration comes from the caller (the precision's method picks
its tuning table's winner, core/engines/fast/methods/), else `default_config`."""
from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl

from core.engines.fast.kernels.launch import launch_options, pdl_enter
from core.engines.fast.kernels.rounding import load_x
from core.engines.fast.kernels.scratch import split_k_total, split_parts

E4M3_MAX = 448.0
MODE_BF16, MODE_WO, MODE_W8A8 = 0, 1, 2
MODES = {"bf16": MODE_BF16, "fp8-wo": MODE_WO, "fp8": MODE_W8A8}


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
            x = load_x(x16_ptr, offs_m, k0 + offs_k, M, K, stride_xm, False)
        else:
            x = load_x(x_ptr, offs_m, k0 + offs_k, M, K, stride_xm, SILU_X)
        if MODE == 1:
            if F16_DOT:
                # E4M3 -> f16 is exact and one hardware conversion per two values (-> bf16 was the limit:
                # docs/fast-engine.md#f16-dot); bf16 -> f16 is exact inside
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
        pdl_enter()
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
    else:  # part_ptr is [SPLIT_K, M, N] float32
        last, total = split_k_total(acc, part_ptr, count_ptr + pid_m * tl.num_programs(0) + pid_n, tl.program_id(2),
                                    offs_m, offs_n, M, N, mask, SPLIT_K)
        if last:
            _linear_store(total, ws_ptr, xs_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, mask, MODE)


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
        pdl_enter()
    if PREFETCH:
        x0 = load_x(x_ptr, offs_m, offs_k, 1, K, 0, SILU_X)
        acc += w0.to(tl.float32) * tl.reshape(x0.to(tl.float32), (1, BLOCK_K))
        w_ptrs += BLOCK_K
        k_start = BLOCK_K
    for k0 in range(k_start, K, BLOCK_K):
        if EVEN:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=(offs_n[:, None] < N) & (k0 + offs_k[None, :] < K), other=0.0)
        x = load_x(x_ptr, offs_m, k0 + offs_k, 1, K, 0, SILU_X)  # [BLOCK_K, 1]
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
        pdl_enter()
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


# (BLOCK_N, num_warps) of gemv_prologue per mode: the best on the H200 for the Llama-3-8B batch-1 linears
# (docs/fast-engine.md#prologue-launch). PROLOGUE_CFG, keyed by (mode, N, K, silu_out), overrides them.
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
        BLOCK_N=bn, num_warps=warps, num_stages=1, **launch_options())
    return out


# The GEMV's first-tile prefetch, for weights of more than 4 tiles along K: faster on the H200 there, slower on
# every GEMV (docs/fast-engine.md#gemv-prefetch).
GEMV_PREFETCH = True


def block_m_for(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


def default_config(mode: int, m: int, n: int, k: int) -> dict:
    if block_m_for(m) >= 64:
        return dict(kernel="dot", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)
    return dict(kernel="dot", BLOCK_N=32, BLOCK_K=256 if mode != MODE_BF16 else 128, num_warps=4, num_stages=4)


def linear(x, w, w_scale, x_scale, out, mode: int, silu_x: bool = False, cfg: dict | None = None, x16=None):
    """out[M, N] = x[M, K] @ w[N, K]^T (* per-channel w_scale, * per-token x_scale for W8A8), bf16 out.

    W8A8: x is the E4M3 activation and x_scale its per-token scale (from add_rmsnorm / silu_mul / row_quant).
    With silu_x, x is [M, 2K] holding gate then up, and the kernel uses SiLU(gate) * up as its input.
    Weight-only: x16, when given, is x already in f16 (written beside x by the kernel that made it), which the f16
    dot then reads instead of converting x in every program; x itself is read only for a tile past f16's range.
    """
    N, K = w.shape
    M = x.shape[0]
    cfg = cfg or default_config(mode, M, N, K)
    if cfg.get("kernel") != "torch" and (mode, N, K, M) in _FAILED:
        return linear_torch(x, w, w_scale, x_scale, out, mode, silu_x)
    try:
        return linear_triton(x, w, w_scale, x_scale, out, mode, silu_x, cfg, x16)
    except Exception as exc:
        if cfg.get("kernel") == "torch" or not _is_compile_error(exc):
            raise
        # Say it once and keep going on the torch path: slower, same numerics
        _FAILED.add((mode, N, K, M))
        warnings.warn(f"Triton linear {cfg} failed for mode {mode}, {N}x{K}, M={M} ({type(exc).__name__}: "
                      f"{str(exc)[:200]}); using torch for it.")
        return linear_torch(x, w, w_scale, x_scale, out, mode, silu_x)


_FAILED: set = set()


def _is_compile_error(exc: Exception) -> bool:
    name = type(exc).__name__
    compile_errors = ("CompilationError", "OutOfResources", "CompileTimeAssertionFailure")
    return name in compile_errors or "triton" in type(exc).__module__


def linear_triton(x, w, w_scale, x_scale, out, mode, silu_x, cfg, x16=None):
    """`linear` through the kernel `cfg` names, with no fallback: what the tuner times."""
    N, K = w.shape
    M = x.shape[0]
    dummy = w_scale if w_scale is not None else out
    xs = x_scale if x_scale is not None else dummy
    if cfg["kernel"] == "torch":
        return linear_torch(x, w, w_scale, x_scale, out, mode, silu_x)
    if cfg["kernel"] == "gemv" and M == 1:
        bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
        launch = launch_options()
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
    part, counts = split_parts(out.device, (), split, M, N, grid[0] * grid[1]) if split > 1 else (out, out)
    use_x16 = x16 is not None and mode == MODE_WO and not silu_x
    assert not use_x16 or x16.stride() == x.stride()
    _linear_kernel[grid](
        x, x16 if use_x16 else x, w, dummy, xs, out, part, counts, M, N, K, x.stride(0), w.stride(0), out.stride(0),
        MODE=mode, SILU_X=silu_x, BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=bk, SPLIT_K=split, X16=use_x16,
        EVEN=(N % bn == 0 and K % bk == 0),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_options())
    return out


def linear_torch(x, w, w_scale, x_scale, out, mode, silu_x):
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
