"""How fast could the batch-1 decode step get if some of its small kernels cost nothing? A bound, not a speed-up.

    python -m bench.fast.decode_bound_probe  # on one CUDA GPU (Hopper: the step runs with programmatic dependent
                                             # launch)

The step is captured with some kernels simply not launched (their outputs are left stale, so the logits mean
nothing): the attention's combine, RoPE + the K/V write, W8A8's silu_mul, the whole attention, log_softmax. Each
variant's step time against the full step's says the most that folding those kernels into their neighbours could
save, before building any fold. Llama-3-8B shape, random weights, the shipped H200 tuning table, prompt 512; the
variants interleaved three times, median.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack
from unittest import mock

import torch

from bench.fast.fp8_speed import time_decode
from core.engines.fast import kernels as K
from core.engines.fast.kernels import attention
from core.engines.fast.model import Dims, FastLlama
from core.engines.fast.methods import tuning
from core.engines.fast.tuned_table import read_tuned_table
from core.models import synthetic_config


def _nothing(*a, **k):
    return None


# variant -> {(module, attribute): replacement}
VARIANTS = {
    "full step": {},
    "no combine": {(attention, "combine_splits"): _nothing},
    "no rope/kv write": {(K, "rope_store"): _nothing},
    "no silu_mul": {(K, "silu_mul"): _nothing},
    "no attention": {(K, "decode_attention"): _nothing},
    "no combine, rope, silu_mul": {(attention, "combine_splits"): _nothing, (K, "rope_store"): _nothing,
                                   (K, "silu_mul"): _nothing},
    "no log_softmax": {(torch, "log_softmax"): lambda x, dim: x},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", default="bf16,fp8")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--tuned", default="core/engines/fast/tuned_linears.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/fast/decode_bound_probe.py needs a CUDA GPU.")
    tuning.TUNED.update(read_tuned_table(args.tuned, torch.cuda.get_device_name(),
                                         torch.cuda.get_device_capability()))
    config = synthetic_config("llama-3-8b")
    dims = Dims.from_config(config)
    master = FastLlama.random_weights(dims, "cuda", seed=0)
    models = {p: FastLlama(dims, master, p, rotary=config) for p in args.precisions.split(",")}
    cache = next(iter(models.values())).new_cache(1, args.prompt + args.steps + 16, False)
    ids = torch.randint(0, dims.vocab, (1, args.prompt), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))
    times = {(p, v): [] for p in models for v in VARIANTS}
    for rep in range(3):
        for p, m in models.items():
            m.prefill(ids, cache, rows=slice(0, 1))
            for v, patches in VARIANTS.items():
                with ExitStack() as stack:
                    for (mod, name), new in patches.items():
                        stack.enter_context(mock.patch.object(mod, name, new))
                    times[(p, v)].append(time_decode(m, cache, 1, args.prompt, args.steps)["ms_per_step"])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch 1, prompt {args.prompt}, "
          f"median of 3 (ms a step)")
    for v in VARIANTS:
        cells = []
        for p in models:
            ms, full = statistics.median(times[(p, v)]), statistics.median(times[(p, "full step")])
            cells.append(f"{p} {ms:6.3f} ({ms - full:+.3f})")
        print(f"  {v:28s} " + "   ".join(cells))
    if "bf16" in models:
        bf = statistics.median(times[("bf16", "full step")])
        for p in models:
            if p != "bf16":
                print(f"  {p} x BF16: full {bf / statistics.median(times[(p, 'full step')]):.3f}, with the three "
                      f"gone {bf / statistics.median(times[(p, 'no combine, rope, silu_mul')]):.3f} (BF16 full)")


if __name__ == "__main__":
    main()
