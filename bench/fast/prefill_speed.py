"""Prefill (time to first token) of the fast path per precision, and which attention kernel SDPA runs, on one GPU.

    python -m bench.fast.prefill_speed                     # Llama-3-8B shape, random weights, 8K / 32K / 125K tokens
    python -m bench.fast.prefill_speed --prompts 8192 --json $OUT/prefill.json
    python -m bench.fast.prefill_speed --skip-torch-ops --json core/data/prefill_h200.json  # what the pages show

For BF16 and FP8 W8A8, each through the fused kernels (`FastLlama.prefill(fused=True)`, what the engine runs; W8A8 with
its FP8 GEMMs' partial sums promoted to float32 and with fast accumulation, the default), where FlashAttention-3 is
built (core/engines/fast/fa3) also with the attention through SDPA (cuDNN) instead, and through the plain torch-op
pass (`fused=False`, what ran before; --skip-torch-ops leaves it out): one prompt of each length into a fresh cache,
timed from the first kernel to the logits with a device synchronize, best of --reps after one warm-up at 1K tokens.
At 2,048 tokens, how far fast accumulation moves W8A8's logits from promotion and from BF16.
Then, at --attn-len tokens, one layer's causal attention timed under each SDPA backend torch offers on this GPU, and
FlashAttention-3's, so the share of attention in the prefill is measured rather than assumed. Weights are random
(N(0, 0.02)): speed only.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.nn import functional as F

from core.engines.fast import fa3
from core.engines.fast.model import Dims, FastLlama
from core.engines.fast.options import overridden
from core.models import synthetic_config


def timed(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def accumulation(fast: bool):
    """W8A8 prompt passes inside run with FP8 fast accumulation or with promotion (the model reads the switch at
    each pass)."""
    return overridden(fp8_fast_accum=fast)


def prefill_s(model: FastLlama, prompt: int, reps: int, fused: bool, fast_accum: bool = False,
              flash3: bool = True) -> float:
    """flash3=False: the prompt's attention through SDPA (cuDNN) even where FlashAttention-3 is built."""
    ids = torch.randint(0, model.dims.vocab, (1, prompt), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(prompt))
    cache = model.new_cache(1, prompt + 8, False)
    with overridden(fp8_fast_accum=fast_accum, fa3=flash3):
        return timed(lambda: model.prefill(ids, cache, rows=slice(0, 1), fused=fused), reps)


