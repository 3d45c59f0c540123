"""`python -m diagnostics kv`: KV cache size of a model at a length, in vLLM blocks, and what fits on a GPU."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.fmt import GIB, fmt_cache_bytes
from core.long_context import kvcache as kv


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "kv", help="KV cache arithmetic: bytes per token, total at a length, vLLM blocks, what fits on a GPU",
        description="KV cache size from a model config (no weights are loaded): 2 x layers x KV heads x head_dim x "
                    "tokens x bytes per element, sliding-window layers capped at their window.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", choices=list(kv.BUILTIN_CONFIGS), help="a built-in config")
    src.add_argument("--config", type=Path, help="a model's config.json")
    p.add_argument("--tokens", type=int, required=True, help="sequence length in tokens (prompt + output)")
    p.add_argument("--kv-dtype", choices=list(kv.DTYPE_BYTES), default="bf16", help="KV cache dtype (default bf16)")
    p.add_argument("--block-size", type=int, default=kv.DEFAULT_BLOCK_SIZE,
                   help=f"vLLM --block-size in tokens (default {kv.DEFAULT_BLOCK_SIZE})")
    p.add_argument("--gpu-mem-gib", type=float, help="GPU memory in GiB, to say how many tokens fit")
    p.add_argument("--weights-gib", type=float,
                   help="weights in GiB (default: estimated from the config at 2 bytes per parameter)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of GPU memory vLLM may use, as its flag of that name (default 0.9)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.config:
        try:
            config = json.loads(args.config.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise kv.KVConfigError(f"Could not read {args.config} as JSON: {exc}") from exc
        name = str(args.config)
    else:
        config, name = kv.BUILTIN_CONFIGS[args.model], args.model
    shape = kv.shape_from_config(config)
    weights, weights_from = None, None
    if args.gpu_mem_gib is not None:
        if args.weights_gib is not None:
            weights, weights_from = args.weights_gib * GIB, "given"
        else:
            weights = kv.estimate_weight_bytes(config)
            if weights is None:
                raise kv.KVConfigError("Cannot estimate the weights of this config (mixture of experts or missing "
                                       "sizes); pass --weights-gib.")
            weights_from = "estimated from the config at 2 bytes per parameter"
    r = kv.report(shape, args.kv_dtype, args.tokens, args.block_size,
                  None if args.gpu_mem_gib is None else args.gpu_mem_gib * GIB, weights,
                  args.gpu_memory_utilization)
    if args.json:
        print(json.dumps({"model": name, **r.to_dict(), "weights_from": weights_from}, indent=2))
        return 0

    window = (f", {r.sliding_layers} with a {r.sliding_window}-token sliding window" if r.sliding_layers else "")
    print(f"{name}: {r.layers} layers{window}, {r.kv_heads} KV heads x head_dim {r.head_dim}, KV dtype {r.kv_dtype} "
          f"({kv.DTYPE_BYTES[r.kv_dtype]} bytes/element)")
    print(f"  {'per token':<18}{fmt_cache_bytes(r.bytes_per_token)}"
          + (f" (beyond the window: {fmt_cache_bytes(r.bytes_per_token_beyond_window)})" if r.sliding_layers else ""))
    print(f"  {f'at {r.tokens:,} tokens':<18}{fmt_cache_bytes(r.total_bytes)} ({r.total_bytes:,} bytes)")
    print(f"  {'vLLM blocks':<18}{r.blocks:,} of {r.block_size} tokens = ceil({r.tokens} / {r.block_size}); "
          f"whole blocks hold {fmt_cache_bytes(r.allocated_bytes)}")
    if r.budget_bytes is not None:
        print(f"  {'GPU':<18}{args.gpu_mem_gib:g} GiB x {r.gpu_memory_utilization:g} - weights "
              f"{fmt_cache_bytes(r.weights_bytes)} ({weights_from}) = {fmt_cache_bytes(r.budget_bytes)} for the cache")
        if r.budget_bytes <= 0:
            print(f"  {'fits':<18}nothing: the weights alone exceed {args.gpu_memory_utilization:g} of the GPU; use "
                  "FP8 weights, tensor parallelism or a larger GPU")
        elif r.max_tokens is None:
            print(f"  {'fits':<18}any length: every layer slides, so the cache stops growing")
        else:
            print(f"  {'fits':<18}{r.max_tokens:,} tokens of one sequence "
                  f"({'fits' if r.max_tokens >= r.tokens else 'does NOT fit'} at {r.tokens:,}); concurrent "
                  "sequences share this budget; activations and CUDA graphs are not counted")
            if shape.max_positions and r.max_tokens > shape.max_positions:
                print(f"  {'':<18}one sequence stops at the model's {shape.max_positions:,} positions: room for "
                      f"{r.budget_bytes / kv.kv_bytes(shape, r.kv_dtype, shape.max_positions):.1f} such sequences")
    if r.note:
        print(f"  note: {r.note}")
    return 0
