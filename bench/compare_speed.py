"""How long the default precision compare takes (6 built-in prompts, 32 tokens, FP32 against FP8 W8A8), in one
process, with each of the torch engine's CPU paths:

    fast       what the console runs: core/engines/torch/cpu_fast.py (oneDNN-packed linears, matmul decode attention)
               and the FP8 C kernel
    reference  TRIAGE_CPU_FAST=0 (plain nn.Linear, SDPA), FP8 C kernel
    eager      TRIAGE_CPU_FAST=0 and fp8_cpu.turned_off() (FP8Linear's eager path): the console before both

    .venv/bin/python -m bench.compare_speed [--reps 2] [--candidate fp8] [--threads 2] [--paths fast,reference,eager]

Each path's two engines are loaded once (as the console's engine pool keeps them); the repeats interleave the paths
and keep the best total of each, with its phases. Also checks that the paths measured the same thing (reference
tokens per prompt; candidate tokens and verdicts printed side by side).
Record results in docs/perf-log/fp8-cpu.md with the machine and date.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

from bench.fp8_cpu_bench import cpu_model
from core.engines.torch import fp8_cpu
from core.compare import run as cp
from core.compare.prompts import default_prompts
from core.compare.result import Side
from core.precision import KVDtype, Precision


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--candidate", default="fp8")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--paths", default="fast,reference,eager")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    ref_side, cand_side = Side(Precision.FP32, KVDtype.AUTO), Side(Precision(args.candidate), KVDtype.AUTO)
    paths = args.paths.split(",")
    engines = {}
    for label in paths:
        os.environ["TRIAGE_CPU_FAST"] = "1" if label == "fast" else "0"
        t0 = time.perf_counter()
        engines[label] = (cp.load_engine(ref_side), cp.load_engine(cand_side), time.perf_counter() - t0)
    os.environ.pop("TRIAGE_CPU_FAST")
    prompts = default_prompts()
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f}")
    for label, (ref, cand, load) in engines.items():
        print(f"{label}: both engines loaded in {load:.1f} s; reference {ref.ran}; candidate {cand.ran}")
        cp.compare(ref, cand, prompts[:1], max_new_tokens=2, reference=ref_side, candidate=cand_side)  # warm-up
    best: dict[str, dict] = {}
    results = {}
    for _ in range(args.reps):
        for label, (ref, cand, _load) in engines.items():
            with fp8_cpu.turned_off() if label == "eager" else contextlib.nullcontext():
                res = cp.compare(ref, cand, prompts, max_new_tokens=args.max_new_tokens, reference=ref_side,
                                 candidate=cand_side)
            if label not in best or res.timings["total"] < best[label]["total"]:
                best[label] = dict(res.timings)
            results[label] = res
    phases = ["reference_generate", "candidate_generate", "reference_score", "candidate_score", "metrics", "total"]
    print(f"\n{ref_side.label} vs {cand_side.label}, {len(prompts)} prompts x {args.max_new_tokens} tokens, best of "
          f"{args.reps} (load average {os.getloadavg()[0]:.1f}); seconds")
    print("| path | " + " | ".join(phases) + " |\n|---|" + "---:|" * len(phases))
    for label in paths:
        print(f"| {label} | " + " | ".join(f"{best[label][p]:.1f}" for p in phases) + " |")
    first = results[paths[0]]
    for label in paths[1:]:
        other = results[label]
        print(f"{paths[0]} / {label} total = {best[paths[0]]['total'] / best[label]['total']:.2f}; reference tokens "
              f"identical per prompt: {[a.ref_ids == b.ref_ids for a, b in zip(first.prompts, other.prompts)]}; "
              f"candidate: {[a.cand_ids == b.cand_ids for a, b in zip(first.prompts, other.prompts)]}")
    for label, r in results.items():
        s = r.summary
        print(f"{label}: {s.verdict}; same top {s.same_top:.3f}, mean KLD {s.mean_kld:.4f}, top-3 {s.top3_match:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
