"""The quantization quality table on the embedded model (Gemma 3 270M) and the shipped sample prose: perplexity, KLD
against FP32 (mean, median, p99, p99.9, max), same top token, RMS delta-p, memory and speed for BF16, FP8 (dynamic
per-token scales and static per-tensor scales calibrated on 32, 512 and 4,096 tokens), INT8 W8A8, INT8 weight-only,
INT4 g128 and INT4 AWQ.

    .venv/bin/python -m bench.quality_bench [--window 512] [--stride 256] [--candidates ...] [--json FILE]

Calibration (FP8 static scales, AWQ's search on its first 256 tokens): a 5,000-token sample document built by
core.long_context.document.sample_document (seed 1: the shipped prose shuffled, with code and JSON records), not the
evaluated text itself. Each precision is loaded fresh on the CPU torch engine and unloaded after its pass. Prints a
Markdown table; record it in docs/perf-log/quality.md with the machine and date.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time

from core.fmt import fmt_bytes
from core.long_context.document import count_tokens, embedded_tokenizer_only, sample_document
from core.models import ModelSpec, embedded_model_dir
from core.quality import run as qr
from core.textfile import source_text

CANDIDATES = "bf16,fp8,fp8-static:32,fp8-static:512,fp8-static:4096,int8,int8-wo,int4,int4-awq"


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration, subprocess.SubprocessError):
        return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--stride", type=int, default=256)
    ap.add_argument("--reference", default="fp32")
    ap.add_argument("--candidates", default=CANDIDATES)
    ap.add_argument("--json", help="write the whole result here")
    args = ap.parse_args()

    embedded_model_dir()
    tok = embedded_tokenizer_only().tokenizer
    calibration = sample_document(5000, lambda s: count_tokens(tok, s), seed=1)
    t0 = time.time()
    res = qr.run(ModelSpec("embedded"), source_text(), qr.parse_variant(args.reference),
                 qr.parse_variants(args.candidates), window=args.window, stride=args.stride, device="cpu",
                 calibration=calibration, document_name="shipped sample prose",
                 progress=lambda f, m: print(f"[{100 * f:3.0f}%] {m}", flush=True) if "window 1 " in m or
                 "Loading" in m else None)
    print(f"\n{machine()}, {time.strftime('%Y-%m-%d')}, torch engine on the CPU, {time.time() - t0:.0f} s")
    d = res["document"]
    print(f"{d['name']}: {d['tokens']:,} tokens, windows of {res['window']} (stride {res['stride']}), "
          f"{res['positions']:,} positions; reference {res['reference']} "
          f"({res['reference_cache']['kept']}); calibration {res['calibration']}\n")
    print("| precision | runs as | weights | perplexity | mean KLD | median | p99 | p99.9 | max | same top % (95% CI) "
          "| RMS Δp % | prefill tok/s | decode tok/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in res["rows"]:
        k, s = r.get("kld") or {}, r.get("same_top")

        def g(key, spec=".5f"):
            return "n/a" if key not in k else format(k[key], spec)
        top = "n/a" if not s else f"{100 * s['share']:.2f} ({100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f})"
        rms = "n/a" if r.get("rms_dp") is None else f"{100 * r['rms_dp']:.3f}"
        kernels = [x for x in r.get("kernels") or [] if x not in r["label"]]
        kern = f" [{', '.join(kernels)}]" if kernels else ""
        print(f"| {r['name']} | {r['label']}{kern} | {fmt_bytes(r['weights_bytes'])} | {r['perplexity']:.4f} | "
              f"{g('mean')} | {g('median')} | {g('p99', '.4f')} | {g('p99_9', '.4f')} | {g('max', '.4f')} | {top} | "
              f"{rms} | {r['prefill_tok_s']:,.0f} | {r['decode_tok_s'] or 0:,.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
