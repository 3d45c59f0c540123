"""FlashAttention-3's causal prompt attention (core/engines/fast/fa3: BF16, and E4M3 as vLLM's FP8 KV cache runs it on
Hopper) against cuDNN's BF16 attention (what the prompt pass runs without it), one layer, on one Hopper GPU.

    python -m bench.fast.fa3_probe [--lens 8192,32768,125000] [--json $OUT/fa3.json]

Llama-3-8B's attention shape (32 query heads, 8 KV heads, head_dim 128), random q/k/v; K and V read in place from a
cache laid out as the engine's ([rows, kv_heads, max_len, head_dim]). Errors at 4,096 tokens against float32
attention over the same bf16 inputs (RMS of the difference over the reference's, and the worst row's); then each
kernel's time, median of --reps after a warm-up, in TFLOP/s of causal attention. E4M3 is timed with its quantization
of q, k and v (per row and KV head) and without.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
from torch.nn import functional as F

from bench.fast.prompt_attn_probe import median_ms
from core.engines.torch import fp8
from core.engines.fast import fa3
from core.engines.fast.model import causal_attention

HQ, HKV, D = 32, 8, 128


def inputs(T: int, seed: int = 0):
    """q [1, T, HQ, D]; k, v as [1, T, HKV, D] views of a cache [1, HKV, T + 64, D]."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(1, T, HQ, D, device="cuda", generator=g).bfloat16()
    kc = (torch.randn(1, HKV, T + 64, D, device="cuda", generator=g) * 2).bfloat16()
    vc = torch.randn(1, HKV, T + 64, D, device="cuda", generator=g).bfloat16()
    return q, kc[:, :, :T].transpose(1, 2), vc[:, :, :T].transpose(1, 2)


def quantize_per_kv_head(x: torch.Tensor, hkv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [b, T, heads, d] -> (E4M3 x, descale [b, hkv]): one scale per row and KV head (over its query heads and
    every token), the granularity FA3's E4M3 path takes."""
    b, T, h, d = x.shape
    g = x.view(b, T, hkv, h // hkv, d)
    scale = g.abs().amax(dim=(1, 3, 4)).float().clamp(min=1e-12) / fp8.E4M3_MAX
    q8 = (g.float() / scale[:, None, :, None, None]).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX).to(fp8.E4M3)
    return q8.view(b, T, h, d), scale


def attention_e4m3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention in E4M3 as vLLM's FP8 KV cache runs it on Hopper: q, k and v quantized per (row, KV head),
    FA3's E4M3 kernel, bf16 out."""
    hkv = k.shape[2]
    (q8, qs), (k8, ks), (v8, vs) = (quantize_per_kv_head(t, hkv) for t in (q, k, v))
    return fa3.fwd_causal(fa3.DTYPE_E4M3, q8, k8, v8, (qs, ks, vs), torch.empty_like(q))


def cudnn(q, k, v):
    return causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def errors(T: int) -> dict:
    q, k, v = inputs(T, seed=1)
    ref = F.scaled_dot_product_attention(q.float().transpose(1, 2), k.float().transpose(1, 2).repeat_interleave(
        HQ // HKV, 1), v.float().transpose(1, 2).repeat_interleave(HQ // HKV, 1), is_causal=True).transpose(1, 2)

    def err(out):
        diff = out.float() - ref
        return {"rms_rel": round((diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item(), 5),
                "worst_row_rel": round((diff.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)).max().item(), 5)}

    return {"cudnn_bf16": err(cudnn(q, k, v)), "fa3_bf16": err(fa3.causal_attention_bf16(q, k, v)),
            "fa3_e4m3": err(attention_e4m3(q, k, v))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lens", default="8192,32768,125000")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/fast/fa3_probe.py needs a CUDA GPU (Hopper).")
    why = fa3.why_not("cuda", HQ, HKV, D)
    if why:
        sys.exit(f"FlashAttention-3 cannot run here: {why}")
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "errors_4096": errors(4096)}
    for name, e in res["errors_4096"].items():
        print(f"error at 4096 tokens, {name}: RMS {e['rms_rel']:.4f}, worst row {e['worst_row_rel']:.4f}")
    for T in (int(x) for x in a.lens.split(",")):
        q, k, v = inputs(T)
        hkv = k.shape[2]
        (q8, qs), (k8, ks), (v8, vs) = (quantize_per_kv_head(t, hkv) for t in (q, k, v))
        out = torch.empty_like(q)
        flops = 4 * T * T * D * HQ / 2
        row = {}
        for name, fn in (("cuDNN BF16", lambda: cudnn(q, k, v)),
                         ("FA3 BF16", lambda: fa3.causal_attention_bf16(q, k, v)),
                         ("FA3 E4M3, kernel only", lambda: fa3.fwd_causal(fa3.DTYPE_E4M3, q8, k8, v8, (qs, ks, vs), out)),
                         ("FA3 E4M3 with quantization", lambda: attention_e4m3(q, k, v)),
                         ("cuDNN BF16 again", lambda: cudnn(q, k, v))):
            ms = median_ms(fn, a.reps)
            row[name] = ms
            print(f"{T:7d} tokens, {name:27s}: {ms:8.2f} ms {flops / ms / 1e9:6.0f} TFLOP/s")
        res[str(T)] = row
        del q, k, v, q8, k8, v8, out
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