def accum_difference(models: dict[str, FastLlama], prompt: int) -> dict[str, dict[str, float]]:
    """The W8A8 prompt pass's logits at every position with fast and with float32-promoted accumulation, against
    each other and against BF16: relative difference, mean KL, top-1 agreement (random weights: a measure of
    difference, not of quality)."""
    ids = torch.randint(0, models["bf16"].dims.vocab, (1, prompt), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))

    def logprobs(model: FastLlama, fast: bool) -> torch.Tensor:
        with accumulation(fast):
            lp = model.prefill(ids, model.new_cache(1, prompt + 8, False), rows=slice(0, 1), all_logits=True).float()
        return torch.log_softmax(lp.reshape(-1, lp.shape[-1]), dim=-1)

    def diff(ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
        return {"rel_diff": ((got - ref).norm() / ref.norm()).item(),
                "kl_mean": (ref.exp() * (ref - got)).sum(-1).mean().item(),
                "top1": (ref.argmax(-1) == got.argmax(-1)).float().mean().item()}

    bf16, promoted, fast = logprobs(models["bf16"], False), logprobs(models["fp8"], False), logprobs(models["fp8"], True)
    return {"fast_vs_promoted": diff(promoted, fast), "promoted_vs_bf16": diff(bf16, promoted),
            "fast_vs_bf16": diff(bf16, fast)}


def attention_backends(dims: Dims, length: int, reps: int) -> dict[str, float | str]:
    """One layer's causal attention over `length` tokens (K/V expanded to the query heads, as the prefill does)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, dims.heads, length, dims.head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    out: dict[str, float | str] = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                out[backend.name] = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps)
        except RuntimeError as exc:
            out[backend.name] = f"unavailable: {str(exc).splitlines()[0][:120]}"
    out["default"] = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps)
    if fa3.why_not("cuda", dims.heads, dims.kv_heads, dims.head_dim) is None:
        # the engine's grouped K/V (FA3 reads the query heads' shared KV head itself; the backends above get K/V
        # repeated to the query heads, the same FLOPs)
        qt, kt, vt = q.transpose(1, 2), k[:, :dims.kv_heads].transpose(1, 2), v[:, :dims.kv_heads].transpose(1, 2)
        out["FLASH_ATTENTION_3"] = timed(lambda: fa3.causal_attention_bf16(qt, kt, vt), reps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--prompts", default="8192,32768,125000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--attn-len", type=int, default=32768)
    ap.add_argument("--skip-torch-ops", action="store_true", help="time only the fused prompt passes")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/fast/prefill_speed.py needs a CUDA GPU.")
    props = torch.cuda.get_device_properties(0)
    config = synthetic_config(args.model)
    dims = Dims.from_config(config)
    master = FastLlama.random_weights(dims, "cuda", seed=0)
    models = {mode: FastLlama(dims, master, mode, rotary=config) for mode in ("bf16", "fp8")}
    fa3_why = fa3.why_not("cuda", dims.heads, dims.kv_heads, dims.head_dim)
    print(f"FlashAttention-3: {'built, in use' if fa3_why is None else fa3_why}", flush=True)
    # (name, mode, fused, FP8 fast accumulation, FlashAttention-3 where built); "bf16" and "fp8 fast accum" are what
    # the engine runs
    paths = [("bf16", "bf16", True, False, True), ("fp8", "fp8", True, False, True),
             ("fp8 fast accum", "fp8", True, True, True)]
    if fa3_why is None:
        paths += [("bf16 cudnn", "bf16", True, False, False), ("fp8 fast accum cudnn", "fp8", True, True, False)]
    if not args.skip_torch_ops:
        paths += [("bf16 torch ops", "bf16", False, False, True), ("fp8 torch ops", "fp8", False, False, True)]
    for _, mode, fused, fast, flash3 in paths:  # warm-up: kernels compiled and autotuned before any timing
        prefill_s(models[mode], 1024, 1, fused, fast, flash3)
    rows = []
    for prompt in (int(p) for p in args.prompts.split(",")):
        reps = args.reps if prompt <= 32768 else max(1, args.reps - 1)
        t = {name: prefill_s(models[mode], prompt, reps, fused, fast, flash3)
             for name, mode, fused, fast, flash3 in paths}
        row = {"prompt": prompt, **{f"{k.replace(' ', '_')}_s": v for k, v in t.items()},
               "fp8_speedup": t["bf16"] / t["fp8"], "fp8_fast_accum_speedup": t["bf16"] / t["fp8 fast accum"]}
        line = (f"prompt {prompt:>7,}: fused BF16 {t['bf16']:.3f} s, FP8 {t['fp8']:.3f} s ({row['fp8_speedup']:.2f}x), "
                f"FP8 fast accumulation {t['fp8 fast accum']:.3f} s ({row['fp8_fast_accum_speedup']:.2f}x)")
        if "bf16 cudnn" in t:
            row["fp8_fast_accum_speedup_cudnn"] = t["bf16 cudnn"] / t["fp8 fast accum cudnn"]
            line += (f" | attention through cuDNN: BF16 {t['bf16 cudnn']:.3f} s, FP8 fast accumulation "
                     f"{t['fp8 fast accum cudnn']:.3f} s ({row['fp8_fast_accum_speedup_cudnn']:.2f}x)")
        if "bf16 torch ops" in t:
            row["fp8_speedup_torch_ops"] = t["bf16 torch ops"] / t["fp8 torch ops"]
            line += (f" | torch ops BF16 {t['bf16 torch ops']:.3f} s, FP8 {t['fp8 torch ops']:.3f} s "
                     f"({row['fp8_speedup_torch_ops']:.2f}x)")
        rows.append(row)
        print(line, flush=True)
        torch.cuda.empty_cache()
    accum = accum_difference(models, 2048)
    print("W8A8 prompt pass at 2,048 tokens, fast and promoted accumulation: " + "; ".join(
        f"{name}: " + ", ".join(f"{k} {v:.3g}" for k, v in d.items()) for name, d in accum.items()))
    attn = attention_backends(dims, args.attn_len, args.reps)
    print(f"one layer's causal attention at {args.attn_len:,} tokens: " + ", ".join(
        f"{k} {v * 1000:.1f} ms" if isinstance(v, float) else f"{k} {v}" for k, v in attn.items()))
    result = {"device": props.name, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "prompt_attention": "FlashAttention-3 (BF16)" if fa3_why is None else "SDPA (cuDNN where it runs)",
              "model": f"{args.model} shape, random weights", "prefill": rows, "fp8_fast_vs_promoted_accum": accum,
              "attention_one_layer_s": attn, "attention_len": args.attn_len}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
