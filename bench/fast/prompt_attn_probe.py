"""Causal prompt attention in E4M3 on FP8 tensor cores, one layer, against cuDNN's BF16 attention (what the prompt
pass runs), on one GPU: a measured candidate, not used by the engine (docs/perf-log/fp8-h200.md, 2026-12-03).

    python -m bench.fast.prompt_attn_probe [--len 32768] [--configs 64x128x4x3,...] [--json $OUT/probe.json]

With an FP8 KV cache, vLLM on Hopper attends over the prompt in FP8 (FlashAttention-3's E4M3 forward). torch has no
such kernel; this Triton one does what FA3's E4M3 path does, with finer scales: the query quantized per (token, head)
inside the kernel, K and V as the cache stores them (E4M3, a scale per token and head), each K scale folded into its
score column and each V scale into its probability column before P.V; K and V^T read by TMA.
Llama-3-8B's attention shape (32 query heads, 8 KV heads, head_dim 128), random q/k/v. Prints the error of each
kernel against float32 attention over the same E4M3 cache (RMS of the difference over RMS of the reference, and the
worst row's), then cuDNN's time and each launch configuration's (BM x BN x warps x stages x warp-specialized loop),
median of --reps after a warm-up, in TFLOP/s of causal attention.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import triton
import triton.language as tl
from torch.nn import functional as F
from triton.tools.tensor_descriptor import TensorDescriptor

from core.engines.torch import fp8
from core.engines.fast.model import causal_attention

HQ, HKV, D = 32, 8, 128
# probabilities times V scale / the largest V scale are in [0, 1]; times this power of two (exact) they stay in E4M3's
# normal range down to 2^-14 for P.V
P_SCALE = tl.constexpr(256.0)


@triton.jit
def _blk(acc, l_i, m_i, q8, rs, k_desc, v_desc, ks_base, vs_base, cvs, offs_m, start_n, T, kv_row,
         BN: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr):
    offs_n = start_n + tl.arange(0, BN)
    k = k_desc.load([kv_row, start_n, 0]).reshape(BN, D)
    v = v_desc.load([kv_row, 0, start_n]).reshape(D, BN)
    if MASKED:
        nmask = offs_n < T
        ks = tl.load(ks_base + offs_n, mask=nmask, other=0.0)
        vs = tl.load(vs_base + offs_n, mask=nmask, other=0.0)
    else:
        ks = tl.load(ks_base + offs_n)
        vs = tl.load(vs_base + offs_n)
    t = tl.dot(q8, k.T) * ks[None, :]
    if MASKED:
        t = tl.where((offs_n[None, :] <= offs_m[:, None]) & (offs_n < T)[None, :], t, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(t, 1) * rs)
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(t * rs[:, None] - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    pv = (p * (vs * cvs)[None, :]).to(tl.float8e4nv)
    acc = tl.dot(pv, v.T, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _prompt_attn_kernel(q_ptr, k_desc, v_desc, ks_ptr, vs_ptr, vmax_ptr, out_ptr, T, qk_scale, stride_qt, stride_ot,
                        stride_sr, HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, WS: tl.constexpr):
    # heads vary fastest, so a KV head's query heads run side by side and share its tiles in L2; the longest rows
    # (last query blocks) start first
    h = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    kvh = h // G
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    mmask = offs_m < T
    q = tl.load(q_ptr + offs_m[:, None].to(tl.int64) * stride_qt + h * D + offs_d[None, :],
                mask=mmask[:, None], other=0.0).to(tl.float32)
    q_scale = tl.maximum(tl.max(tl.abs(q), 1), 1e-12) / 448.0
    q8 = (q / q_scale[:, None]).to(tl.float8e4nv)
    rs = q_scale * qk_scale
    ks_base = ks_ptr + kvh * stride_sr
    vs_base = vs_ptr + kvh * stride_sr
    vmax = tl.load(vmax_ptr + kvh)
    cvs = P_SCALE / vmax
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    # key blocks wholly below the query block's first row need no mask (BN may be wider than BM)
    unmasked_end = (pid_m * BM) // BN * BN
    for start_n in tl.range(0, unmasked_end, BN, warp_specialize=WS):
        acc, l_i, m_i = _blk(acc, l_i, m_i, q8, rs, k_desc, v_desc, ks_base, vs_base, cvs, offs_m, start_n, T, kvh,
                             BN, D, False)
    for start_n in range(unmasked_end, (pid_m + 1) * BM, BN):
        acc, l_i, m_i = _blk(acc, l_i, m_i, q8, rs, k_desc, v_desc, ks_base, vs_base, cvs, offs_m, start_n, T, kvh,
                             BN, D, True)
    out = acc * (vmax / P_SCALE / l_i)[:, None]
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_ot + h * D + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mmask[:, None])


def prompt_attention(q, k, v, k_scale, v_scale, out, block_m=64, block_n=128, num_warps=4, num_stages=3,
                     ws=False):
    """Causal attention of one prompt's queries q [1, T, hq, d] (bf16) over one layer of the E4M3 cache k, v
    [1, hkv, L >= T, d] with scales [1, hkv, L] -> out [1, T, hq, d]."""
    _, T, hq, d = q.shape
    hkv = k.shape[1]
    tp = triton.cdiv(T, 16) * 16
    # V transposed ([head_dim, tokens], rows padded to 16 bytes for TMA): Hopper's FP8 MMA takes B K-major only
    vt = torch.zeros(hkv, d, tp, device=q.device, dtype=v.dtype)
    vt[:, :, :T] = v[0, :, :T].transpose(1, 2)
    vmax = v_scale[0, :, :T].amax(dim=1).clamp_min(1e-30).contiguous()
    k3 = k[0]
    k_desc = TensorDescriptor(k3, [hkv, T, d], [k3.stride(0), k3.stride(1), 1], [1, block_n, d])
    v_desc = TensorDescriptor(vt, [hkv, d, T], [vt.stride(0), vt.stride(1), 1], [1, d, block_n])
    grid = (hq, triton.cdiv(T, block_m), 1)
    _prompt_attn_kernel[grid](q, k_desc, v_desc, k_scale[0], v_scale[0], vmax, out, T, d ** -0.5 * 1.4426950408889634,
                              q.stride(1), out.stride(1), k_scale.stride(1), HQ=hq, G=hq // hkv, D=d, BM=block_m,
                              BN=block_n, WS=bool(ws), num_warps=num_warps, num_stages=num_stages)
    return out


def inputs(T: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(1, T, HQ, D, device="cuda", generator=g).bfloat16()
    k = torch.randn(1, HKV, T, D, device="cuda", generator=g) * 2
    v = torch.randn(1, HKV, T, D, device="cuda", generator=g)
    k8, ks = fp8.quantize_rows(k)
    v8, vs = fp8.quantize_rows(v)
    return q, k8, v8, ks[..., 0].float().contiguous(), vs[..., 0].float().contiguous()


def errors(T: int, configs: list[tuple]) -> dict:
    """Error against float32 attention over the same E4M3 cache: cuDNN's BF16 over the dequantized cache, and the
    E4M3 kernel in each launch configuration (each must compute the same function)."""
    q, k8, v8, ks, vs = inputs(T, seed=1)
    kd, vd = fp8.dequantize(k8, ks[..., None], torch.float32), fp8.dequantize(v8, vs[..., None], torch.float32)
    ref = F.scaled_dot_product_attention(q.float().transpose(1, 2), kd.repeat_interleave(HQ // HKV, 1),
                                         vd.repeat_interleave(HQ // HKV, 1), is_causal=True).transpose(1, 2)

    def err(out):
        diff = (out.float() - ref)
        return {"rms_rel": round((diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item(), 5),
                "worst_row_rel": round((diff.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)).max().item(), 5)}

    res = {"cudnn_bf16": err(causal_attention(q.transpose(1, 2), fp8.dequantize(k8, ks[..., None], torch.bfloat16),
                                               fp8.dequantize(v8, vs[..., None], torch.bfloat16)).transpose(1, 2))}
    for cfg in configs:
        name = "e4m3 " + "x".join(map(str, cfg))
        try:
            res[name] = err(prompt_attention(q, k8, v8, ks, vs, torch.empty_like(q), *cfg))
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit is reported, not fatal
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    return res


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--len", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--configs", default="64x128x4x3x0,64x128x4x2x0,64x64x4x3x0,128x128x8x3x0,128x64x8x3x0,"
                                         "128x128x8x3x1")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/fast/prompt_attn_probe.py needs a CUDA GPU with FP8 tensor cores (Hopper).")
    configs = [tuple(int(x) for x in c.split("x")) for c in a.configs.split(",")]
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "len": a.len}
    res["errors_4096"] = errors(4096, configs)
    for name, e in res["errors_4096"].items():
        print(f"error at 4096 tokens, {name}: RMS {e['rms_rel']:.4f}, worst row {e['worst_row_rel']:.4f}")
    T = a.len
    q, k8, v8, ks, vs = inputs(T)
    flops = 4 * T * T * D * HQ / 2
    kd, vd = fp8.dequantize(k8, ks[..., None], torch.bfloat16), fp8.dequantize(v8, vs[..., None], torch.bfloat16)
    qt = q.transpose(1, 2)
    ms = median_ms(lambda: causal_attention(qt, kd, vd), a.reps)
    res["cudnn_bf16_ms"] = ms
    print(f"cuDNN BF16 over the dequantized cache: {ms:.2f} ms, {flops / ms / 1e9:.0f} TFLOP/s")
    res["e4m3"] = {}
    out = torch.empty_like(q)
    for cfg in configs:
        c = "x".join(map(str, cfg))
        try:
            ms = median_ms(lambda: prompt_attention(q, k8, v8, ks, vs, out, *cfg), a.reps)
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit is reported, not fatal
            print(f"E4M3 {c}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        res["e4m3"][c] = ms
        print(f"E4M3 {c}: {ms:.2f} ms, {flops / ms / 1e9:.0f} TFLOP/s")
    ms = median_ms(lambda: causal_attention(qt, kd, vd), a.reps)
    res["cudnn_bf16_ms_again"] = ms
    print(f"cuDNN BF16 again (how much the same kernel varies within a run): {ms:.2f} ms")
    vt_ms = median_ms(lambda: v8.transpose(2, 3).contiguous(), a.reps)
    res["v_transpose_ms"] = vt_ms
    print(f"of which V's transposed copy: {vt_ms:.3f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
