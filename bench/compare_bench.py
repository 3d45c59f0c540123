"""Precision compare on the default prompt set: agreement of each precision with a reference, and where the time goes.

    .venv/bin/python -m bench.compare_bench [--max-new-tokens 32] [--candidates bf16,fp16,fp8,fp8-wo,bf16+fp8kv]

Each precision is loaded once. For every candidate the full flow of the page runs (reference and candidate generate,
both score the reference continuation teacher-forced, metrics). It also times teacher-forced scoring two ways on the
reference: core.compare.run's batched scorer (continuation logits only) and TorchEngine.score once per prompt (logits for
every position), to show what batching and skipping the prompt's logits buy. Prints a table; --json writes the numbers.
Record results in docs/perf-log/precision-compare.md with the machine and date.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


from core.compare import run as cp
from core.compare.prompts import default_prompts
from core.compare.result import Side
from core.engines.base import length_groups
from core.precision import KVDtype, Precision


def fmt(v, spec: str) -> str:
    """None (no finite KL: an overflowing candidate, e.g. Gemma 3 at FP16) prints as n/a, not a crash."""
    return "n/a" if v is None else format(v, spec)


def parse_side(text: str) -> Side:
    prec, _, kv = text.partition("+")
    return Side(Precision(prec), KVDtype.FP8 if kv == "fp8kv" else KVDtype.AUTO)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--reference", default="fp32")
    # bf16+fp8kv is how an FP8 KV cache is deployed (BF16 weights); fp32+fp8kv isolates what the KV cache alone costs.
    ap.add_argument("--candidates", default="fp32,bf16,fp16,fp8,fp8-wo,bf16+fp8kv,fp32+fp8kv,bf16:fp16",
                    help="comma-separated; PREC or PREC+fp8kv against --reference, or REF:CAND for another pair "
                         "(the reference itself first = the noise floor; bf16:fp16 is the second floor)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()

    import torch

    prompts = default_prompts()
    ref_side = parse_side(args.reference)
    ref_side = Side(ref_side.precision, ref_side.kv_dtype, args.model)
    engines: dict[Side, object] = {}

    def engine(side: Side):
        if side not in engines:
            t0 = time.perf_counter()
            engines[side] = cp.load_engine(side)
            print(f"loaded {side.label} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        return engines[side]

    ref = engine(ref_side)
    lens = [len(ref.encode(p.text)) for p in prompts]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} with "
          f"{torch.get_num_threads()} threads, {ref.device.name}; load average {os.getloadavg()[0]:.1f}")
    print(f"prompts: {len(prompts)} ({', '.join(f'{p.name} {n}' for p, n in zip(prompts, lens))} tokens), "
          f"{args.max_new_tokens} new tokens, top-k {args.top_k}")

    rows = []
    for text in args.candidates.split(","):
        left, _, right = text.strip().rpartition(":")
        pair_ref = parse_side(left) if left else ref_side
        pair_ref = Side(pair_ref.precision, pair_ref.kv_dtype, args.model)
        cand_side = parse_side(right)
        cand_side = Side(cand_side.precision, cand_side.kv_dtype, args.model)
        ref_e, cand_e = engine(pair_ref), engine(cand_side)
        cpu0 = time.process_time()
        res = cp.compare(ref_e, cand_e, prompts, max_new_tokens=args.max_new_tokens,
                         top_k=args.top_k, reference=pair_ref, candidate=cand_side)
        cpu = time.process_time() - cpu0
        s, t = res.summary, res.timings
        new_tokens = sum(len(p.cand_ids) for p in res.prompts)
        name = cand_side.label if pair_ref == ref_side else f"{cand_side.label} vs {pair_ref.label}"
        same = None if s.same_top is None else 100 * s.same_top
        rows.append({"candidate": name, "same_top_pct": same, "top3_match": s.top3_match,
                     "mean_kld": s.mean_kld, "p99_kld": s.p99_kld, "topk_overlap": s.mean_topk_overlap,
                     "exact_prefix_mean": s.exact_prefix_mean, "vllm_rule": f"{s.vllm_passed}/{s.vllm_total}",
                     "nonfinite_kl": s.nonfinite_kl, "status": s.status, "positions": s.positions,
                     "cand_new_tokens": new_tokens, "cpu_s": cpu, **t})
        print(f"done {name}: {s.verdict} ({t['total']:.1f} s)", file=sys.stderr, flush=True)
        if args.json:  # after every pair: a long run that fails later keeps what it measured
            Path(args.json).write_text(json.dumps({"rows": rows, "prompt_tokens": lens}, indent=1))

    # Scoring: batched with continuation-only logits (what compare does) vs TorchEngine.score per prompt.
    ref_gens = ref.generate([p.text for p in prompts], cp.GenerationParams(max_new_tokens=args.max_new_tokens,
                                                                            top_logprobs=args.top_k))
    items = [(g.prompt_ids, g.token_ids) for g in ref_gens if g.token_ids]
    t0, c0 = time.perf_counter(), time.process_time()
    for group in length_groups([len(p) + len(c) for p, c in items], [len(c) for _, c in items]):
        cp.score_many(ref, [items[i] for i in group], args.top_k)
    batched, batched_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    for p, c in items:
        ref.score(p, c, args.top_k, full=True)
    per_prompt, per_prompt_cpu = time.perf_counter() - t0, time.process_time() - c0

    print()
    print(f"reference {ref_side.label}")
    head = ["candidate", "same top %", "top-3", "mean KLD", "p99 KLD", "non-finite KL", f"top-{args.top_k} ovl",
            "prefix", "vLLM", "ref gen s", "cand gen s", "ref score s", "cand score s", "total s", "CPU s"]
    cells = [head] + [[r["candidate"], fmt(r["same_top_pct"], ".1f"), fmt(r["top3_match"], ".2f"),
                       fmt(r["mean_kld"], ".3g"), fmt(r["p99_kld"], ".3g"), str(r["nonfinite_kl"]),
                       fmt(r["topk_overlap"], ".3f"), fmt(r["exact_prefix_mean"], ".1f"), r["vllm_rule"],
                       fmt(r["reference_generate"], ".1f"), fmt(r["candidate_generate"], ".1f"),
                       fmt(r["reference_score"], ".1f"), fmt(r["candidate_score"], ".1f"), fmt(r["total"], ".1f"),
                       fmt(r["cpu_s"], ".0f")]
                      for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    for c in cells:
        print(" | ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(c, widths))))
    print(f"\nteacher-forced scoring of the reference continuation ({sum(len(c) for _, c in items)} positions, "
          f"{ref_side.label}): batched, continuation logits only {batched:.2f} s wall / {batched_cpu:.1f} s CPU; "
          f"TorchEngine.score per prompt {per_prompt:.2f} s wall / {per_prompt_cpu:.1f} s CPU "
          f"({per_prompt / batched:.1f}x wall)")
    print(f"load average at the end {os.getloadavg()[0]:.1f}; wall times are noisy on a shared machine, CPU "
          "seconds (this process, all threads) less so")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "score_batched_s": batched,
                                               "score_per_prompt_s": per_prompt,
                                               "score_batched_cpu_s": batched_cpu,
                                               "score_per_prompt_cpu_s": per_prompt_cpu, "prompt_tokens": lens}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
