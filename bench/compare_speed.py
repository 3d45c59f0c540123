"""How long the default precision compare takes (6 built-in prompts, 32 tokens, FP32 against FP8 W8A8), with the FP8
CPU kernel and with FP8Linear's eager path, interleaved in one process.

    .venv/bin/python -m bench.compare_speed [--reps 2] [--candidate fp8] [--threads 2]

Both engines are loaded once (as the console's engine pool keeps them); each repeat runs core.compare.run.compare with
the kernel, then with `fp8_cpu.turned_off()`; the best total of each is kept, with its phases. Also checks that both
runs measured the same thing (same reference tokens; candidate tokens and verdicts printed side by side).
Record results in docs/PERFORMANCE.md with the machine and date.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

from bench.fp8_cpu_bench import cpu_model
from core import fp8_cpu
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
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    ref_side, cand_side = Side(Precision.FP32, KVDtype.AUTO), Side(Precision(args.candidate), KVDtype.AUTO)
    t0 = time.perf_counter()
    ref, cand = cp.load_engine(ref_side), cp.load_engine(cand_side)
    load = time.perf_counter() - t0
    prompts = default_prompts()
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f}; "
          f"both engines loaded in {load:.1f} s")
    cp.compare(ref, cand, prompts[:1], max_new_tokens=2, reference=ref_side, candidate=cand_side)  # warm-up
    best: dict[str, dict] = {}
    results = {}
    for _ in range(args.reps):
        for label, ctx in (("kernel", contextlib.nullcontext), ("eager", fp8_cpu.turned_off)):
            with ctx():
                res = cp.compare(ref, cand, prompts, max_new_tokens=args.max_new_tokens, reference=ref_side,
                                 candidate=cand_side)
            if label not in best or res.timings["total"] < best[label]["total"]:
                best[label] = dict(res.timings)
            results[label] = res
    phases = ["reference_generate", "candidate_generate", "reference_score", "candidate_score", "metrics", "total"]
    print(f"\n{ref_side.label} vs {cand_side.label}, {len(prompts)} prompts x {args.max_new_tokens} tokens, best of "
          f"{args.reps} (load average {os.getloadavg()[0]:.1f}); seconds")
    print("| FP8 path | " + " | ".join(phases) + " |\n|---|" + "---:|" * len(phases))
    for label in ("kernel", "eager"):
        print(f"| {label} | " + " | ".join(f"{best[label][p]:.1f}" for p in phases) + " |")
    print(f"total: kernel / eager = {best['kernel']['total'] / best['eager']['total']:.2f}")
    k, e = results["kernel"], results["eager"]
    print("reference tokens identical:", [p.ref_ids for p in k.prompts] == [p.ref_ids for p in e.prompts])
    print("candidate tokens identical per prompt:",
          [a.cand_ids == b.cand_ids for a, b in zip(k.prompts, e.prompts)])
    for label, r in (("kernel", k), ("eager", e)):
        s = r.summary
        print(f"{label}: {s.verdict}; same top {s.same_top:.3f}, mean KLD {s.mean_kld:.4f}, top-3 {s.top3_match:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
