"""TTFT against prompt length, with ITL and the KV cache measured beside the calculator's prediction.

CPU (embedded model, up to 8K tokens):
    .venv/bin/python -m bench.longdoc_bench --lengths 256,512,1024,2048,4096,8192 --record
GPU (synthetic Llama-3-8B shape with random weights, up to 128K tokens, BF16 against FP8 W8A8):
    .venv/bin/python -m bench.longdoc_bench --model llama-3-8b --device cuda \
        --lengths 1024,4096,16384,32768,65536,131072 --precisions bf16,fp8 --record

Prompts are cut at exact lengths from the sample long document (core.long_context.document), repeated where needed. One warm-up
run at the shortest length per precision is not reported. --record writes the table into
docs/perf-log/long-context.md under "## Long context", replacing only this machine's subsection.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from core.fmt import fmt_cache_bytes

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "perf-log" / "long-context.md"
SECTION = "## Long context"


def machine(device) -> str:
    if device.kind == "cuda":
        return f"GPU: {device.name} ({device.total_bytes / 2**30:.0f} GiB), torch engine"
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU: {os.cpu_count()}-core {platform.machine()} ({cpu}), no GPU, torch engine"


def measure(args) -> tuple[str, list[str]]:
    from core.long_context import kvcache
    from core.long_context import document as longdoc
    from core.long_context import runs as longrun
    from core.engines.torch.engine import TorchEngine
    from core.models import parse_model
    from core.precision import KVDtype, parse_precision

    spec = parse_model(args.model)
    lengths = sorted(int(x) for x in args.lengths.split(","))
    kv_dtype = KVDtype(args.kv_dtype)
    rows, label = [], ""
    for name in args.precisions.split(","):
        precision = parse_precision(name)
        t0 = time.perf_counter()
        engine = TorchEngine(spec, precision, kv_dtype, device=args.device)
        print(f"loaded {spec.label} at {precision.label} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        label = machine(engine.device)
        shape = kvcache.shape_from_config(engine.config)
        # the calculator knows 2- and 1-byte caches; an FP32 run has no vLLM counterpart to compare with
        calc_dtype = "fp8" if kv_dtype is KVDtype.FP8 else None if precision.base_dtype == "float32" else "bf16"
        count = (lambda s: longdoc.count_tokens(engine.tokenizer, s))
        filler = longrun.plain_ids(engine, longdoc.sample_document(min(max(lengths), 20000), count))
        longrun.run_once(engine, longrun.exact_prompt(engine, filler, lengths[0]), 2)  # warm-up, not reported
        for n in lengths:
            if engine.max_positions and n + args.new_tokens > engine.max_positions:
                n = engine.max_positions - args.new_tokens  # "128K" means the longest prompt the model takes
                print(f"prompt shortened to {n} tokens to leave room for {args.new_tokens} new", file=sys.stderr)
            ttfts, r = [], None
            for _ in range(args.repeats):
                load = os.getloadavg()[0]
                r = longrun.run_once(engine, longrun.exact_prompt(engine, filler, n), args.new_tokens)
                ttfts.append(r.ttft_s)
            ttfts.sort()
            ttft = ttfts[len(ttfts) // 2]
            p = r.itl_p
            calc = kvcache.kv_bytes(shape, calc_dtype, n + args.new_tokens - 1) if calc_dtype else None
            row = (f"| {precision.label} | {n:,} | {1000 * ttft:,.0f} | {n / ttft:,.0f} | {1000 * p['p50']:,.1f} | "
                   f"{1000 * p['p90']:,.1f} | {r.decode_tok_s:,.1f} | {fmt_cache_bytes(r.kv_bytes)} | "
                   f"{fmt_cache_bytes(calc)} | {fmt_cache_bytes(r.peak_bytes)} | {load:.1f} |")
            rows.append(row)
            print(row, flush=True)
        engine.unload()
        del engine
    return label, rows


HEADER = ("| precision | prompt tokens | TTFT (ms) | prefill tok/s | ITL p50 (ms) | ITL p90 (ms) | decode tok/s | "
          "KV measured | KV calculated (bf16/fp8) | peak memory | load avg (1 min) |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def record(label: str, body: str) -> None:
    """Replace (or add) this machine's subsection inside "## Long context"; the rest of the file is untouched."""
    text = DOC.read_text() if DOC.exists() else "# Performance\n"
    sub = f"### {label}"
    m = re.search(rf"^{re.escape(SECTION)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    if not m:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\nTTFT against prompt length, from `bench/longdoc_bench.py`.\n"
        m = re.search(rf"^{re.escape(SECTION)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    section = m.group(1)
    block = f"{sub}\n\n{body}\n\n"
    s = re.search(rf"^{re.escape(sub)}\n.*?(?=^### |\Z)", section, flags=re.S | re.M)
    section = section[:s.start()] + block + section[s.end():] if s else section.rstrip("\n") + "\n\n" + block
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(text[:m.start(1)] + section + text[m.end(1):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded", help="embedded, llama-3-8b, llama-3-70b, an HF dir or a .gguf")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--lengths", default="256,512,1024,2048,4096,8192", help="comma-separated prompt lengths")
    ap.add_argument("--precisions", default="bf16", help="comma-separated: fp32, bf16, fp16, fp8, fp8-wo")
    ap.add_argument("--kv-dtype", default="auto", choices=["auto", "fp8"])
    ap.add_argument("--new-tokens", type=int, default=8, help="new tokens per run (ITL needs at least 2)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per length; the median TTFT is reported")
    ap.add_argument("--record", action="store_true", help=f"write the table into {DOC.relative_to(ROOT)}")
    ap.add_argument("--note", default="", help="a paragraph recorded under the table (conditions, what to read)")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda but torch sees no CUDA device")
    started = subprocess.run(["date"], capture_output=True, text=True).stdout.strip()
    print(HEADER, flush=True)
    t0 = time.perf_counter()
    label, rows = measure(args)
    cmd = "python -m bench.longdoc_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    body = "\n".join([
        f"Measured {started} (`date`); {time.perf_counter() - t0:.0f} s in all. Command: `{cmd}`. "
        f"Model: {args.model}, KV cache dtype {args.kv_dtype}, {args.new_tokens} new tokens per run, "
        f"median of {args.repeats} run(s) per length.", "", HEADER, *rows, *(["", args.note] if args.note else [])])
    if args.record:
        record(label, body)
        print(f"recorded in {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
