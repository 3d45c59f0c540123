"""FP8 on the CPU: decode speed of the C kernel path against the eager path and BF16, interleaved in one process.

    .venv/bin/python -m bench.fp8_cpu_bench [--batches 1,8] [--new-tokens 32] [--reps 3] [--threads 2] [--profile]

Loads the embedded model at BF16, FP8 (W8A8) and FP8 weight-only once each. Every repeat runs, back to back, BF16, then
each FP8 precision through core/fp8_cpu.py's kernel ("kernel") and through FP8Linear's eager path ("eager": what ran
before, `fp8_cpu.turned_off()`), so the shared machine's load hits every row alike; the best of the repeats is kept.
Greedy, no EOS stop, the same prompt for every row of a batch. Also checks that kernel and eager give the same tokens.
--profile prints a torch profiler table (self CPU time by op) of one decode run per FP8 path.
Record results in docs/PERFORMANCE.md ("FP8 on the CPU") with the machine and date.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import time

from core import fp8_cpu
from core.engines.base import GenerationParams
from core.engines.torch_engine import TorchEngine
from core.models import ModelSpec
from core.precision import KVDtype, Precision

PROSE = ("The console measures time to first token, inter-token latency and memory for each precision. " * 40)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def prompt_ids(engine, n: int) -> list[int]:
    ids = engine.encode(PROSE)
    return (ids * (n // len(ids) + 1))[:n]


def decode_run(engine, ids: list[int], batch: int, new_tokens: int):
    params = GenerationParams(max_new_tokens=new_tokens, top_logprobs=0, stop_at_eos=False)
    gens = engine.generate([list(ids) for _ in range(batch)], params)
    g = gens[0]
    span = g.token_times[-1] - g.token_times[0]
    return batch * (len(g.token_times) - 1) / span, [x.token_ids for x in gens]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-tokens", type=int, default=146)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    engines = {p: TorchEngine(ModelSpec("embedded"), p, KVDtype.AUTO, device="cpu")
               for p in (Precision.BF16, Precision.FP8, Precision.FP8_WEIGHT_ONLY)}
    ids = prompt_ids(engines[Precision.BF16], args.prompt_tokens)
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"FP8 kernel: {fp8_cpu.isa() if fp8_cpu.available() else fp8_cpu.why_not()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f}")
    print(f"prompt {args.prompt_tokens} tokens, {args.new_tokens} new, greedy, best of {args.reps} interleaved")
    rows = [("BF16", Precision.BF16, contextlib.nullcontext)]
    for p, name in ((Precision.FP8, "FP8 W8A8"), (Precision.FP8_WEIGHT_ONLY, "FP8 weight-only")):
        rows += [(f"{name} kernel", p, contextlib.nullcontext), (f"{name} eager", p, fp8_cpu.turned_off)]
    for batch in [int(b) for b in args.batches.split(",")]:
        best: dict[str, float] = {}
        tokens: dict[str, list] = {}
        for label, p, ctx in rows:  # warm-up
            with ctx():
                decode_run(engines[p], ids, batch, 2)
        for _ in range(args.reps):
            for label, p, ctx in rows:
                with ctx():
                    tps, toks = decode_run(engines[p], ids, batch, args.new_tokens)
                best[label] = max(best.get(label, 0.0), tps)
                tokens[label] = toks
        print(f"\nbatch {batch} (load average {os.getloadavg()[0]:.1f})")
        print("| path | decode tok/s | x BF16 | x eager |\n|---|---:|---:|---:|")
        for label, _, _ in rows:
            eager = best.get(label.replace("kernel", "eager"))
            vs_eager = f"{best[label] / eager:.2f}" if "kernel" in label else "-"
            print(f"| {label} | {best[label]:.1f} | {best[label] / best['BF16']:.2f} | {vs_eager} |")
        for name in ("FP8 W8A8", "FP8 weight-only"):
            same = tokens[f"{name} kernel"] == tokens[f"{name} eager"]
            print(f"{name}: kernel and eager tokens {'identical' if same else 'DIFFER'}")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for p in (Precision.FP8, Precision.FP8_WEIGHT_ONLY):
            for label, ctx in (("kernel", contextlib.nullcontext), ("eager", fp8_cpu.turned_off)):
                with ctx(), profile(activities=[ProfilerActivity.CPU]) as prof:
                    decode_run(engines[p], ids, 1, 8)
                print(f"\n{p.value} {label}, batch 1, prompt {args.prompt_tokens} + 8 new tokens (prefill included)")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
