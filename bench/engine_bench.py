"""Prefill and decode tokens/s of the torch engine for each precision at batch 1 and 8.

    python -m bench.engine_bench                                  # embedded model, CPU
    python -m bench.engine_bench --model llama-3-8b --precisions bf16,fp8,fp8-wo   # on a GPU host

All precisions are measured in one run so their ratios compare like with like (these machines are noisy).
Prefill tok/s = batch x prompt tokens / TTFT; decode tok/s = batch x (new tokens - 1) / (last token - first token).
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import time


from core.engines.base import GenerationParams
from core.engines.torch.engine import TorchEngine
from core.models import parse_model
from core.precision import KVDtype, parse_precision

PROSE = ("The console measures time to first token, inter-token latency and memory for each precision. " * 200)


def run_one(engine, batch: int, prompt_tokens: int, new_tokens: int) -> dict:
    ids = engine.encode(PROSE)
    ids = (ids * (prompt_tokens // max(len(ids), 1) + 1))[:prompt_tokens]
    params = GenerationParams(max_new_tokens=new_tokens, top_logprobs=0, stop_at_eos=False)
    engine.generate([ids], GenerationParams(max_new_tokens=2, top_logprobs=0, stop_at_eos=False))  # warm-up
    gens = engine.generate([list(ids) for _ in range(batch)], params)
    g = gens[0]
    decode_span = g.token_times[-1] - g.token_times[0]
    return {
        "batch": batch,
        "prefill_tok_s": batch * prompt_tokens / g.ttft_s,
        "decode_tok_s": batch * (len(g.token_times) - 1) / decode_span,
        "ms_per_step": 1000 * decode_span / (len(g.token_times) - 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--precisions", default="fp32,bf16,fp16,fp8,fp8-wo")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--kv-dtype", default="auto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    rows = []
    for name in args.precisions.split(","):
        precision = parse_precision(name)
        t0 = time.perf_counter()
        engine = TorchEngine(parse_model(args.model), precision, KVDtype(args.kv_dtype))
        load_s = time.perf_counter() - t0
        for b in [int(x) for x in args.batches.split(",")]:
            r = run_one(engine, b, args.prompt_tokens, args.new_tokens)
            rows.append({"precision": precision.value, "load_s": load_s, **r})
            print(f"{precision.value:7s} batch {b:3d}: prefill {r['prefill_tok_s']:9.1f} tok/s  "
                  f"decode {r['decode_tok_s']:8.1f} tok/s  ({r['ms_per_step']:.1f} ms/step)", flush=True)
        device = engine.device.name
        engine.unload()
        del engine
        gc.collect()

    print(f"\nmodel={args.model} device={device} host={platform.node()} prompt={args.prompt_tokens} "
          f"new={args.new_tokens} kv={args.kv_dtype} date={time.strftime('%Y-%m-%d')}")
    print("| precision | batch | prefill tok/s | decode tok/s | ms/step |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['batch']} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} | "
              f"{r['ms_per_step']:.1f} |")
    by = {(r["precision"], r["batch"]): r["decode_tok_s"] for r in rows}
    for b in [int(x) for x in args.batches.split(",")]:
        for p in ("fp8", "fp8-wo"):
            if (p, b) in by and ("bf16", b) in by:
                print(f"decode {p}/bf16 at batch {b}: {by[(p, b)] / by[('bf16', b)]:.2f}x")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
