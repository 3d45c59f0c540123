"""Split-KV ("flash-decoding") decode attention over the static cache, bf16 or E4M3 K/V, then a combine kernel over
the splits. Over an E4M3 cache the split runs as attn_e4m3.py's CUDA C++ kernel where it can."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.engines.fast.kernels import attn_e4m3
from core.engines.fast.kernels.launch import launch_options, pdl_enter


@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, SPLIT_LEN,
                       S, stride_cb, stride_ch, stride_ct, stride_sb, stride_sh,
                       HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                       BLOCK_T: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        pdl_enter()
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
            # dequantize exactly as FP8KV.read(): (q.float() * scale).to(bf16); folding the scales in measured no
            # faster (docs/fast-engine.md#e4m3-dequant)
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
        pdl_enter()
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
    # E4M3 K/V: two warps and three stages, measured faster on the H200 (docs/fast-engine.md#e4m3-attention-launch)
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
    combine_splits(ws, out, out16, B * hq, d)
    return out


def combine_splits(ws: AttnWorkspace, out, out16, rows: int, d: int) -> None:
    """The combine kernel: ws's partials over the splits -> out [rows, d] bf16 (and out16 in f16 when given)."""
    _attn_combine_kernel[(rows,)](ws.m, ws.l, ws.acc, out, out16 if out16 is not None else out, ws.splits, D=d,
                                  SP=triton.next_power_of_2(ws.splits), CH=16, WANT_OUT16=out16 is not None,
                                  num_warps=4, **launch_options())


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
        # the E4M3 split kernel runs without PDL: slower with it on the H200 (docs/fast-engine.md#e4m3-split-pdl)
        num_warps=ws.num_warps, num_stages=ws.num_stages, **launch_options(allowed=not fp8))
