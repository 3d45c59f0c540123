"""RoPE on q and k and the K/V write into the static cache (quantized per token and head for an FP8 cache), for a
decode step's rows (`rope_store`) and a prompt's tokens (`rope_store_prompt`).

The decode step's q|k|v may be a library kernel's own float32 output (kernels/library.py), rounded to bf16 as it is
loaded (what its copy into the bf16 buffer did), and, for INT4 AWQ, in three row blocks (q's columns valid in the
first, k's in the second, v's in the third: one kernel over each projection's divided rows) or three tensors (one
kernel per projection). The kernel reads q, k and v from three sources, each with its own row stride."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.engines.fast.kernels.launch import launch_options, pdl_enter


@triton.jit
def _rotate(x1, x2, c, s):
    # HF's q * cos + rotate_half(q) * sin in bf16: each product rounded to bf16, then the sum (cos/sin are bf16 values)
    r1 = ((x1 * c).to(tl.bfloat16).to(tl.float32) - (x2 * s).to(tl.bfloat16).to(tl.float32)).to(tl.bfloat16)
    r2 = ((x2 * c).to(tl.bfloat16).to(tl.float32) + (x1 * s).to(tl.bfloat16).to(tl.float32)).to(tl.bfloat16)
    return r1, r2


@triton.jit
def _rope_store_kernel(qs_ptr, ks_src_ptr, vs_src_ptr, pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, ks_ptr,
                       vs_ptr, R, stride_qs, stride_ks, stride_vs, stride_cb, stride_ch, stride_ct, stride_sb,
                       stride_sh,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr,
                       BLOCK_R: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        pdl_enter()
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
    row = qs_ptr + rows[:, None] * stride_qs
    if h < HQ:
        x1 = tl.load(row + h * D + half, mask=m2, other=0.0).to(tl.bfloat16).to(tl.float32)
        x2 = tl.load(row + h * D + D // 2 + half, mask=m2, other=0.0).to(tl.bfloat16).to(tl.float32)
        o1, o2 = _rotate(x1, x2, c, s)
        tl.store(q_ptr + (rows[:, None] * HQ + h) * D + half, o1, mask=m2)
        tl.store(q_ptr + (rows[:, None] * HQ + h) * D + D // 2 + half, o2, mask=m2)
    else:
        j = h - HQ
        krow, vrow = ks_src_ptr + rows[:, None] * stride_ks, vs_src_ptr + rows[:, None] * stride_vs
        x1 = tl.load(krow + j * D + half, mask=m2, other=0.0).to(tl.bfloat16).to(tl.float32)
        x2 = tl.load(krow + j * D + D // 2 + half, mask=m2, other=0.0).to(tl.bfloat16).to(tl.float32)
        k1, k2 = _rotate(x1, x2, c, s)
        v1 = tl.load(vrow + j * D + half, mask=m2, other=0.0).to(tl.bfloat16)
        v2 = tl.load(vrow + j * D + D // 2 + half, mask=m2, other=0.0).to(tl.bfloat16)
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


def qkv_sources(qkv, rows: int, hq: int, hkv: int, d: int) -> tuple:
    """(q, k, v) views [rows, columns] of a fused projection's output: one [rows, (hq+2hkv)*d] tensor, the same in
    three row blocks [3 rows, ...] (projection j's columns valid in block j), or three tensors already."""
    if isinstance(qkv, (tuple, list)):
        q, k, v = qkv
    else:
        assert qkv.shape[0] in (rows, 3 * rows), f"q|k|v has {qkv.shape[0]} rows for {rows}"
        blocks = qkv.shape[0] // rows
        q, k, v = (qkv[(j if blocks > 1 else 0) * rows:][:rows] for j in range(3))
        k, v = k[:, hq * d:], v[:, (hq + hkv) * d:]
    assert q.shape[1] >= hq * d and k.shape[1] >= hkv * d and v.shape[1] >= hkv * d
    assert all(t.stride(1) == 1 and t.shape[0] == rows for t in (q, k, v)), "q, k, v: rows of contiguous columns"
    return q, k, v


def rope_store(qkv, pos, cos, sin, q_out, k_cache, v_cache, k_scale, v_scale, hq, hkv, d):
    """qkv: [B, (hq+2hkv)*d] bf16 or float32, or in row blocks or three tensors (`qkv_sources`); pos [B]; cos/sin
    [max_pos, d/2] f32 holding bf16 values; caches [B, hkv, T, d] (one layer); scales [B, hkv, T]."""
    B = pos.shape[0]
    q, k, v = qkv_sources(qkv, B, hq, hkv, d)
    fp8 = k_scale is not None
    _rope_store_kernel[(B, hq + hkv)](
        q, k, v, pos, cos, sin, q_out, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache,
        B, q.stride(0), k.stride(0), v.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_scale.stride(0) if fp8 else 0, k_scale.stride(1) if fp8 else 0,
        HQ=hq, HKV=hkv, D=d, FP8=fp8, BLOCK_R=1, num_warps=1, **launch_options())


def rope_store_prompt(qkv, cos, sin, q_out, k_cache, v_cache, k_scale, v_scale, hq, hkv, d, block_r: int = 16):
    """The prompt pass's RoPE and cache write for one row: qkv [T, (hq+2hkv)*d] of positions 0..T-1 -> q_out
    [T, hq, d]; K/V into k_cache/v_cache [hkv, max_len, d] (that row of one layer), E4M3 with scales [hkv, max_len]
    for an FP8 cache. The decode step's kernel with each token as a row of its own whose cache row stride is 0, so
    every token lands in the same cache row at its own position; block_r tokens per program."""
    T = qkv.shape[0]
    fp8 = k_scale is not None
    pos = torch.arange(T, device=qkv.device)
    q, k, v = qkv_sources(qkv, T, hq, hkv, d)
    _rope_store_kernel[(triton.cdiv(T, block_r), hq + hkv)](
        q, k, v, pos, cos, sin, q_out, k_cache, v_cache, k_scale if fp8 else k_cache, v_scale if fp8 else v_cache, T,
        q.stride(0), k.stride(0), v.stride(0), 0, k_cache.stride(0), k_cache.stride(1), 0,
        k_scale.stride(0) if fp8 else 0,
        HQ=hq, HKV=hkv, D=d, FP8=fp8, BLOCK_R=block_r, num_warps=4, **launch_options())
    return q_out
