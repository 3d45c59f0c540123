"""The CPU's C kernels: prefill and decode speed with the kernel against the torch path and BF16, interleaved in one
process.

    .venv/bin/python -m bench.fp8_cpu_bench [--family fp8|int] [--batches 1,8] [--new-tokens 32] [--reps 3]
                                            [--threads 2] [--profile]

--family fp8 (default): the embedded model at BF16, FP8 (W8A8) and FP8 weight-only, each FP8 precision through
core/engines/torch/fp8_cpu.py's kernel ("kernel") and through FP8Linear's eager path ("eager", `fp8_cpu.turned_off()`).
--family int: BF16, INT4, INT4 AWQ and INT8 weight-only, through core/engines/torch/int_cpu.py ("kernel") and the torch ops that
dequantized their weights before ("eager", `int_cpu.turned_off()`).
Every repeat runs all rows back to back, so the shared machine's load hits every row alike; the best of the repeats is
kept. Greedy, no EOS stop, the same prompt for every row of a batch. Also says whether kernel and eager gave the same
tokens. --profile prints a torch profiler table (self CPU time by op) of one decode run per path.
Record results in docs/perf-log/fp8-cpu.md ("FP8 on the CPU", "INT4 and INT8 weight-only on the CPU") with machine
and date.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import time

from core.engines.torch import fp8_cpu, int_cpu
from core.engines.base import GenerationParams
from core.engines.torch.engine import TorchEngine
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
    """(decode tok/s, prefill tok/s, the tokens)."""
    params = GenerationParams(max_new_tokens=new_tokens, top_logprobs=0, stop_at_eos=False)
    gens = engine.generate([list(ids) for _ in range(batch)], params)
    g = gens[0]
    span = g.token_times[-1] - g.token_times[0]
    return batch * (len(g.token_times) - 1) / span, batch * len(ids) / g.ttft_s, [x.token_ids for x in gens]


FAMILIES = {  # name -> (the kernel module, [(row name, precision)])
    "fp8": (fp8_cpu, [("FP8 W8A8", Precision.FP8), ("FP8 weight-only", Precision.FP8_WEIGHT_ONLY)]),
    "int": (int_cpu, [("INT4", Precision.INT4), ("INT4 AWQ", Precision.INT4_AWQ),
                      ("INT8 weight-only", Precision.INT8_WEIGHT_ONLY)]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="fp8")
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
    kernel, family = FAMILIES[args.family]
    engines = {p: TorchEngine(ModelSpec("embedded"), p, KVDtype.AUTO, device="cpu")
               for p in [Precision.BF16] + [p for _, p in family]}
    ids = prompt_ids(engines[Precision.BF16], args.prompt_tokens)
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"FP8 kernel: {fp8_cpu.isa() if fp8_cpu.available() else fp8_cpu.why_not()}, "
          f"INT kernel: {'built' if int_cpu.available() else int_cpu.why_not()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f}")
    print(f"prompt {args.prompt_tokens} tokens, {args.new_tokens} new, greedy, best of {args.reps} interleaved")
    rows = [("BF16", Precision.BF16, contextlib.nullcontext)]
    for name, p in family:
        rows += [(f"{name} kernel", p, contextlib.nullcontext), (f"{name} eager", p, kernel.turned_off)]
    for batch in [int(b) for b in args.batches.split(",")]:
        best: dict[str, float] = {}
        best_prefill: dict[str, float] = {}
        tokens: dict[str, list] = {}
        for label, p, ctx in rows:  # warm-up
            with ctx():
                decode_run(engines[p], ids, batch, 2)
        for _ in range(args.reps):
            for label, p, ctx in rows:
                with ctx():
                    tps, prefill, toks = decode_run(engines[p], ids, batch, args.new_tokens)
                best[label] = max(best.get(label, 0.0), tps)
                best_prefill[label] = max(best_prefill.get(label, 0.0), prefill)
                tokens[label] = toks
        print(f"\nbatch {batch} (load average {os.getloadavg()[0]:.1f})")
        print("| path | prefill tok/s | x eager | decode tok/s | x BF16 | x eager |\n|---|---:|---:|---:|---:|---:|")
        for label, _, _ in rows:
            eager = label.replace("kernel", "eager")
            vs = [f"{d[label] / d[eager]:.2f}" if "kernel" in label else "-" for d in (best_prefill, best)]
            print(f"| {label} | {best_prefill[label]:.1f} | {vs[0]} | {best[label]:.1f} | "
                  f"{best[label] / best['BF16']:.2f} | {vs[1]} |")
        for name, _ in family:
            same = tokens[f"{name} kernel"] == tokens[f"{name} eager"]
            print(f"{name}: kernel and eager tokens {'identical' if same else 'DIFFER'}")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for _, p in family:
            for label, ctx in (("kernel", contextlib.nullcontext), ("eager", kernel.turned_off)):
                with ctx(), profile(activities=[ProfilerActivity.CPU]) as prof:
                    decode_run(engines[p], ids, 1, 8)
                print(f"\n{p.value} {label}, batch 1, prompt {args.prompt_tokens} + 8 new tokens (prefill included)")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
