"""Roundings and operand loads shared by the fast engine's linear kernels (linears.py and the integer ones), written
once so that every family rounds as the eager reference rounds.

Triton's CPU interpreter truncates float32 -> bf16 casts (its "rtne" rounds ties up): there the helpers round with
integer operations instead, so the CPU tests check the GPU's numerics bit for bit. Compiled, `to_bf16` is the plain
cast and `load_x` is the activation load linears.py always had.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: (v + M) - M rounds |v| < 2^22 to the nearest integer, ties to even


INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def to_bf16(x):
    """float32 -> bf16, round to nearest even (finite values). Interpreted: the rounded value as a float32 (the
    interpreter's bf16 tensors do not enter its dots as numbers), which stores to bf16 exactly."""
    if INTERPRETED:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def mma(w, x, acc):
    """acc += w @ x: bf16 operands on the tensor cores (float32 accumulation); interpreted, in float32."""
    if INTERPRETED:
        return tl.dot(w.to(tl.float32), x.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(w, x, acc)


@triton.jit
def load_x(x_ptr, offs_m, offs_k, M, K, stride_xm, SILU_X: tl.constexpr):
    """The activation tile [BLOCK_K, BLOCK_M] (transposed view of x), ready for the dot; its roundings through
    `to_bf16`. W8A8 FP8 passes its E4M3 activations (quantized by the kernel that made them) through unchanged."""
    mask = (offs_m[None, :] < M) & (offs_k[:, None] < K)
    ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
    if SILU_X:
        # x is the [M, 2K] gate/up output; SiLU(gate) * up rounded as the reference (HF's bf16 ops) rounds it
        g = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        x = to_bf16(to_bf16(g / (1.0 + tl.exp(-g))).to(tl.float32) * u)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x


@triton.jit
def div_rn(a, b, r):
    """a / b correctly rounded, given r = 1 / b correctly rounded: one Markstein correction of a * r (exact for
    normal operands; `/` in Triton is an approximate division, and div_rn's full sequence costs ~10 operations a
    weight). Checked against torch's division bit for bit in tests/gpu/test_int_kernels_gpu.py. Interpreted: the
    interpreter's fma rounds twice, so its true division stands in."""
    if INTERPRETED:
        return tl.math.div_rn(a, b + 0.0 * r)
    else:
        q = a * r
        rem = tl.fma(-q, b, a)
        return tl.fma(rem, r, q)


